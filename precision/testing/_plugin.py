"""pytest plugin entry point of `precision.testing` (fixtures and markers)."""
