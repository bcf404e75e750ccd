"""The default reduced-precision format and the context manager that changes it."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import dtypes

from ._errors import FormatError

__all__ = ["default_format", "get_default_format", "resolve_format"]

_DEFAULT: contextvars.ContextVar[dtypes.Format] = contextvars.ContextVar(
    "precision_default_format", default=dtypes.bfloat16
)


def resolve_format(fmt: str | dtypes.Format) -> dtypes.Format:
    """A `dtypes.Format` from a format object or any registered name or alias.

    Raises:
        FormatError: the name is not registered, or `fmt` is neither a name
            nor a format (the message lists the known names).
    """
    if isinstance(fmt, dtypes.Format):
        return fmt
    if isinstance(fmt, str):
        try:
            return dtypes.get(fmt)
        except ValueError as err:
            raise FormatError(str(err)) from None
    raise FormatError(
        f"expected a format name such as 'bfloat16' or a dtypes.Format, got "
        f"{type(fmt).__name__} {fmt!r}; known names: {', '.join(dtypes.FORMATS)}"
    )


def get_default_format() -> dtypes.Format:
    """The format `to_reduced_precision()` uses when none is given.

    Examples:
        >>> import precision
        >>> precision.get_default_format().name
        'bfloat16'
    """
    return _DEFAULT.get()


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
    resolved = resolve_format(fmt)
    token = _DEFAULT.set(resolved)
    try:
        yield resolved
    finally:
        _DEFAULT.reset(token)
