"""`import precision` starts no JAX backend, whatever names it resolves.

Each check runs in a fresh interpreter (this one has started a backend already).
A backend starts on the first computation; a module that made an array at import
would start one for every user, before the user could choose the platform. The
interpreter here names a platform that does not exist, so any start fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_resolving_every_public_name_starts_no_backend():
    code = """
        import precision
        for name in precision.__all__:
            getattr(precision, name)
        import precision.optax, precision.testing
        t = precision.Tensor
        print("resolved", len(precision.__all__))
    """
    env = dict(os.environ, JAX_PLATFORMS="no_such_platform")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("resolved")
