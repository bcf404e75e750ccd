"""The default reduced-precision format and the context manager that changes it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Literal, TypeAlias

import dtypes

__all__ = ["FormatLike", "default_format", "get_default_format", "resolve_format"]

FormatLike: TypeAlias = (
    Literal[
        "float64",
        "float32",
        "bfloat16",
        "float16",
        "tf32",
        "float8_e4m3fn",
        "float8_e5m2",
        "int8",
        "int4",
        "int2",
        "int1",
    ]
    | str
    | dtypes.Format
)
"""A format, as every `compute=`, `fmt=` and format argument takes it.

A `dtypes.Format` object, or a name that `dtypes.get` reads: the names of
`dtypes.FORMATS` (spelled out above, for editors), their aliases (`"bf16"`,
`"fp16"`, `"e4m3"`, …, `dtypes.ALIASES`), the named encodings (`"mxfp4"`,
`"nvfp4"`, `"nf4"`, …, `dtypes.ENCODINGS`) and any layout's own name
(`"float6_e3m2fn"`). An unknown name raises `FormatError`. `compute=` takes
only unscaled float formats (bfloat16, float16, tf32, fp8, float32).
"""

# The default format lives in a JAX user context, so that it is part of `jax.jit`'s
# cache key: a function traced under one default is traced again under another (a
# plain variable would be read once, at the first trace, and kept by the cache).
# It is made at the first `default_format(...)`, so importing changes nothing in JAX.
_CONTEXT: Any = None
_MAKING = threading.Lock()


def _context() -> Any:
    global _CONTEXT
    with _MAKING:
        if _CONTEXT is None:
            import jax

            _CONTEXT = jax.make_user_context(default_value=None)
    return _CONTEXT


# Every format argument of `precision` is resolved by `dtypes.get`, the one resolver,
# so a bad one is refused with the same error and message wherever it is given.
# `resolve_format` is that same function under the name `_apply` and `_calibrate`
# still import; new code calls `dtypes.get`.
resolve_format = dtypes.get


def get_default_format() -> dtypes.Format:
    """The format `to_reduced_precision()` uses when none is given.

    Examples:
        >>> import precision
        >>> precision.get_default_format().name
        'bfloat16'
    """
    fmt = None if _CONTEXT is None else _CONTEXT.value
    return dtypes.bfloat16 if fmt is None else fmt


@contextlib.contextmanager
def default_format(fmt: str | dtypes.Format) -> Iterator[dtypes.Format]:
    """Change the default reduced format inside a `with` block.

    Args:
        fmt: a format name (`"float16"`, `"e4m3"`, ...) or a `dtypes.Format`.

    Yields:
        The resolved format.

    Examples:
        >>> import precision
        >>> t = precision.Tensor([1.0, 2.0])
        >>> with precision.default_format("float16"):
        ...     t.to_reduced_precision().format.name
        'float16'
        >>> t.to_reduced_precision().format.name
        'bfloat16'
    """
    resolved = dtypes.get(fmt)
    with _context()(resolved):
        yield resolved
