"""Which of JAX's implicit conversions of a Tensor are explicit requests.

JAX turns any object with `__jax_array__` into an array wherever an array is
accepted: `jnp.sin(t)`, `jnp.ones(4) + t`, `jnp.dot(x, t)`, Flax's
`promote_dtype` inside `model.apply`. Each would compute on the float32
values and drop the format without a word, so a Tensor allows only the
conversion a user writes: `jnp.asarray(t)` / `jnp.array(t)` called from code
that is not an installed library (docs/design.md §4, "Guarded entry points").
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from types import FrameType

__all__ = ["implicit_caller"]

# The jax module that holds `jnp.array` and `jnp.asarray`.
_CONSTRUCTORS = "jax._src.numpy.array_constructors"


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """Directories whose code is an installed library, not the user's."""
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[k]) for k in ("purelib", "platlib") if k in paths}
    return tuple(sorted(r + os.sep for r in roots))


def _in_library(frame: FrameType) -> bool:
    name = str(frame.f_globals.get("__name__", ""))
    if name.split(".")[0] in ("jax", "jaxlib", "precision", "dtypes"):
        return True  # also this project, installed or not: its code never relies on it
    path = os.path.realpath(frame.f_code.co_filename)
    return path.startswith(_library_roots())


def implicit_caller(depth: int = 2) -> str | None:
    """None when the Tensor's `__jax_array__` (the frame `depth` up) was reached
    through `jnp.asarray` / `jnp.array` written in the user's own code; else the
    name of the JAX function or the library code that asked for the array."""
    frame: FrameType | None = sys._getframe(depth)
    if frame is None or frame.f_globals.get("__name__") != _CONSTRUCTORS:
        return _describe(frame)
    while frame is not None and frame.f_globals.get("__name__") == _CONSTRUCTORS:
        frame = frame.f_back
    if frame is None or not _in_library(frame):
        return None
    return _describe(frame)


def _describe(frame: FrameType | None) -> str:
    """The first frame outside jax's private helpers, as `module.function`."""
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        code = frame.f_code.co_name
        if not (name.startswith("jax._src.numpy.util") or code.startswith("<")):
            if name.startswith("jax._src.numpy.array_methods"):
                return "an operator of a JAX array (`x + t`, `x @ t`, ...)"
            if name.startswith("jax._src.numpy"):
                return f"`jnp.{code}`"
            if name.startswith(("jax", "jaxlib")):
                return f"JAX's `{code}`"
            return f"`{name}.{code}`"
        frame = frame.f_back
    return "a JAX function"
