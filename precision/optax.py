"""Optax wrappers: optimizer state kept in reduced formats, and loss scaling in one line.

`loss_scaling(tx)` wraps any Optax `GradientTransformation` so that a float16
training step needs one extra call, `scale_loss(state, loss)`: its `update`
unscales the gradients, skips a step whose gradients overflowed (zero updates,
the wrapped state unchanged) and adjusts the loss scale, which the state holds.

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
import numpy as np

import dtypes
from dtypes import PrecisionTypeError

from . import _applied_operators  # noqa: F401  (Tensor's operators, for the Tensors returned)
from ._errors import LossScaleTypeError, SelectionError, UpdateError
from ._loss_scale import DynamicLossScale, NoOpLossScale, StaticLossScale, all_finite, select_tree
from ._tensor import Tensor, logical_values
from ._tree import is_tensor

__all__ = [
    "LossScalingState",
    "ParamsLayout",
    "ReducedState",
    "loss_scaling",
    "reduced_state",
    "scale_loss",
]

_DEFAULT_INT_SCALING = dtypes.PerBlock(64)


class ReducedState(NamedTuple):
    """The wrapped optimizer's state, with the selected leaves stored as Tensors.

    `params_layout` is the structure and shapes of the parameters `init` was given
    (static data, no array), so `update` refuses updates that do not fit
    before the wrapped optimizer fails on them or broadcasts them silently;
    None (a state built by hand) leaves that check to the `params` argument.
    """

    inner: Any
    params_layout: ParamsLayout | None = None


class ParamsLayout:
    """The structure and leaf shapes of a parameter tree: a pytree node with no leaves,
    so it travels through `jit`, `scan` and `tree_map` as static structure."""

    def __init__(self, treedef: Any, shapes: tuple[tuple[int, ...], ...]) -> None:
        self.treedef = treedef
        self.shapes = shapes

    @classmethod
    def of(cls, tree: Any) -> ParamsLayout:
        leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_tensor)
        return cls(treedef, tuple(tuple(int(d) for d in np.shape(x)) for x in leaves))

    def check(self, tree: Any, what: str, owner: str = "reduced_state") -> None:
        """Refuse `tree` (`what`: "updates" or "params") unless it has this structure and
        shapes; `owner` names the transformation in the message."""
        flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_tensor)
        if treedef != self.treedef:
            raise UpdateError(
                f"{owner}: {what} have the structure {treedef}, but the state was built "
                f"by tx.init(params) for params of structure {self.treedef}; {what} must have "
                "the structure of those params (build a state for other params with "
                "tx.init(params))"
            )
        wrong = [
            f"{what}{_leaf_name(path)} has shape {tuple(np.shape(x))} where params"
            f"{_leaf_name(path)} had {shape}"
            for (path, x), shape in zip(flat, self.shapes, strict=True)
            if tuple(np.shape(x)) != shape
        ]
        if wrong:
            raise UpdateError(
                f"{owner}: {'; '.join(wrong)} at tx.init(params); {what} must match those "
                "params exactly (the optimizer would broadcast them into its moments)"
            )

    def __repr__(self) -> str:
        return f"ParamsLayout({jax.tree_util.tree_unflatten(self.treedef, self.shapes)})"


jax.tree_util.register_pytree_node(
    ParamsLayout,
    lambda layout: ((), (layout.treedef, layout.shapes)),
    lambda aux, _: ParamsLayout(*aux),
)


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


def _check_arrays(tree: Any, what: str, call: str, owner: str = "reduced_state") -> None:
    """Refuse a tree that is not plain arrays (or numbers), naming every leaf that is not.

    Optax would fail deep inside with a builtin (text, objects, None), or
    compute on a Tensor's codes and scales as if they were values. `owner`
    names the transformation (`reduced_state`, `loss_scaling`) in the message."""
    meaning = "the gradients" if what == "updates" else "the model's parameters"
    if tree is None:
        raise PrecisionTypeError(
            f"{owner}: {call} takes {what} ({meaning}, a pytree of arrays), got None; "
            "pass e.g. {'w': jnp.zeros((3, 4))}"
        )
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_tensor)[0]
    tensors = [f"{_leaf_name(p) or '<root>'} in {x.format.name}" for p, x in flat if is_tensor(x)]
    if tensors:
        raise PrecisionTypeError(
            f"{owner}: {what} hold precision.Tensor leaves ({', '.join(tensors)}); the "
            f"wrapped optimizer computes on plain arrays: pass "
            f"precision.to_full_precision({what}) (keep reduced parameters across steps with "
            "precision.apply_updates)"
        )
    others = [
        f"{what}{_leaf_name(p) or ' <root>'} is {type(x).__name__} {x!r:.60}"
        for p, x in flat
        if not _is_array(x)
    ]
    if others:
        raise PrecisionTypeError(
            f"{owner}: {'; '.join(others)}, not an array; {call} takes {what} "
            f"({meaning}) as a pytree of arrays"
        )


def _is_array(x: Any) -> bool:
    if isinstance(x, int | float | complex):
        return True
    dtype = getattr(x, "dtype", None)
    # Other dtypes pass (bfloat16, float8, PRNG keys): the optimizer decides about those.
    return (
        hasattr(x, "shape")
        and dtype is not None
        and getattr(dtype, "kind", None) not in ("O", "S", "U", "V")
    )


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise SelectionError(
            f"reduced_state: patterns key {pattern!r} is not a valid regular expression ({err}); "
            "escape special characters, e.g. re.escape('.ema')"
        ) from None


class _Moments(NamedTuple):
    """Which leaves of an optimizer state `reduced_state` stores in which format: `rules`
    of (key-path pattern, format, whether it stores the square root of a second moment),
    the first match applying, and the `scaling` asked for."""

    rules: list[tuple[re.Pattern[str], dtypes.Format, bool]]
    scaling: dtypes.Scaling | None

    @classmethod
    def of(
        cls,
        mu: str | dtypes.Format | None,
        nu: str | dtypes.Format | None,
        patterns: dict[str, str | dtypes.Format] | None,
        scaling: dtypes.Scaling | None,
    ) -> _Moments:
        rules: list[tuple[re.Pattern[str], dtypes.Format, bool]] = []
        for pattern, fmt, is_nu in (
            (r"\.nu\b", nu, True),
            (r"\.mu\b", mu, False),
            *((p, f, False) for p, f in (patterns or {}).items()),
        ):
            if fmt is not None:
                rules.append((_compile(pattern), dtypes.get(fmt), is_nu))
        return cls(rules, scaling)

    def rule_of(self, path: Any) -> tuple[dtypes.Format, bool] | None:
        name = _leaf_name(path)
        for pattern, fmt, is_nu in self.rules:
            if pattern.search(name):
                return fmt, is_nu and fmt.kind == "int"
        return None

    def leaf_scaling(self, fmt: dtypes.Format, leaf: Any) -> dtypes.Scaling | None:
        if fmt.kind == "float" and self.scaling is None:
            return None
        chosen = self.scaling or _DEFAULT_INT_SCALING
        if isinstance(chosen, dtypes.PerBlock) and (
            leaf.ndim == 0
            or (-leaf.ndim <= chosen.axis < leaf.ndim and leaf.shape[chosen.axis] < chosen.size)
        ):
            return dtypes.PerTensor()
        return chosen  # an axis the leaf lacks: encoding says so, naming the leaf

    def encode(self, state: Any) -> Any:
        def one(path: Any, leaf: Any) -> Any:
            rule = self.rule_of(path)
            if rule is None or not jax.dtypes.issubdtype(leaf.dtype, jnp.floating):
                return leaf
            fmt, sqrt = rule
            value = jnp.sqrt(leaf) if sqrt else leaf
            return Tensor(value).to_reduced_precision(
                fmt,
                scaling=self.leaf_scaling(fmt, leaf),
                rounding="up" if sqrt else "nearest_even",
            )

        return jax.tree_util.tree_map_with_path(one, state)

    def decode(self, state: Any) -> Any:
        def one(path: Any, leaf: Any) -> Any:
            if not isinstance(leaf, Tensor):
                return leaf
            value = logical_values(leaf)
            rule = self.rule_of(path)
            return value * value if rule is not None and rule[1] else value

        return jax.tree_util.tree_map_with_path(one, state, is_leaf=is_tensor)


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
            dict of strings, `scaling` not a `dtypes.Scaling`; at `init` and
            `update`, params or updates that are None or hold leaves other
            than arrays (text, objects, Tensors: pass
            `precision.to_full_precision(tree)`), or a state that is not this
            transformation's `ReducedState`.
        UpdateError: at `update`, updates (or params) whose structure or leaf
            shapes differ from the params given to `init`, or a state made by
            another optimizer's init, checked before the wrapped optimizer fails
            on them or broadcasts them.
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
    moments = _Moments.of(mu, nu, patterns, scaling)
    encode, decode = moments.encode, moments.decode

    expected_states: dict[Any, Any] = {}  # params layout -> the inner state's structure

    def init_fn(params: Any) -> ReducedState:
        _check_arrays(params, "params", "tx.init(params)")
        return ReducedState(encode(inner.init(params)), ParamsLayout.of(params))

    def update_fn(
        updates: Any, state: ReducedState, params: Any = None, **extra: Any
    ) -> tuple[Any, ReducedState]:
        layout = _check_update(updates, state, params)
        _check_inner_state(state, layout, inner, expected_states)
        new_updates, new_inner = inner.update(updates, decode(state.inner), params, **extra)
        return new_updates, ReducedState(encode(new_inner), state.params_layout)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _check_update(updates: Any, state: Any, params: Any) -> ParamsLayout | None:
    """What `update` is given, checked before the wrapped optimizer sees it."""
    if not isinstance(state, ReducedState):
        raise PrecisionTypeError(
            f"reduced_state: update needs the state this transformation's init returned (a "
            f"precision.optax.ReducedState), got {type(state).__name__} {state!r:.80}; pass "
            "state = tx.init(params) of this same tx, not the wrapped optimizer's own state"
        )
    return _check_given(updates, state.params_layout, params, "reduced_state")


def _check_given(
    updates: Any, layout: ParamsLayout | None, params: Any, owner: str
) -> ParamsLayout | None:
    """Updates (and params, if given) are arrays shaped like the params of `tx.init`."""
    call = "tx.update(updates, state, params)"
    _check_arrays(updates, "updates", call, owner)
    if params is not None:
        _check_arrays(params, "params", call, owner)
    if layout is None and params is not None:
        layout = ParamsLayout.of(params)
    if layout is not None:
        layout.check(updates, "updates", owner)
        if params is not None:
            layout.check(params, "params", owner)
    return layout


def _check_inner_state(
    state: Any,
    layout: ParamsLayout | None,
    inner: Any,
    known: dict[Any, Any],
    owner: str = "reduced_state",
) -> None:
    """Refuse a `ReducedState` made by another optimizer's init (an Adam state given to
    an SGD's update fails inside optax with `AttributeError: ... 'trace'`)."""
    if layout is None:
        return
    key = (layout.treedef, layout.shapes)
    expected = known.get(key)
    if expected is None:
        shapes = [jax.ShapeDtypeStruct(s, jnp.float32) for s in layout.shapes]
        try:
            made = jax.eval_shape(inner.init, jax.tree_util.tree_unflatten(layout.treedef, shapes))
        except Exception:  # an init that needs concrete values: optax will judge the state
            return
        expected = known[key] = jax.tree_util.tree_structure(made)
    found = jax.tree_util.tree_structure(state.inner, is_leaf=is_tensor)
    if found != expected:
        raise UpdateError(
            f"{owner}: the state holds {_state_kind(state.inner)}, but this "
            f"transformation's wrapped optimizer keeps {_state_kind_of(expected)}: it was made "
            "by another optimizer's init; pass state = tx.init(params) of this same tx"
        )


def _state_kind(inner: Any) -> str:
    parts = inner if isinstance(inner, tuple) and not hasattr(inner, "_fields") else (inner,)
    return ", ".join(type(p).__name__ for p in parts) or "an empty state"


def _state_kind_of(treedef: Any) -> str:
    dummy = jax.tree_util.tree_unflatten(treedef, [0] * treedef.num_leaves)
    return _state_kind(dummy)


_LOSS_SCALES = (DynamicLossScale, StaticLossScale, NoOpLossScale)


class LossScalingState(NamedTuple):
    """The state of `loss_scaling(tx)`: the wrapped optimizer's state, and the loss
    scale the next step's loss is multiplied by (`scale_loss(state, loss)`).

    `params_layout` is the structure and shapes of the parameters `init` was
    given (as in `ReducedState`): `update` refuses gradients that do not fit them.
    """

    inner: Any
    loss_scale: DynamicLossScale | StaticLossScale | NoOpLossScale
    params_layout: ParamsLayout | None = None


def loss_scaling(inner: Any, loss_scale: Any = None) -> Any:
    """Wrap an Optax transformation with loss scaling: one line instead of five calls.

    The step differentiates `scale_loss(state, loss)`, so its gradients are those
    of the scaled loss; `update` then, in the wrapped optimizer's place:

    1. divides the gradients by the loss scale (`unscale`, in their own dtype);
    2. checks that every one is finite (`all_finite`);
    3. runs the wrapped `update` on them; where they were not finite, returns
       zero updates and keeps the wrapped state as it was (the step is skipped);
    4. adjusts the loss scale (`adjust`): a dynamic scale halves after an
       overflow and grows after `period` finite steps.

    Args:
        inner: an `optax.GradientTransformation` (e.g. `optax.adamw(1e-3)`).
        loss_scale: the starting loss scale: a `DynamicLossScale` (default:
            `DynamicLossScale(2**15)`), `StaticLossScale` or `NoOpLossScale`.

    Returns:
        An `optax.GradientTransformation` whose state is a `LossScalingState`.

    Raises:
        PrecisionTypeError: `inner` is not a transformation (no `init`/`update`);
            at `init` and `update`, params or gradients that are None or hold
            leaves other than arrays (text, objects, Tensors), or a state that
            is not this transformation's `LossScalingState` (the checks of
            `reduced_state`).
        UpdateError: at `update`, gradients (or params) whose structure or
            leaf shapes differ from the params given to `init`, or a state
            made by another optimizer's init.
        LossScaleTypeError: `loss_scale` is not one of the three loss scales.

    Examples:
        >>> import optax
        >>> from precision.optax import loss_scaling, scale_loss
        >>> tx = loss_scaling(optax.sgd(0.5))
        >>> params = jnp.ones(3)
        >>> state = tx.init(params)
        >>> loss = lambda p: jnp.sum(p * p)
        >>> grads = jax.grad(lambda p: scale_loss(state, loss(p)))(params)
        >>> updates, state = tx.update(grads, state, params)
        >>> updates.tolist(), float(state.loss_scale.loss_scale)
        ([-1.0, -1.0, -1.0], 32768.0)
    """
    import optax

    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        raise PrecisionTypeError(
            f"loss_scaling wraps an optax.GradientTransformation, got {type(inner).__name__} "
            f"{inner!r:.80}; pass e.g. loss_scaling(optax.adam(1e-3))"
        )
    if loss_scale is None:
        loss_scale = DynamicLossScale(jnp.float32(2.0**15))
    if not isinstance(loss_scale, _LOSS_SCALES):
        raise LossScaleTypeError(
            f"loss_scaling: loss_scale must be a DynamicLossScale, StaticLossScale or "
            f"NoOpLossScale, got {type(loss_scale).__name__} {loss_scale!r:.80}; pass e.g. "
            "precision.DynamicLossScale(jnp.float32(2.0**15)), or leave it out for that default"
        )
    start = loss_scale
    expected_states: dict[Any, Any] = {}  # params layout -> the inner state's structure

    def init_fn(params: Any) -> LossScalingState:
        _check_arrays(params, "params", "tx.init(params)", "loss_scaling")
        return LossScalingState(inner.init(params), start, ParamsLayout.of(params))

    def update_fn(
        grads: Any, state: LossScalingState, params: Any = None, **extra: Any
    ) -> tuple[Any, LossScalingState]:
        if not isinstance(state, LossScalingState):
            raise PrecisionTypeError(
                f"loss_scaling: update needs the state this transformation's init returned "
                f"(a precision.optax.LossScalingState), got {type(state).__name__} "
                f"{state!r:.80}; pass state = tx.init(params) of this same tx"
            )
        layout = _check_given(grads, state.params_layout, params, "loss_scaling")
        _check_inner_state(state, layout, inner, expected_states, "loss_scaling")
        grads = state.loss_scale.unscale(grads)
        finite = all_finite(grads)
        updates, new_inner = inner.update(grads, state.inner, params, **extra)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, updates)
        updates = select_tree(finite, updates, zeros)
        new_inner = select_tree(finite, new_inner, state.inner)
        adjusted = state.loss_scale.adjust(finite)
        return updates, LossScalingState(new_inner, adjusted, state.params_layout)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def scale_loss(state: Any, loss: Any) -> Any:
    """`loss` times the loss scale held by a `loss_scaling` state (found inside an
    `optax.chain` or any tuple of states too), in the loss's own dtype.

    Raises:
        PrecisionTypeError: `state` holds no `LossScalingState`, or more than one.
    """
    found = [
        leaf
        for leaf in jax.tree_util.tree_leaves(
            state, is_leaf=lambda x: isinstance(x, LossScalingState)
        )
        if isinstance(leaf, LossScalingState)
    ]
    if len(found) != 1:
        what = "none" if not found else f"{len(found)}"
        raise PrecisionTypeError(
            f"scale_loss needs the state of one precision.optax.loss_scaling transformation, "
            f"found {what} in {type(state).__name__} {state!r:.80}; pass the state "
            "tx.init(params) returned for tx = loss_scaling(optimizer)"
        )
    return found[0].loss_scale.scale(loss)
