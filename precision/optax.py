"""Optax optimizer state kept in reduced formats across steps.

`reduced_state(tx, mu="bfloat16", nu="int8")` wraps any Optax
`GradientTransformation`: between steps its state leaves whose key path
names them (`mu`, `nu`, or any regex you give) are held as Tensors in a
reduced format, with honest bytes inside `jit`; each step decodes them, runs
the wrapped update in float32 and encodes the new state again.

The second moment of Adam-style optimizers spans many orders of magnitude,
and a linear integer code with one absmax scale per block rounds its small
entries to zero: the step `mu / (sqrt(nu) + eps)` then explodes and training
diverges (8-bit optimizers answer this with non-linear code books or
dynamic exponents). Here an integer format stores `sqrt(nu)` instead (half
the dynamic range in log terms), rounded *up*: the decoded `nu` is never
below the true one, so a quantized step is never larger than the float32
step would be. Float formats (bfloat16, float16) store `nu` as it is.

Requires `optax` (`pip install 'precision[models]'`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

import dtypes
from dtypes import PrecisionTypeError

from ._context import resolve_format
from ._errors import SelectionError
from ._tensor import Tensor, logical_values
from ._tree import is_tensor

__all__ = ["ReducedState", "reduced_state"]

_DEFAULT_INT_SCALING = dtypes.PerBlock(64)


class ReducedState(NamedTuple):
    """The wrapped optimizer's state, with the selected leaves stored as Tensors."""

    inner: Any


def _leaf_name(path: tuple[Any, ...]) -> str:
    return jax.tree_util.keystr(path)


def _check_arguments(inner: Any, patterns: Any, scaling: Any) -> None:
    """Refuse arguments of the wrong kind now, not at the first init or update."""
    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        raise PrecisionTypeError(
            f"reduced_state wraps an optax.GradientTransformation, got {type(inner).__name__} "
            f"{inner!r:.80}; pass e.g. reduced_state(optax.adam(1e-3))"
        )
    if patterns is not None and not isinstance(patterns, Mapping):
        raise PrecisionTypeError(
            f"reduced_state: patterns must be a dict of {{regex: format}}, got "
            f"{type(patterns).__name__} {patterns!r:.80}; pass e.g. "
            "patterns={r'\\.ema\\b': 'int8'}"
        )
    for key in patterns or {}:
        if not isinstance(key, str):
            raise PrecisionTypeError(
                f"reduced_state: each key of patterns is a regular expression (a str), got "
                f"{type(key).__name__} {key!r:.80}; pass e.g. patterns={{r'\\.ema\\b': 'int8'}}"
            )
    if scaling is not None and not isinstance(scaling, dtypes.Scaling):
        raise PrecisionTypeError(
            f"reduced_state: scaling must be a dtypes.Scaling or None, got "
            f"{type(scaling).__name__} {scaling!r:.80}; pass e.g. scaling=dtypes.PerBlock(64)"
        )


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise SelectionError(
            f"reduced_state: patterns key {pattern!r} is not a valid regular expression ({err}); "
            "escape special characters, e.g. re.escape('.ema')"
        ) from None


def reduced_state(
    inner: Any,
    *,
    mu: str | dtypes.Format | None = "bfloat16",
    nu: str | dtypes.Format | None = "bfloat16",
    patterns: dict[str, str | dtypes.Format] | None = None,
    scaling: dtypes.Scaling | None = None,
) -> Any:
    """Wrap an Optax transformation so its moments live in reduced formats.

    Args:
        inner: an `optax.GradientTransformation` (e.g. `optax.adamw(1e-3)`).
        mu: format of first-moment leaves (key paths naming `.mu`); None keeps
            them float32.
        nu: format of second-moment leaves (`.nu`); an integer format stores
            `sqrt(nu)` rounded up (see the module docstring).
        patterns: more `{regex: format}` rules, searched in each state leaf's key
            path (`jax.tree_util.keystr`), checked after `mu` and `nu`.
        scaling: scaling of integer and scaled encodings (default `PerBlock(64)`
            along the last axis; a leaf whose last axis is shorter uses
            `PerTensor()`).

    Returns:
        An `optax.GradientTransformation` whose state is a `ReducedState`.

    Raises:
        PrecisionTypeError: `inner` is not a transformation, `patterns` not a
            dict of strings, `scaling` not a `dtypes.Scaling`, or (at
            `update`) a state that is not this transformation's `ReducedState`.
        SelectionError: a `patterns` key is not a valid regular expression.
        FormatError: an unknown format name.

    Examples:
        >>> import jax.numpy as jnp
        >>> import optax
        >>> import precision
        >>> from precision.optax import reduced_state
        >>> tx = reduced_state(optax.adam(1e-2), mu="bfloat16", nu="int8")
        >>> params = {"w": jnp.ones((4, 128))}
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": jnp.full((4, 128), 0.5)}, state, params)
        >>> state.inner[0].nu["w"].format.name, precision.tree_nbytes(state.inner[0].nu)
        ('int8', 544)
    """
    import optax

    _check_arguments(inner, patterns, scaling)
    rules: list[tuple[re.Pattern[str], dtypes.Format, bool]] = []
    for pattern, fmt, is_nu in (
        (r"\.nu\b", nu, True),
        (r"\.mu\b", mu, False),
        *((p, f, False) for p, f in (patterns or {}).items()),
    ):
        if fmt is not None:
            rules.append((_compile(pattern), resolve_format(fmt), is_nu))

    def rule_of(path: Any) -> tuple[dtypes.Format, bool] | None:
        name = _leaf_name(path)
        for pattern, fmt, is_nu in rules:
            if pattern.search(name):
                return fmt, is_nu and fmt.kind == "int"
        return None

    def leaf_scaling(fmt: dtypes.Format, leaf: Any) -> dtypes.Scaling | None:
        if fmt.kind == "float" and scaling is None:
            return None
        chosen = scaling or _DEFAULT_INT_SCALING
        if isinstance(chosen, dtypes.PerBlock) and (
            leaf.ndim == 0
            or (-leaf.ndim <= chosen.axis < leaf.ndim and leaf.shape[chosen.axis] < chosen.size)
        ):
            return dtypes.PerTensor()
        return chosen  # an axis the leaf lacks: encoding says so, naming the leaf

    def encode(state: Any) -> Any:
        def one(path: Any, leaf: Any) -> Any:
            rule = rule_of(path)
            if rule is None or not jax.dtypes.issubdtype(leaf.dtype, jnp.floating):
                return leaf
            fmt, sqrt = rule
            value = jnp.sqrt(leaf) if sqrt else leaf
            return Tensor(value).to_reduced_precision(
                fmt,
                scaling=leaf_scaling(fmt, leaf),
                rounding="up" if sqrt else "nearest_even",
            )

        return jax.tree_util.tree_map_with_path(one, state)

    def decode(state: Any) -> Any:
        def one(path: Any, leaf: Any) -> Any:
            if not isinstance(leaf, Tensor):
                return leaf
            value = logical_values(leaf)
            rule = rule_of(path)
            return value * value if rule is not None and rule[1] else value

        return jax.tree_util.tree_map_with_path(one, state, is_leaf=is_tensor)

    def init_fn(params: Any) -> ReducedState:
        return ReducedState(encode(inner.init(params)))

    def update_fn(
        updates: Any, state: ReducedState, params: Any = None, **extra: Any
    ) -> tuple[Any, ReducedState]:
        if not isinstance(state, ReducedState):
            raise PrecisionTypeError(
                f"reduced_state: update needs the state this transformation's init returned (a "
                f"precision.optax.ReducedState), got {type(state).__name__} {state!r:.80}; pass "
                "state = tx.init(params) of this same tx, not the wrapped optimizer's own state"
            )
        new_updates, new_inner = inner.update(updates, decode(state.inner), params, **extra)
        return new_updates, ReducedState(encode(new_inner))

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
