"""Tensor's operators and methods as slots, filled in by `_applied_operators`.

Each operator of `Tensor` (`+`, `@`, `<`, `t.sum()`, indexing, ...) is a slot
that calls the implementation registered under its name in `IMPLEMENTATIONS`.
The implementations are `apply`-wrapped jnp functions; `apply` itself handles
Tensors, so they cannot be built where `Tensor` is defined without an import
cycle. `_applied_operators` builds and registers them; the package loads it before it
hands out any name that computes (see `precision/__init__.py`).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from dtypes import PrecisionTypeError, ShapeError

from ._errors import PrecisionError

__all__ = [
    "IMPLEMENTATIONS",
    "binary",
    "check_axes",
    "method",
    "reduction",
    "reflected",
    "refusal",
    "unary",
]

IMPLEMENTATIONS: dict[str, Callable[..., Any]] = {}
"""Operator name (`"add"`, reflected `"r:add"`, `"sum"`, ...) -> its applied function."""


def _run(name: str, *args: Any, **kwargs: Any) -> Any:
    """The implementation of `name` on `args`; JAX's refusal of the operands (shapes that
    do not broadcast, a dtype the operation does not take, an int past int32) becomes
    the `PrecisionError` subclass the rest of the library raises, naming the operands."""
    try:
        return _implementation(name)(*args, **kwargs)
    except PrecisionError:
        raise
    except (TypeError, ValueError, OverflowError) as err:
        raise refusal(f"Tensor `{name}`", args, err) from err


def refusal(what: str, args: tuple[Any, ...], err: BaseException) -> PrecisionError:
    """JAX's error `err` for `what` on `args`, as a `ShapeError` (shapes) or a
    `PrecisionTypeError` (anything else), its first line kept."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    operands = ", ".join(_described(a) for a in args)
    cls = ShapeError if "shape" in first.lower() else PrecisionTypeError
    return cls(f"{what} cannot take {operands}: {first}")


def _described(x: Any) -> str:
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    fmt = getattr(x, "format", None)
    name = getattr(fmt, "name", fmt) if fmt is not None else dtype
    article = "an" if str(name)[:1] in "aeiou" else "a"
    if shape is not None and fmt is not None:
        return f"{article} {name} Tensor of shape {tuple(shape)}"
    if shape is not None and dtype is not None:
        return f"{article} {name} array of shape {tuple(shape)}"
    return f"{type(x).__name__} {x!r:.40}"


def _implementation(name: str) -> Callable[..., Any]:
    fn = IMPLEMENTATIONS.get(name)
    if fn is None:
        raise PrecisionError(
            f"Tensor operator {name!r} is not attached: the operators are attached when "
            "precision's public names are first used; import the library through them "
            "(`import precision; precision.Tensor(...)`), not through its private modules"
        )
    return fn


def _check_operand(name: str, other: Any) -> None:
    """Refuse an operand no array function takes (a string, None, a list, a dict)."""
    if isinstance(other, numbers.Number) or hasattr(other, "__jax_array__"):
        return
    if hasattr(other, "shape") and hasattr(other, "dtype"):  # arrays, tracers, Tensors
        return
    raise PrecisionTypeError(
        f"a Tensor cannot be combined with {type(other).__name__} {other!r:.60} by "
        f"`{name}`: the other operand must be a Tensor, an array or a number; convert it "
        "first, e.g. jnp.asarray(values)"
    )


def binary(name: str) -> Callable[[Any, Any], Any]:
    """`self <op> other`."""

    def op(self: Any, other: Any) -> Any:
        if type(other) is not type(self):
            _check_operand(name, other)
        return _run(name, self, other)

    op.__name__ = f"__{name}__"
    return op


def reflected(name: str) -> Callable[[Any, Any], Any]:
    """`other <op> self`."""

    def op(self: Any, other: Any) -> Any:
        _check_operand(name, other)
        return _run("r:" + name, self, other)

    op.__name__ = f"__r{name}__"
    return op


def unary(name: str) -> Callable[[Any], Any]:
    """`<op> self`."""

    def op(self: Any) -> Any:
        return _run(name, self)

    op.__name__ = f"__{name}__"
    return op


def method(name: str) -> Callable[..., Any]:
    """The implementation of `name`, called with the Tensor first."""

    def call(self: Any, *args: Any) -> Any:
        return _run(name, self, *args)

    return call


def check_axes(axis: Any, ndim: int, what: str, *, several: bool = True) -> None:
    """Refuse an `axis` argument that is not None, an int or (if `several`) a tuple of
    distinct ints, each an axis of an `ndim`-d Tensor."""
    axes = axis if several and isinstance(axis, tuple | list) else (axis,)
    if axis is None:
        return
    if not all(isinstance(a, int | np.integer) and not isinstance(a, bool) for a in axes):
        raise PrecisionTypeError(
            f"{what}: axis must be None, an int{' or a tuple of ints' if several else ''}, got "
            f"{type(axis).__name__} {axis!r:.60}; pass e.g. axis=0"
        )
    wrapped = [int(a) % ndim if -ndim <= int(a) < ndim else None for a in axes]
    if None in wrapped or len(set(wrapped)) != len(wrapped):
        raise ShapeError(
            f"{what}: axis {axis!r} is not {'a set of distinct axes' if several else 'an axis'} "
            f"of a {ndim}-d Tensor; give axes in [-{ndim}, {ndim - 1}]"
        )


def reduction(name: str) -> Callable[..., Any]:
    """`t.sum(axis=None, keepdims=False)` and its siblings."""
    several = name not in ("argmax", "argmin")  # (they take one axis)

    def op(self: Any, axis: Any = None, keepdims: bool = False) -> Any:
        check_axes(axis, len(self.shape), f"Tensor.{name}", several=several)
        if not isinstance(keepdims, bool | np.bool_):
            raise PrecisionTypeError(
                f"Tensor.{name}: keepdims must be True or False, got "
                f"{type(keepdims).__name__} {keepdims!r:.60}"
            )
        return _run(name, self, axis=axis, keepdims=keepdims)

    op.__name__ = name
    op.__doc__ = f"`jnp.{name}` over the logical values, under the precision rules."
    return op
