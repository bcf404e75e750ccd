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

Leaves are JAX values: with `jax_enable_x64` off, a numpy float64 or int64
leaf (or a Python number) becomes 32-bit as anywhere in JAX. `scale`,
`unscale` and `select_tree` refuse a concrete leaf that this would turn into
another number (an integer past int32, a finite float past float32's range,
which would become inf) rather than return it; `all_finite` judges concrete
values in their own precision, so a float64 1e300 is finite.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dtypes import is_tracer

from ._errors import LossScaleError, LossScaleTypeError
from ._narrowing import X64_FIX, narrowing
from ._tree import is_tensor

_F32_MAX = float(np.finfo(np.float32).max)

__all__ = [
    "DynamicLossScale",
    "NoOpLossScale",
    "StaticLossScale",
    "all_finite",
    "select_tree",
]


def _multiply(tree: Any, factor: jax.Array, what: str) -> Any:
    """Multiply every floating (or complex) leaf by `factor`, cast to that leaf's dtype.

    Casting the factor (not the leaf) is what keeps a float16 loss float16: a
    float32 factor would promote it and break `lax.select`/`lax.cond` branches
    that expect the original dtype. A Python float leaf becomes a JAX array (it
    has no dtype of its own to keep); integer and bool leaves are returned as
    they are.
    """

    def one(path: Any, x: Any) -> Any:
        if is_tensor(x):
            raise LossScaleTypeError(
                f"cannot {what} a precision.Tensor leaf: loss scaling works on plain arrays "
                "(the loss and the gradients); make the Tensors plain arrays first with "
                "precision.to_full_precision(tree)"
            )
        if _concrete_inexact(x):
            _refuse_narrowing(path, x, what)
        arr = _numeric_leaf(path, x, what)
        if not jnp.issubdtype(arr.dtype, jnp.inexact):
            return x
        return arr * factor.astype(arr.dtype)

    return jax.tree_util.tree_map_with_path(one, tree, is_leaf=is_tensor)


def _numeric_leaf(path: Any, x: Any, what: str) -> Any:
    """`x` as something with a dtype: arrays as they are, Python numbers as arrays.

    A leaf that is not a number (text, an arbitrary object) has no loss-scaled
    value and no finiteness: passing it through would hide a tree that is not
    the loss or the gradients.
    """
    if isinstance(x, bool | int):
        return np.asarray(x)  # integers are never scaled and count as finite
    if isinstance(x, float | complex):
        return jnp.asarray(x)
    dtype = getattr(x, "dtype", None)
    # Arrays of any other dtype pass (bfloat16, float8, PRNG keys): only floating
    # and complex ones are ever scaled or checked.
    if dtype is None or getattr(dtype, "kind", None) in ("O", "S", "U"):
        where = jax.tree_util.keystr(path) or "<root>"
        shown = f"dtype {dtype}" if dtype is not None else type(x).__name__
        raise LossScaleTypeError(
            f"cannot {what} leaf {where}: it is {shown} {x!r:.60}, not a number; loss scaling "
            "works on the loss and the gradients (float arrays): drop non-numeric leaves first"
        )
    return x


def _concrete_inexact(x: Any) -> bool:
    """A float or complex leaf that is a Python or numpy value, not a JAX one."""
    if isinstance(x, float | complex):  # np.float64 and np.complex128 too
        return True
    return isinstance(x, np.ndarray | np.generic) and x.dtype.kind in "fc"


def _refuse_narrowing(path: Any, x: Any, what: str, tree: str = "") -> None:
    """Refuse a concrete leaf that JAX would turn into another number (see `_narrowing`)."""
    problem = narrowing(x)
    if problem is not None:
        where = jax.tree_util.keystr(path) or "<root>"
        raise LossScaleError(f"cannot {what} leaf {where}{tree}: it {problem}; {X64_FIX}")


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
        return jnp.asarray(1, jnp.float32)

    def scale(self, tree: Any) -> Any:
        """Return `tree` unchanged."""
        return tree

    def unscale(self, tree: Any) -> Any:
        """Return `tree` unchanged."""
        return tree

    def adjust(self, grads_finite: jax.Array) -> NoOpLossScale:
        """Return `self`; there is nothing to adjust (the flag is still checked, as
        `DynamicLossScale.adjust` checks it, so swapping scales changes nothing else)."""
        _as_flag(grads_finite, "NoOpLossScale.adjust", "all_finite(grads)")
        return self

    def tree_flatten(self) -> tuple[tuple[()], None]:
        return (), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: Any) -> NoOpLossScale:
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "loss_scale", _as_scale(self.loss_scale))

    def scale(self, tree: Any) -> Any:
        """Multiply every floating leaf by the loss scale (in the leaf's own dtype)."""
        return _multiply(tree, self.loss_scale, "scale")

    def unscale(self, tree: Any) -> Any:
        """Divide every floating leaf by the loss scale (in the leaf's own dtype)."""
        return _multiply(tree, 1 / self.loss_scale, "unscale")

    def adjust(self, grads_finite: jax.Array) -> StaticLossScale:
        """Return `self`: a static scale never changes (the flag is still checked, as
        `DynamicLossScale.adjust` checks it)."""
        _as_flag(grads_finite, "StaticLossScale.adjust", "all_finite(grads)")
        return self

    def tree_flatten(self) -> tuple[tuple[jax.Array], None]:
        return (self.loss_scale,), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: Any) -> StaticLossScale:
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
        factor: multiply by this to grow, divide by it on overflow (a finite
            number greater than 1).
        min_loss_scale: never shrink below this (a positive finite number;
            Python, numpy and JAX scalars are accepted).

    Growth stops at float32's largest power of two, 2**127: a scale that
    reached inf would make every scaled gradient inf and never recover.

    Examples:
        >>> ls = DynamicLossScale(jnp.float32(2.0**15), period=2)
        >>> ls = ls.adjust(jnp.bool_(True)).adjust(jnp.bool_(True))
        >>> float(ls.loss_scale), int(ls.counter)
        (65536.0, 0)
        >>> float(ls.adjust(jnp.bool_(False)).loss_scale)
        32768.0
    """

    loss_scale: jax.Array
    counter: jax.Array | np.int32 = dataclasses.field(default_factory=lambda: np.int32(0))
    period: int = 2000
    factor: int | float = 2
    min_loss_scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "loss_scale", _as_scale(self.loss_scale))
        object.__setattr__(self, "counter", _as_counter(self.counter))
        period = self.period
        if (
            isinstance(period, bool | np.bool_)
            or not isinstance(period, numbers.Integral)
            or not 1 <= period < 2**31
        ):
            raise LossScaleError(
                f"period must be a positive int below 2**31 (the int32 step counter), got "
                f"{type(period).__name__} {period!r}; pass e.g. period=2000"
            )
        factor = _static_number(self.factor, "factor", "factor=2")
        if not 1 < factor <= _F32_MAX:
            raise LossScaleError(
                f"factor must be a finite number greater than 1 (and finite in float32), got "
                f"{factor!r}; pass e.g. factor=2"
            )
        floor = _static_number(self.min_loss_scale, "min_loss_scale", "min_loss_scale=1.0")
        if not 0 < floor <= 2.0**127 or np.float32(floor) == 0:
            # float32 holds the scale: a floor that rounds to 0 lets the scale reach 0
            # (never to grow again), one above 2**127 (the growth cap) to inf.
            raise LossScaleError(
                f"min_loss_scale must be a positive finite number from float32's smallest "
                f"(1.4e-45) up to 2**127, got {floor!r}; pass e.g. min_loss_scale=1.0"
            )
        # Static aux data: plain Python numbers, hashable and equal across traces.
        object.__setattr__(self, "period", int(period))
        object.__setattr__(self, "factor", factor)
        object.__setattr__(self, "min_loss_scale", floor)

    def scale(self, tree: Any) -> Any:
        """Multiply every floating leaf by the loss scale (in the leaf's own dtype)."""
        return _multiply(tree, self.loss_scale, "scale")

    def unscale(self, tree: Any) -> Any:
        """Divide every floating leaf by the loss scale (in the leaf's own dtype)."""
        return _multiply(tree, 1 / self.loss_scale, "unscale")

    def adjust(self, grads_finite: jax.Array) -> DynamicLossScale:
        """The loss scale for the next step, given whether this step's grads were finite.

        Finite: count one more good step, and after `period` of them multiply
        the scale by `factor` (restarting the count), up to 2**127 at most.
        Not finite: divide the scale by `factor`, never below
        `min_loss_scale` (a scale that starts below it is kept, not raised),
        and restart the count. Jit-safe: `grads_finite` may
        be a traced boolean.

        Args:
            grads_finite: one boolean (Python, numpy or JAX, traced too), e.g.
                `all_finite(grads)`.

        Raises:
            LossScaleTypeError: `grads_finite` is not a boolean: a float (a NaN
                would read as True), an integer (a count of finite values
                would read as True too) or not a number.
            LossScaleError: `grads_finite` is not a scalar (one flag per
                leaf needs `all_finite` to combine them).
        """
        grads_finite = _as_flag(grads_finite, "DynamicLossScale.adjust", "all_finite(grads)")
        one = jnp.ones_like(self.counter)
        # `>=`: a counter restored from elsewhere past `period - 1` still grows.
        grow = self.counter >= self.period - 1
        # The largest power of two float32 holds; a scale already above it stays.
        cap = jnp.maximum(self.loss_scale, jnp.float32(2.0**127))
        grown = jnp.minimum(self.loss_scale * jnp.float32(self.factor), cap)
        finite_scale = jnp.where(grow, grown, self.loss_scale)
        finite_counter = jnp.where(grow, jnp.zeros_like(self.counter), self.counter + one)
        # Never below the floor, and never up to it either: a scale that started
        # below `min_loss_scale` stays where it is rather than grow on an overflow.
        floor = jnp.minimum(self.loss_scale, jnp.float32(self.min_loss_scale))
        # float32 factor: a Python int past int32 (factor=2**40) would not convert.
        shrunk = jnp.maximum(self.loss_scale / jnp.float32(self.factor), floor)
        return self._replace(
            loss_scale=jnp.where(grads_finite, finite_scale, shrunk).astype(jnp.float32),
            counter=jnp.where(grads_finite, finite_counter, jnp.zeros_like(self.counter)),
        )

    def _replace(self, **changes: Any) -> DynamicLossScale:
        children = {"loss_scale": self.loss_scale, "counter": self.counter, **changes}
        return self.tree_unflatten(
            (self.period, self.factor, self.min_loss_scale),
            (children["loss_scale"], children["counter"]),
        )

    def tree_flatten(self) -> tuple[tuple[Any, Any], tuple[int, int | float, float]]:
        return (self.loss_scale, self.counter), (self.period, self.factor, self.min_loss_scale)

    @classmethod
    def tree_unflatten(cls, aux: tuple[int, int | float, float], children: Any) -> DynamicLossScale:
        # Bypass __post_init__: under tracing the children are tracers or
        # placeholders, which must pass through untouched.
        obj = object.__new__(cls)
        for name, value in zip(("loss_scale", "counter"), children, strict=True):
            object.__setattr__(obj, name, value)
        for name, value in zip(("period", "factor", "min_loss_scale"), aux, strict=True):
            object.__setattr__(obj, name, value)
        return obj


def _static_number(value: Any, what: str, example: str) -> int | float:
    """A setting as a finite Python int or float (numpy and concrete JAX scalars too)."""
    if is_tracer(value):
        raise LossScaleTypeError(
            f"{what} is a static setting and cannot be a traced value; pass a Python number "
            f"such as {example}"
        )
    if isinstance(value, bool | np.bool_):
        raise LossScaleTypeError(f"{what} must be a number, got {value!r}; pass e.g. {example}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
    else:
        try:
            arr = np.asarray(value)
        except Exception:  # anything that is not array-like
            arr = np.asarray(None)
        if arr.shape != () or arr.dtype.kind not in "iuf":
            raise LossScaleTypeError(
                f"{what} must be a number, got {type(value).__name__} {value!r}; pass e.g. "
                f"{example}"
            )
        number = float(arr)
        if arr.dtype.kind in "iu":
            return int(arr)
    if not math.isfinite(number):
        raise LossScaleError(f"{what} must be a finite number, got {number!r}; pass e.g. {example}")
    return number


def _as_flag(value: Any, where: str, example: str) -> jax.Array:
    """A scalar boolean, refused unless it is one: floats and integers are not truth-tested.

    `bool(nan)` is True in Python, so a float "flag" holding NaN would read as
    "all finite"; an integer is refused for the same reason: a count such as
    `jnp.sum(jnp.isfinite(g))` is non-zero, so True, while some values are not
    finite. The flag must be a boolean that says so itself.
    """
    arr = value if isinstance(value, jax.Array) else np.asarray(value)
    dtype = np.dtype(arr.dtype)
    if dtype.kind != "b":
        shown = type(value).__name__ if isinstance(value, int | float | complex) else dtype
        raise LossScaleTypeError(
            f"{where} needs a boolean flag, got {shown} {value!r:.80}; pass e.g. {example} "
            "(a comparison or isfinite result: a float NaN or an integer count is not "
            "truth-tested)"
        )
    if arr.shape != ():
        raise LossScaleError(
            f"{where} needs one flag (a scalar), got shape {tuple(arr.shape)}; combine "
            f"per-leaf flags first, e.g. {example}"
        )
    return jnp.asarray(arr)


def _as_scale(value: Any) -> Any:
    if is_tracer(value):
        return value.astype(jnp.float32)
    with jax.ensure_compile_time_eval():  # concrete even inside a jit trace
        kind = getattr(
            np.asarray(value) if isinstance(value, str | bytes) else value, "dtype", None
        )
        if isinstance(value, str | bytes | bool | np.bool_) or (
            kind is not None and np.dtype(kind).kind in "SUOb"
        ):
            raise LossScaleTypeError(
                f"loss_scale must be a number, got {type(value).__name__} {value!r:.80}; "
                "pass e.g. 2.0**15"
            )
        try:
            with np.errstate(over="ignore"):  # past float32: refused just below, by value
                arr = jnp.asarray(value, jnp.float32)
        except (TypeError, ValueError):
            raise LossScaleTypeError(
                f"loss_scale must be a number, got {type(value).__name__} {value!r:.80}; "
                "pass e.g. 2.0**15"
            ) from None
        if arr.shape != ():
            raise LossScaleError(
                f"loss_scale must be a scalar, got shape {arr.shape}; pass one number, e.g. 2.0**15"
            )
        if not bool(jnp.isfinite(arr)) or float(arr) <= 0:
            shown = _shown(value)
            as_f32 = "" if shown == repr(float(arr)) else f" ({float(arr)} in float32)"
            raise LossScaleError(
                f"loss_scale must be a positive finite number in float32, got {shown}{as_f32}; "
                "pass e.g. 2.0**15"
            )
    return arr


def _shown(value: Any) -> str:
    """A scalar setting as the user wrote it (a Python float's repr, not float32's)."""
    try:
        return repr(float(np.asarray(value, np.float64)))
    except (TypeError, ValueError):
        return f"{value!r:.80}"


def _as_counter(value: Any) -> Any:
    if is_tracer(value):
        return value.astype(jnp.int32)
    arr = np.asarray(value)
    if arr.shape != () or arr.dtype.kind not in "iu" or not 0 <= int(arr) < 2**31:
        raise LossScaleError(
            f"counter must be a non-negative integer scalar (finite steps since the last "
            f"change), got {value!r:.80}; pass e.g. counter=0"
        )
    return jnp.asarray(arr, jnp.int32)


def all_finite(tree: Any) -> jax.Array:
    """Whether every floating value in `tree` is finite (a scalar bool array).

    Integer and bool leaves count as finite; Python floats and complex
    numbers are checked like arrays; a `precision.Tensor` is judged by its
    logical values. An empty tree is finite. Jit-safe. Concrete numpy arrays
    and Python numbers are judged in their own precision: a float64 1e300 is
    finite even where 32-bit JAX would hold it as inf.

    Raises:
        LossScaleTypeError: a leaf is not a number (text, an arbitrary object):
            it could hide a NaN from the check.

    Examples:
        >>> bool(all_finite({"a": jnp.ones(3), "b": jnp.int32(7)}))
        True
        >>> bool(all_finite([jnp.ones(3), jnp.array([1.0, jnp.inf])]))
        False
    """
    flags = []
    leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=is_tensor)
    for path, leaf in leaves:
        if is_tensor(leaf):
            from ._tensor import logical_values

            leaf = logical_values(leaf)
        if _concrete_inexact(leaf):
            # Concrete values are judged in their own precision, before JAX would
            # narrow a float64 1e300 to a float32 inf (x64 off) and call it not finite.
            flags.append(jnp.asarray(bool(np.all(np.isfinite(leaf)))))
            continue
        arr = _numeric_leaf(path, leaf, "check")
        if jnp.issubdtype(arr.dtype, jnp.inexact):
            flags.append(jnp.all(jnp.isfinite(arr)))
    if not flags:
        return jnp.asarray(True)
    return jnp.all(jnp.stack(flags))


def select_tree(pred: Any, on_true: Any, on_false: Any) -> Any:
    """Pick `on_true` where the scalar `pred` holds, else `on_false`, leaf by leaf.

    The two trees must have the same structure and leaf dtypes (nothing is
    promoted). Typical use: skip an update whose gradients were not finite.
    `precision.Tensor` leaves of one format select their storage directly.

    `pred` is a boolean scalar. A float or integer predicate is refused
    rather than truth-tested: `bool(nan)` is True, so `select_tree(nan, new,
    old)` would pick `new`, the very update a NaN should have skipped (and
    so would a non-zero count of finite values).

    Values are selected exactly, never narrowed into other numbers: with
    `jax_enable_x64` off, a concrete leaf that 32-bit JAX cannot hold (a
    Python or numpy integer past int32, a finite float64 past float32's range)
    is refused, naming the leaf; float64 values inside the range become
    float32, as anywhere in JAX. Inside `jit` the leaves are already 32-bit.

    Raises:
        LossScaleError: (a `ValueError`) the trees differ in structure or in
            a leaf's shape, `pred` is not a scalar, or a leaf holds a value
            32-bit JAX cannot hold (enable x64, or bring it into range).
        LossScaleTypeError: (a `TypeError`) `pred` is not a boolean, a pair of
            leaves differ in dtype, or a leaf is not a number.

    Examples:
        >>> new = select_tree(jnp.bool_(False), {"w": jnp.ones(2)}, {"w": jnp.zeros(2)})
        >>> new["w"].tolist()
        [0.0, 0.0]
    """
    pred = _as_flag(pred, "select_tree", "all_finite(grads)")
    ta = jax.tree_util.tree_structure(on_true)
    tb = jax.tree_util.tree_structure(on_false)
    if ta != tb:  # type: ignore[operator]  # jaxlib ships no stub for PyTreeDef
        raise LossScaleError(
            f"select_tree needs two trees of one structure, got {ta} and {tb}; pass the new "
            "and the old version of the same tree"
        )

    def one(path: Any, a: Any, b: Any) -> jax.Array:
        _refuse_narrowing(path, a, "select", " of on_true")
        _refuse_narrowing(path, b, "select", " of on_false")
        a = jnp.asarray(_numeric_leaf(path, a, "select"))
        b = jnp.asarray(_numeric_leaf(path, b, "select"))
        if a.shape != b.shape:
            raise LossScaleError(
                f"select_tree: leaf {jax.tree_util.keystr(path) or '<root>'} has shape "
                f"{a.shape} in one tree and {b.shape} in the other; pass the new and the old "
                "version of the same tree (broadcasting would change the leaf's shape)"
            )
        if a.dtype != b.dtype:
            raise LossScaleTypeError(
                f"select_tree: leaf {jax.tree_util.keystr(path) or '<root>'} is {a.dtype} in "
                f"one tree and {b.dtype} in the other; cast one with .astype({a.dtype}) first"
            )
        return jnp.where(pred, a, b)

    return jax.tree_util.tree_map_with_path(one, on_true, on_false)
