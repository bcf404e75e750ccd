"""Attaches Tensor's operators: each is `precision.apply` of a jnp function.

`Tensor` (in `_tensor`) declares its operators as slots (`_operators`); this
module fills them in. It imports `apply`, which imports `Tensor`, so it is the
one module that sees both, and nothing in the package imports it back: the
package's `__getattr__` loads it before handing out a name that computes, as do
`precision.numpy`, `precision.optax`, `precision.testing` and the command line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from ._apply import apply
from ._operators import IMPLEMENTATIONS

__all__: list[str] = []

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

_REFLECTED = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul")


def _swapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    return lambda a, b: fn(b, a)


for _name, _fn in _FUNCTIONS.items():
    IMPLEMENTATIONS[_name] = apply(_fn)
for _name in _REFLECTED:
    IMPLEMENTATIONS["r:" + _name] = apply(_swapped(_FUNCTIONS[_name]))
