"""Tensor operators and methods: thin calls of `precision.apply`.

Each operator is one `apply`-wrapped jnp function, created at its first use
(so importing `precision` builds nothing and `_tensor` needs no import of the
apply machinery, which itself imports `_tensor`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

__all__ = ["binary", "method", "reduction", "reflected", "unary"]


@functools.cache
def _applied(name: str) -> Callable[..., Any]:
    from ._apply import apply

    if name.startswith("r:"):
        fn = _FUNCTIONS[name[2:]]
        return apply(lambda a, b: fn(b, a))
    return apply(_FUNCTIONS[name])


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
    "truediv": jnp.true_divide,
    "floordiv": jnp.floor_divide,
    "mod": jnp.mod,
    "pow": jnp.power,
    "matmul": jnp.matmul,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "neg": jnp.negative,
    "pos": jnp.positive,
    "abs": jnp.abs,
    "getitem": lambda x, idx: x[idx],
    "reshape": lambda x, shape: x.reshape(shape),
    "transpose": lambda x, axes: x.transpose(axes),
    "sum": jnp.sum,
    "mean": jnp.mean,
    "max": jnp.max,
    "min": jnp.min,
    "argmax": jnp.argmax,
    "argmin": jnp.argmin,
}


def binary(name: str) -> Callable[[Any, Any], Any]:
    """`self <op> other`."""

    def op(self: Any, other: Any) -> Any:
        return _applied(name)(self, other)

    op.__name__ = f"__{name}__"
    return op


def reflected(name: str) -> Callable[[Any, Any], Any]:
    """`other <op> self`."""

    def op(self: Any, other: Any) -> Any:
        return _applied("r:" + name)(self, other)

    op.__name__ = f"__r{name}__"
    return op


def unary(name: str) -> Callable[[Any], Any]:
    """`<op> self`."""

    def op(self: Any) -> Any:
        return _applied(name)(self)

    op.__name__ = f"__{name}__"
    return op


def method(name: str) -> Callable[..., Any]:
    """The applied function of `name`, called with the Tensor first."""

    def call(self: Any, *args: Any) -> Any:
        return _applied(name)(self, *args)

    return call


def reduction(name: str) -> Callable[..., Any]:
    """`t.sum(axis=None, keepdims=False)` and its siblings."""

    def op(self: Any, axis: Any = None, keepdims: bool = False) -> Any:
        return _applied(name)(self, axis=axis, keepdims=keepdims)

    op.__name__ = name
    op.__doc__ = f"`jnp.{name}` over the logical values, under the precision rules."
    return op
