"""Tensor's operators and methods as slots, filled in by `_attach`.

Each operator of `Tensor` (`+`, `@`, `<`, `t.sum()`, indexing, ...) is a slot
that calls the implementation registered under its name in `IMPLEMENTATIONS`.
The implementations are `apply`-wrapped jnp functions; `apply` itself handles
Tensors, so they cannot be built where `Tensor` is defined without an import
cycle. `_attach` builds and registers them; the package loads it before it
hands out any name that computes (see `precision/__init__.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._errors import PrecisionError

__all__ = ["IMPLEMENTATIONS", "binary", "method", "reduction", "reflected", "unary"]

IMPLEMENTATIONS: dict[str, Callable[..., Any]] = {}
"""Operator name (`"add"`, reflected `"r:add"`, `"sum"`, ...) -> its applied function."""


def _implementation(name: str) -> Callable[..., Any]:
    fn = IMPLEMENTATIONS.get(name)
    if fn is None:
        raise PrecisionError(
            f"Tensor operator {name!r} is not attached: the operators are attached when "
            "precision's public names are first used; import the library through them "
            "(`import precision; precision.Tensor(...)`), not through its private modules"
        )
    return fn


def binary(name: str) -> Callable[[Any, Any], Any]:
    """`self <op> other`."""

    def op(self: Any, other: Any) -> Any:
        return _implementation(name)(self, other)

    op.__name__ = f"__{name}__"
    return op


def reflected(name: str) -> Callable[[Any, Any], Any]:
    """`other <op> self`."""

    def op(self: Any, other: Any) -> Any:
        return _implementation("r:" + name)(self, other)

    op.__name__ = f"__r{name}__"
    return op


def unary(name: str) -> Callable[[Any], Any]:
    """`<op> self`."""

    def op(self: Any) -> Any:
        return _implementation(name)(self)

    op.__name__ = f"__{name}__"
    return op


def method(name: str) -> Callable[..., Any]:
    """The implementation of `name`, called with the Tensor first."""

    def call(self: Any, *args: Any) -> Any:
        return _implementation(name)(self, *args)

    return call


def reduction(name: str) -> Callable[..., Any]:
    """`t.sum(axis=None, keepdims=False)` and its siblings."""

    def op(self: Any, axis: Any = None, keepdims: bool = False) -> Any:
        return _implementation(name)(self, axis=axis, keepdims=keepdims)

    op.__name__ = name
    op.__doc__ = f"`jnp.{name}` over the logical values, under the precision rules."
    return op
