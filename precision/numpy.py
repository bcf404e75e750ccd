"""Every `jax.numpy` function over Tensors: `precision.numpy.tanh(t)` and so on.

Each function is `precision.apply(jnp.<name>)`, built on first use and kept,
so the precision rules hold and repeated calls reuse compiled code.
Non-callable attributes (`pi`, `float32`, ...) are passed through.

Examples:
    >>> import precision
    >>> import precision.numpy as pnp
    >>> t = precision.Tensor([0.5, 1.0]).to_reduced_precision("float16")
    >>> pnp.tanh(t).format.name
    'float16'
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from . import _applied_operators  # noqa: F401  (Tensor's operators, for the Tensors returned)
from ._apply import apply
from ._errors import PrecisionError
from ._operators import refusal

_WRAPPED: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    fn = _WRAPPED.get(name)
    if fn is not None:
        return fn
    try:
        attr = getattr(jnp, name)
    except AttributeError:
        raise AttributeError(
            f"module 'precision.numpy' has no attribute {name!r}: jax.numpy has no {name!r}"
        ) from None
    if not callable(attr) or isinstance(attr, type):
        return attr
    fn = _WRAPPED[name] = _refusing(name, apply(attr))
    return fn


def _refusing(name: str, applied: Callable[..., Any]) -> Callable[..., Any]:
    """`applied`, with JAX's refusal of its arguments raised as the library's errors."""

    @functools.wraps(applied)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return applied(*args, **kwargs)
        except PrecisionError:
            raise
        except (TypeError, ValueError, OverflowError) as err:
            raise refusal(f"precision.numpy.{name}", args, err) from err

    return call


def __dir__() -> list[str]:
    return sorted(set(dir(jnp)))
