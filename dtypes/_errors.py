"""The errors `dtypes` raises on purpose: one base, each also a builtin.

Every class derives from `PrecisionError` and from the builtin that code
already catches (`ValueError` for a bad value or name, `TypeError` for a value
of the wrong kind), so `except ValueError:` keeps working. `precision`
re-exports the same classes and defines the rest of the hierarchy in
`precision/_errors.py` (every `TypeError` there a `PrecisionTypeError` too), so
one `except dtypes.PrecisionError:` (or `precision.PrecisionError`) catches
everything both packages raise on purpose. Each class says why it exists: the
argument a caller changes to fix it.
"""

from __future__ import annotations

__all__ = [
    "FormatError",
    "FormatTypeError",
    "NonFiniteError",
    "PrecisionError",
    "PrecisionTypeError",
    "RoundingError",
    "ScalingError",
    "ShapeError",
]


class PrecisionError(Exception):
    """Base class of every error `dtypes` and `precision` raise on purpose.

    The message says what was given, the rule it breaks and the Python call
    that fixes it. Where another front end reports the same refusal in its
    own spelling (the command line's `--scaling per-block:32:pow2`), the
    error also carries the rule alone as a field, so that front end says it
    and adds its own fix instead of rewriting the message.

    Attributes:
        rule: the rule that was broken, in words that spell neither a Python
            call nor a command-line flag (`"E8M0 holds only powers of two"`);
            `""` where the message is all there is.

    Examples:
        >>> import dtypes
        >>> try:
        ...     dtypes.get("bfloat17")
        ... except dtypes.PrecisionError as e:
        ...     print(type(e).__name__, isinstance(e, ValueError))
        FormatError True
    """

    def __init__(self, *args: object, rule: str = "") -> None:
        super().__init__(*args)
        self.rule = rule


class FormatError(PrecisionError, ValueError):
    """A format name that is not known, or a layout or format that cannot be used.

    Raised by `dtypes.get` for an unknown name (the message lists the known
    ones), by `FloatFormat`/`IntFormat` for an unsupported layout, and when an
    encoding is decoded as another format.
    """


class PrecisionTypeError(PrecisionError, TypeError):
    """A value of the wrong kind: complex, string or object arrays, a scaling
    that is not a `Scaling`, a format that is neither a name nor a `Format`.

    Every `TypeError` either package raises on purpose is one (the classes of
    `precision` that are `TypeError`s derive from it), so one `except` catches
    them all."""


class FormatTypeError(FormatError, PrecisionTypeError):
    """A format argument that is neither a name nor a `Format` (`dtypes.get(3)`).

    Both a `FormatError`, as every bad format argument is, and a
    `PrecisionTypeError` (a `TypeError`), as every value of the wrong kind is,
    so either `except` catches it.
    """


class RoundingError(PrecisionError, ValueError):
    """An unknown rounding mode, or `rounding="stochastic"` without a key: the
    `rounding=` (or `key=`) argument is the one to change."""


class ScalingError(PrecisionError, ValueError):
    """A scaling built with bad parameters, or one that does not fit a shape or a
    format: the `scaling=` argument is the one to change."""


class ShapeError(PrecisionError, ValueError):
    """A shape that is not a tuple of non-negative integers, or operands whose shapes
    do not fit together: the data's shape, not a format, is what to change."""


class NonFiniteError(PrecisionError, ValueError):
    """NaN or ±inf given eagerly where it cannot be stored.

    A scaled encoding would compute its group's scale over them; a float
    format without a NaN code has nowhere to put NaN. The message says how
    many values and where the first is.
    """
