"""Loss scaling for float16 training: keep small gradients above the underflow line.

A float16 gradient smaller than 2**-24 (the smallest float16 subnormal) rounds
to zero. Multiplying the loss by a large factor before differentiating shifts
every gradient up by the same factor; dividing it out afterwards, in the
gradients' own (usually float32) dtype, restores their values. A dynamic loss
scale starts high, halves whenever the scaled gradients overflow to inf/NaN
(and that step is skipped), and doubles again after `period` finite steps.

Every class here is an immutable pytree: the changing numbers (`loss_scale`,
`counter`) are children, the settings (`period`, `factor`, `min_loss_scale`)
are static aux data, so all of them survive `jit`, `tree_map` and
flatten/unflatten unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "DynamicLossScale",
    "NoOpLossScale",
    "StaticLossScale",
    "all_finite",
    "select_tree",
]


def _is_reduced_tensor(x: Any) -> bool:
    from ._tree import is_tensor

    return is_tensor(x)


def _multiply(tree: Any, factor: jax.Array, what: str) -> Any:
    """Multiply every floating array leaf by `factor`, cast to that leaf's dtype.

    Casting the factor (not the leaf) is what keeps a float16 loss float16: a
    float32 factor would promote it and break `lax.select`/`lax.cond` branches
    that expect the original dtype.
    """

    def one(x):
        if _is_reduced_tensor(x):
            raise TypeError(
                f"cannot {what} a precision.Tensor leaf: loss scaling works on plain arrays "
                "(the loss and the gradients); call jnp.asarray(t) or t.to_full_precision() first"
            )
        if not hasattr(x, "dtype") or not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x * factor.astype(x.dtype)

    return jax.tree_util.tree_map(one, tree, is_leaf=_is_reduced_tensor)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class NoOpLossScale:
    """A loss scale that does nothing: the same interface for float32/bfloat16 runs.

    Examples:
        >>> ls = NoOpLossScale()
        >>> float(ls.scale(jnp.float32(2.0))), float(ls.loss_scale)
        (2.0, 1.0)
    """

    @property
    def loss_scale(self) -> jax.Array:
        """Always 1."""
        return jnp.float32(1)

    def scale(self, tree: Any) -> Any:
        """Return `tree` unchanged."""
        return tree

    def unscale(self, tree: Any) -> Any:
        """Return `tree` unchanged."""
        return tree

    def adjust(self, grads_finite: jax.Array) -> NoOpLossScale:
        """Return `self`; there is nothing to adjust."""
        del grads_finite
        return self

    def tree_flatten(self):
        return (), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        del aux, children
        return cls()


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class StaticLossScale:
    """A fixed loss scale.

    Args:
        loss_scale: the factor the loss is multiplied by (kept as float32).

    Examples:
        >>> ls = StaticLossScale(1024)
        >>> loss = jnp.float16(0.5)
        >>> ls.scale(loss).dtype, float(ls.scale(loss)), float(ls.unscale(ls.scale(loss)))
        (dtype('float16'), 512.0, 0.5)
    """

    loss_scale: jax.Array

    def __post_init__(self):
        object.__setattr__(self, "loss_scale", _as_scale(self.loss_scale))

    def scale(self, tree: Any) -> Any:
        """Multiply every floating leaf by the loss scale (in the leaf's own dtype)."""
        return _multiply(tree, self.loss_scale, "scale")

    def unscale(self, tree: Any) -> Any:
        """Divide every floating leaf by the loss scale (in the leaf's own dtype)."""
        return _multiply(tree, 1 / self.loss_scale, "unscale")

    def adjust(self, grads_finite: jax.Array) -> StaticLossScale:
        """Return `self`: a static scale never changes."""
        del grads_finite
        return self

    def tree_flatten(self):
        return (self.loss_scale,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        del aux
        obj = object.__new__(cls)
        object.__setattr__(obj, "loss_scale", children[0])
        return obj


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class DynamicLossScale:
    """A loss scale that halves on overflow and grows after `period` good steps.

    The field names follow the common convention (`loss_scale`, `counter`,
    `period`, `factor`, `min_loss_scale`), so training loops written for it
    elsewhere read the same.

    Args:
        loss_scale: initial scale (float32). 2**15 is a good start for float16:
            it is the largest power of two whose product with a loss near 1
            stays below float16's maximum, 65504.
        counter: finite steps since the last change (int32).
        period: grow after this many consecutive finite steps.
        factor: multiply by this to grow, divide by it on overflow.
        min_loss_scale: never shrink below this.

    Examples:
        >>> ls = DynamicLossScale(jnp.float32(2.0**15), period=2)
        >>> ls = ls.adjust(jnp.bool_(True)).adjust(jnp.bool_(True))
        >>> float(ls.loss_scale), int(ls.counter)
        (65536.0, 0)
        >>> float(ls.adjust(jnp.bool_(False)).loss_scale)
        32768.0
    """

    loss_scale: jax.Array
    counter: jax.Array = dataclasses.field(default_factory=lambda: np.int32(0))
    period: int = 2000
    factor: int | float = 2
    min_loss_scale: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "loss_scale", _as_scale(self.loss_scale))
        object.__setattr__(self, "counter", _as_counter(self.counter))
        if not isinstance(self.period, int) or isinstance(self.period, bool) or self.period < 1:
            raise ValueError(f"period must be a positive int, got {self.period!r}")
        if not (isinstance(self.factor, int | float) and self.factor > 1):
            raise ValueError(f"factor must be a number greater than 1, got {self.factor!r}")
        if not (isinstance(self.min_loss_scale, int | float) and self.min_loss_scale > 0):
            raise ValueError(
                f"min_loss_scale must be a positive number, got {self.min_loss_scale!r}"
            )

    def scale(self, tree: Any) -> Any:
        """Multiply every floating leaf by the loss scale (in the leaf's own dtype)."""
        return _multiply(tree, self.loss_scale, "scale")

    def unscale(self, tree: Any) -> Any:
        """Divide every floating leaf by the loss scale (in the leaf's own dtype)."""
        return _multiply(tree, 1 / self.loss_scale, "unscale")

    def adjust(self, grads_finite: jax.Array) -> DynamicLossScale:
        """The loss scale for the next step, given whether this step's grads were finite.

        Finite: count one more good step, and after `period` of them multiply
        the scale by `factor` (restarting the count). Not finite: divide the
        scale by `factor`, never below `min_loss_scale`, and restart the count.
        Jit-safe: `grads_finite` may be a traced boolean.
        """
        grads_finite = jnp.asarray(grads_finite, bool)
        one = jnp.ones_like(self.counter)
        grow = self.counter == self.period - 1
        finite_scale = jnp.where(grow, self.loss_scale * self.factor, self.loss_scale)
        finite_counter = jnp.where(grow, jnp.zeros_like(self.counter), self.counter + one)
        shrunk = jnp.maximum(self.loss_scale / self.factor, jnp.float32(self.min_loss_scale))
        return self._replace(
            loss_scale=jnp.where(grads_finite, finite_scale, shrunk).astype(jnp.float32),
            counter=jnp.where(grads_finite, finite_counter, jnp.zeros_like(self.counter)),
        )

    def _replace(self, **changes) -> DynamicLossScale:
        children = {"loss_scale": self.loss_scale, "counter": self.counter, **changes}
        return self.tree_unflatten(
            (self.period, self.factor, self.min_loss_scale),
            (children["loss_scale"], children["counter"]),
        )

    def tree_flatten(self):
        return (self.loss_scale, self.counter), (self.period, self.factor, self.min_loss_scale)

    @classmethod
    def tree_unflatten(cls, aux, children):
        # Bypass __post_init__: under tracing the children are tracers or
        # placeholders, which must pass through untouched.
        obj = object.__new__(cls)
        for name, value in zip(("loss_scale", "counter"), children, strict=True):
            object.__setattr__(obj, name, value)
        for name, value in zip(("period", "factor", "min_loss_scale"), aux, strict=True):
            object.__setattr__(obj, name, value)
        return obj


def _as_scale(value: Any) -> Any:
    if isinstance(value, jax.core.Tracer):
        return value.astype(jnp.float32)
    with jax.ensure_compile_time_eval():  # concrete even inside a jit trace
        arr = jnp.asarray(value, jnp.float32)
        if arr.shape != ():
            raise ValueError(f"loss_scale must be a scalar, got shape {arr.shape}")
        if not bool(jnp.isfinite(arr)) or float(arr) <= 0:
            raise ValueError(f"loss_scale must be a positive finite number, got {float(arr)}")
    return arr


def _as_counter(value: Any) -> Any:
    if isinstance(value, jax.core.Tracer):
        return value.astype(jnp.int32)
    return jnp.asarray(value, jnp.int32)


def all_finite(tree: Any) -> jax.Array:
    """Whether every floating value in `tree` is finite (a scalar bool array).

    Integer and bool leaves count as finite; a `precision.Tensor` is judged by
    its logical values. An empty tree is finite. Jit-safe.

    Examples:
        >>> bool(all_finite({"a": jnp.ones(3), "b": jnp.int32(7)}))
        True
        >>> bool(all_finite([jnp.ones(3), jnp.array([1.0, jnp.inf])]))
        False
    """
    flags = []
    for leaf in jax.tree_util.tree_leaves(tree, is_leaf=_is_reduced_tensor):
        if _is_reduced_tensor(leaf):
            leaf = jnp.asarray(leaf)
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact):
            flags.append(jnp.all(jnp.isfinite(leaf)))
    if not flags:
        return jnp.bool_(True)
    return jnp.all(jnp.stack(flags))


def select_tree(pred: Any, on_true: Any, on_false: Any) -> Any:
    """Pick `on_true` where the scalar `pred` holds, else `on_false`, leaf by leaf.

    The two trees must have the same structure and leaf dtypes (nothing is
    promoted). Typical use: skip an update whose gradients were not finite.
    `precision.Tensor` leaves of one format select their storage directly.

    Raises:
        ValueError: the trees differ in structure, or `pred` is not a scalar.
        TypeError: a pair of leaves differ in dtype.

    Examples:
        >>> new = select_tree(jnp.bool_(False), {"w": jnp.ones(2)}, {"w": jnp.zeros(2)})
        >>> new["w"].tolist()
        [0.0, 0.0]
    """
    pred = jnp.asarray(pred)
    if pred.shape != ():
        raise ValueError(f"select_tree needs a scalar predicate, got shape {pred.shape}")
    ta = jax.tree_util.tree_structure(on_true)
    tb = jax.tree_util.tree_structure(on_false)
    if ta != tb:
        raise ValueError(f"select_tree needs two trees of one structure, got {ta} and {tb}")

    def one(path, a, b):
        a, b = jnp.asarray(a), jnp.asarray(b)
        if a.dtype != b.dtype:
            raise TypeError(
                f"select_tree: leaf {jax.tree_util.keystr(path) or '<root>'} is {a.dtype} in "
                f"one tree and {b.dtype} in the other; cast one with .astype({a.dtype}) first"
            )
        return jnp.where(pred.astype(bool), a, b)

    return jax.tree_util.tree_map_with_path(one, on_true, on_false)
