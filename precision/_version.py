"""`precision.__version__`: the installed distribution's version, read from its metadata."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("precision")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"
