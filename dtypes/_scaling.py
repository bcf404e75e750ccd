"""Scaling schemes: how a tensor is cut into groups that share one float32 scale.

A scaling is a frozen, hashable value object; it never holds data. The group
arithmetic (reducing over each group, broadcasting a scale back over its
group) lives here too so that encode and decode share one definition of a
"group"; it imports JAX when first called, so building a scaling (as the
registry does at `import dtypes`) loads no JAX. The bytes a scaling's scales
take (`scale_dtype`, `scale_nbytes`) are here as well; how scales are computed
and stored is in `_scale_rules` and `_scale_storage`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from ._errors import PrecisionTypeError, ScalingError, ShapeError

if TYPE_CHECKING:
    import jax

    # `reduce(array, axes)`: a reduction over `axes` that keeps the reduced dims.
    Reduce = Callable[[jax.Array, tuple[int, ...]], jax.Array]

__all__ = [
    "SCALE_FORMATS",
    "PerAxis",
    "PerBlock",
    "PerTensor",
    "Scaling",
    "scale_dtype",
    "scale_nbytes",
    "shape_of",
    "two_level",
]

SCALE_FORMATS = ("float32", "float8_e8m0fnu", "float8_e4m3fn", "bfloat16", "float16")
"""Formats a scaling may store its scales in (see `Scaling.scale_format`)."""

_SCALE_ALIASES = {
    "f32": "float32",
    "fp32": "float32",
    "e8m0": "float8_e8m0fnu",
    "float8_e8m0": "float8_e8m0fnu",
    "e4m3": "float8_e4m3fn",
    "e4m3fn": "float8_e4m3fn",
    "bf16": "bfloat16",
    "f16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def _check_scale_format(scaling: Scaling) -> None:
    """Normalise `scaling.scale_format` to a name in `SCALE_FORMATS`, or raise."""
    given = scaling.scale_format
    name = getattr(given, "name", given)  # a dtypes format object is accepted by name
    key = name.strip().lower().replace("-", "_") if isinstance(name, str) else None
    if key is not None:
        key = _SCALE_ALIASES.get(key, key)
    if key not in SCALE_FORMATS:
        raise ScalingError(
            f"scale_format={given!r} is not a format scales can be stored in; choose one of "
            f"{', '.join(SCALE_FORMATS)}"
        )
    object.__setattr__(scaling, "scale_format", key)
    kind = type(scaling).__name__
    if key == "float8_e8m0fnu" and not scaling.power_of_two:
        rule = "E8M0 holds only powers of two (the OCP MX rule)"
        raise ScalingError(
            f"{kind}(scale_format='float8_e8m0fnu') needs power_of_two=True: {rule}; pass "
            f"{kind}(..., power_of_two=True, scale_format='float8_e8m0fnu')",
            rule=rule,
        )
    if key == "float8_e4m3fn" and scaling.power_of_two:
        rule = (
            "e4m3 block scales follow the two-level NVFP4 recipe (absmax scales under a float32 "
            "tensor scale), not powers of two"
        )
        raise ScalingError(
            f"{kind}(scale_format='float8_e4m3fn', power_of_two=True): {rule}; drop "
            "power_of_two, or store powers of two as 'float8_e8m0fnu'",
            rule=rule,
        )


def _scale_note(scaling: Scaling) -> str:
    fmt = scaling.scale_format
    if fmt == "float32":
        return ""
    if fmt == "float8_e4m3fn":
        return ", float8_e4m3fn scales under a float32 tensor scale"
    return f", {fmt} scales"


def _as_int(value: object, what: str, example: str) -> int:
    """`value` as a Python int: ints and numpy integers pass, bools and floats do not.

    A float axis or block size would be silently truncated somewhere (or make
    a scaling that `save` writes and `load` refuses); a bool is an int to
    Python but never what was meant.
    """
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise ScalingError(
            f"{what} must be an int, got {type(value).__name__} {value!r}; pass e.g. {example}"
        )
    return int(value)


def shape_of(shape: Any) -> tuple[int, ...]:
    """`shape` as a tuple of Python ints, or a `ShapeError` saying what is wrong."""
    try:
        if isinstance(shape, str | bytes):
            raise TypeError
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(
            f"a shape is a tuple of non-negative ints, got {type(shape).__name__} {shape!r}; "
            "pass e.g. (1024, 1024)"
        ) from None
    for d in dims:
        if isinstance(d, bool | np.bool_) or not isinstance(d, numbers.Integral) or d < 0:
            raise ShapeError(
                f"a shape is a tuple of non-negative ints, got {dims!r} (the dimension {d!r} "
                "is not); pass e.g. (1024, 1024)"
            )
    return tuple(int(d) for d in dims)


def _array_shape(x: Any, what: str) -> tuple[int, ...]:
    """The shape of array `x` (a JAX or numpy array, or a tracer), or a `PrecisionTypeError`."""
    shape = getattr(x, "shape", None)
    if not isinstance(shape, tuple) or not hasattr(x, "dtype"):
        raise PrecisionTypeError(
            f"{what} takes an array, got {type(x).__name__} {x!r:.60}; pass e.g. jnp.ones((4, 32))"
        )
    return shape


def _group_input(x: Any, reduce: Any, what: str) -> tuple[int, ...]:
    """The shape of `group_reduce`'s array, once it is a numeric array and `reduce` a
    function."""
    shape = _array_shape(x, what)
    if np.dtype(x.dtype).kind in "OUS" or not callable(reduce):
        bad = f"dtype {x.dtype}" if callable(reduce) else f"reduce={reduce!r:.40}"
        raise PrecisionTypeError(
            f"{what} takes a numeric array and a function reduce(array, axes), got {bad}; "
            "pass e.g. (jnp.ones((4, 32)), lambda a, axes: jnp.max(a, axes, keepdims=True))"
        )
    return shape


# XLA counts an array's bytes in 64 bits and aborts the process past that, so a
# shape is refused before any array of it is asked for (8 bytes an element at most).
_MAX_ELEMENTS = 2**60


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Base class of the scaling schemes: build `PerTensor`, `PerAxis` or `PerBlock`."""

    power_of_two: bool = dataclasses.field(default=False, kw_only=True)
    scale_format: str = dataclasses.field(default="float32", kw_only=True)

    def __post_init__(self) -> None:
        if type(self) is Scaling:
            raise ScalingError(
                "Scaling is the base class of the scaling schemes and groups nothing itself; "
                "pass PerTensor(), PerAxis(0) or PerBlock(32)"
            )
        _check_scale_format(self)
        # Validated here, at construction, so a scaling that exists is one
        # every encoder, `save` and `load` accept alike.
        p = self.power_of_two
        if not isinstance(p, bool | np.bool_):
            raise ScalingError(
                f"power_of_two must be True or False, got {type(p).__name__} {p!r}; "
                f"pass e.g. {type(self).__name__}(power_of_two=True)"
            )
        object.__setattr__(self, "power_of_two", bool(p))

    @property
    def two_level(self) -> bool:
        """Whether the scales are e4m3 under one float32 tensor scale (NVFP4's two levels).

        Such an encoding holds a `tensor_scale` beside its block scales.

        Examples:
            >>> PerBlock(16, scale_format="float8_e4m3fn").two_level, PerBlock(16).two_level
            (True, False)
        """
        return self.scale_format == "float8_e4m3fn"

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the scale array kept for a tensor of logical `shape`."""
        raise NotImplementedError

    def group_reduce(self, x: jax.Array, reduce: Reduce) -> jax.Array:
        """Apply `reduce(array, axes)` (keeping dims) over every group.

        The result has `scale_shape(x.shape)`.
        """
        raise NotImplementedError

    def broadcast(self, scale: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """Expand a per-group array back to the logical `shape`."""
        import jax.numpy as jnp  # on first use: building a scaling loads no JAX

        scale, shape = self._fitted_scale(scale, shape)
        return jnp.broadcast_to(scale, shape)

    def _fitted_scale(self, scale: Any, shape: Any) -> tuple[jax.Array, tuple[int, ...]]:
        """`broadcast`'s arguments checked: `scale` shaped `scale_shape(shape)` (one scale
        may be held as any one-element array), and an array of `shape` XLA can make."""
        shape = shape_of(shape)
        got = _array_shape(scale, f"{type(self).__name__}.broadcast")
        if math.prod(shape) >= _MAX_ELEMENTS:
            raise ShapeError(
                f"cannot broadcast scales to shape {shape}: {math.prod(shape)} elements, past the "
                f"2**60 an array can hold; pass the shape of the tensor the scales belong to"
            )
        want = self.scale_shape(shape) if shape else ()
        if got != want:
            if math.prod(got) != 1 or math.prod(want) != 1:
                raise ScalingError(
                    f"{self} keeps scales of shape {want} for a tensor of shape {shape}, got "
                    f"scales of shape {got}; pass scales shaped scaling.scale_shape(shape)"
                )
            scale = scale.reshape(want)
        return scale, shape

    def validate(self, shape: tuple[int, ...]) -> None:
        """Raise `ScalingError` (a `ValueError`) if this scaling cannot apply to `shape`.

        A `shape` that is not a tuple of non-negative ints raises `ShapeError`.
        """
        shape_of(shape)

    def refit(self, shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> Scaling:
        """The scaling that groups a tensor of `shape` whose scales have `scale_shape`.

        `self` when it already does. `jax.vmap` and `lax.scan` take axes from
        (or add axes to) an encoding's arrays without telling its scaling:
        one layer of a `PerAxis(0)` stack is `PerTensor`, a `PerTensor`
        encoding made per example under `vmap` is `PerAxis(0)` of the batch.
        Scales that equal the shape or 1 along each axis are `PerAxis` of the
        axes that keep them (`PerTensor` if none); blocks move to the axis
        whose scale count they match, the one before theirs first. Where no
        scaling fits, `self` (the encoding's own check then says why).
        """
        return self._refit(shape_of(shape), shape_of(scale_shape))

    def _refit(self, shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> Scaling:
        """`refit` of shapes known to be tuples (`Encoded`'s unflatten: no checks there)."""
        try:
            if self.scale_shape(shape) == scale_shape:
                return self
        except ScalingError:
            pass
        if len(scale_shape) != len(shape) or not shape:
            return self
        return _refitted(self, shape, scale_shape) or self

    def tensor_scale_fits(self, ts_shape: tuple[int, ...], shape: tuple[int, ...]) -> bool:
        """Whether a two-level tensor scale of `ts_shape` fits an encoding of `shape`.

        One float32 for the whole tensor (shape `()`), or, for a stack, one per
        index of some axes: as many dims as the tensor, each 1 or the tensor's
        own (a `(layers, rows, cols)` stack encoded one layer at a time under
        `jax.vmap` holds `(layers, 1, 1)`), so it broadcasts over the scales.

        Examples:
            >>> nv = PerBlock(16, scale_format="float8_e4m3fn")
            >>> nv.tensor_scale_fits((), (4, 8, 32)), nv.tensor_scale_fits((4, 1, 1), (4, 8, 32))
            (True, True)
            >>> nv.tensor_scale_fits((4,), (4, 8, 32))
            False
        """
        ts_shape, shape = shape_of(ts_shape), shape_of(shape)
        if not ts_shape:
            return True
        pairs = zip(ts_shape, shape, strict=False)
        return len(ts_shape) == len(shape) and all(t in (1, n) for t, n in pairs)

    def __str__(self) -> str:
        return self.describe()

    def describe(self) -> str:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class PerTensor(Scaling):
    """One scale for the whole tensor.

    Examples:
        >>> PerTensor().scale_shape((3, 4))
        (1, 1)
    """

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (1,) * len(shape_of(shape))

    def group_reduce(self, x: jax.Array, reduce: Reduce) -> jax.Array:
        return reduce(x, tuple(range(len(_group_input(x, reduce, "PerTensor.group_reduce")))))

    def describe(self) -> str:
        return "per-tensor" + (", power of two" if self.power_of_two else "") + _scale_note(self)


def _refitted(
    scaling: Scaling, shape: tuple[int, ...], scale_shape: tuple[int, ...]
) -> Scaling | None:
    """See `Scaling.refit`: a scaling of another axis (or axes) fitting the shapes."""
    options = {f.name: getattr(scaling, f.name) for f in dataclasses.fields(Scaling)}
    if isinstance(scaling, PerTensor | PerAxis):
        if any(g not in (1, n) for g, n in zip(scale_shape, shape, strict=True)):
            return None
        kept = tuple(d for d, n in enumerate(shape) if scale_shape[d] == n != 1)
        if not kept:
            return PerTensor(**options)
        return PerAxis(kept[0] if len(kept) == 1 else kept, **options)
    if isinstance(scaling, PerBlock):
        # an axis taken before the block axis moves it down one, an axis added up one
        ndim, a = len(shape), scaling.axis
        near = [a - 1, a + 1] if a >= 0 else [a % ndim - 1, a % ndim + 1]
        for axis in dict.fromkeys([*near, *range(ndim)]):
            if 0 <= axis < ndim:
                candidate = PerBlock(scaling.size, axis=axis, **options)
                if candidate.scale_shape(shape) == scale_shape:
                    return candidate
    return None


def _refuse_scalar(scaling: Scaling, shape: tuple[int, ...]) -> None:
    if not shape:
        raise ScalingError(
            f"{type(scaling).__name__}(axis={scaling.axis}) needs an axis, and a 0-d value "  # type: ignore[attr-defined]
            "(shape ()) has none; use PerTensor(), or encode an array of at least one axis"
        )


@dataclasses.dataclass(frozen=True)
class PerAxis(Scaling):
    """One scale per index along `axis` (per channel / per row), or along several axes.

    `axis` is an int, or a tuple of distinct ints for one scale per index of
    each: `PerAxis((0, -1))` of a stack of `(layers, in, out)` kernels keeps a
    scale per layer and output channel, and `PerAxis(0)` one per layer. A stack
    scaled so maps under `jax.vmap` and `lax.scan` over its layers (each slice
    keeps its own scales); `PerTensor()` or `PerAxis(-1)` share scales across
    the stack and do not.

    Examples:
        >>> PerAxis(0).scale_shape((3, 4))
        (3, 1)
        >>> PerAxis((0, -1)).scale_shape((2, 3, 4))
        (2, 1, 4)
    """

    axis: int | tuple[int, ...] = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        given = self.axis
        if not isinstance(given, tuple | list):
            object.__setattr__(self, "axis", _as_int(given, "PerAxis axis", "PerAxis(0)"))
            return
        axes = tuple(_as_int(a, "each PerAxis axis", "PerAxis((0, -1))") for a in given)
        if len(axes) < 2:
            raise ScalingError(
                f"PerAxis(axis={given!r}) names {len(axes)} axis: pass an int for one axis "
                "(PerAxis(0)), a tuple of two or more for several (PerAxis((0, -1))), or "
                "PerTensor() for one scale"
            )
        if len(set(axes)) != len(axes):
            raise ScalingError(
                f"PerAxis(axis={given!r}) names an axis twice; name each axis once, "
                "e.g. PerAxis((0, -1))"
            )
        object.__setattr__(self, "axis", axes)

    @property
    def axes(self) -> tuple[int, ...]:
        """The axes that keep a scale per index, as given (one or more)."""
        return self.axis if isinstance(self.axis, tuple) else (self.axis,)

    def kept(self, ndim: int) -> tuple[int, ...]:
        """The axes with a scale per index, in `[0, ndim)` and ascending."""
        n = _as_int(ndim, "PerAxis.kept's ndim", "PerAxis(0).kept(2)")
        self._refuse_axes(n, f"a {n}-d tensor")
        return tuple(sorted(a % n for a in self.axes))

    def validate(self, shape: tuple[int, ...]) -> None:
        shape = shape_of(shape)
        _refuse_scalar(self, shape)
        self._refuse_axes(len(shape), f"a tensor of shape {shape}")

    def _refuse_axes(self, n: int, what: str) -> None:
        if n < 1 or not all(-n <= a < n for a in self.axes):
            raise ScalingError(
                f"PerAxis(axis={self.axis}) does not fit {what}; "
                + (f"choose axes in [-{n}, {n - 1}] or use PerTensor()" if n else "use PerTensor()")
            )
        if len({a % n for a in self.axes}) != len(self.axes):
            raise ScalingError(
                f"PerAxis(axis={self.axis}) names one axis of {what} twice; name each axis once"
            )

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        shape = shape_of(shape)
        _refuse_scalar(self, shape)
        kept = self.kept(len(shape))
        return tuple(n if i in kept else 1 for i, n in enumerate(shape))

    def group_reduce(self, x: jax.Array, reduce: Reduce) -> jax.Array:
        shape = _group_input(x, reduce, "PerAxis.group_reduce")
        self.validate(shape)
        kept = self.kept(len(shape))
        return reduce(x, tuple(i for i in range(len(shape)) if i not in kept))

    def describe(self) -> str:
        return (
            f"per-axis {self.axis}"
            + (", power of two" if self.power_of_two else "")
            + _scale_note(self)
        )


@dataclasses.dataclass(frozen=True)
class PerBlock(Scaling):
    """One scale per block of `size` consecutive elements along `axis`.

    A last, partial block is allowed: it is scaled by its own absmax. With
    `power_of_two=True` and `size=32` this is the OCP microscaling layout.

    Examples:
        >>> PerBlock(32).scale_shape((4, 100))
        (4, 4)
    """

    size: int = 32
    axis: int = -1

    def __post_init__(self) -> None:
        super().__post_init__()
        size = _as_int(self.size, "PerBlock size", "PerBlock(32)")
        if size < 1:
            raise ScalingError(
                f"PerBlock size must be at least 1, got {size}; pass e.g. PerBlock(32)",
                rule=f"a block holds at least 1 value, got a size of {size}",
            )
        object.__setattr__(self, "size", size)
        object.__setattr__(
            self, "axis", _as_int(self.axis, "PerBlock axis", "PerBlock(32, axis=-1)")
        )

    def _block(self, n: int) -> int:
        """The block length used on an axis of length `n`.

        A block longer than the axis is one block of the whole axis: padding
        to `size` would allocate `size` elements for nothing (or fail for a
        size like 2**64).
        """
        return max(1, min(self.size, n))

    def validate(self, shape: tuple[int, ...]) -> None:
        shape = shape_of(shape)
        _refuse_scalar(self, shape)
        if not -len(shape) <= self.axis < len(shape):
            raise ScalingError(
                f"PerBlock(axis={self.axis}) does not fit a tensor of shape {tuple(shape)}; "
                f"choose an axis in [-{len(shape)}, {len(shape) - 1}] or use PerTensor()"
            )

    def _axis(self, ndim: int) -> int:
        return self.axis % ndim

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        shape = shape_of(shape)
        self.validate(shape)
        a = self._axis(len(shape))
        # integer ceiling division: n / size in floats is inexact past 2**53
        return tuple(-(-n // self.size) if i == a else n for i, n in enumerate(shape))

    def group_reduce(self, x: jax.Array, reduce: Reduce) -> jax.Array:
        import jax.numpy as jnp  # on first use: building a scaling loads no JAX

        self.validate(_group_input(x, reduce, "PerBlock.group_reduce"))
        a = self._axis(x.ndim)
        n = x.shape[a]
        size = self._block(n)
        nblocks = -(-n // size)
        pad = nblocks * size - n
        if pad:
            # Zero padding never changes an absmax or a mean of |x| over the real
            # elements' sum; callers that need a count use `block_counts`.
            widths = [(0, 0)] * x.ndim
            widths[a] = (0, pad)
            x = jnp.pad(x, widths)
        blocked = x.reshape((*x.shape[:a], nblocks, size, *x.shape[a + 1 :]))
        return reduce(blocked, (a + 1,)).reshape(
            self.scale_shape((*x.shape[:a], n, *x.shape[a + 1 :]))
        )

    def broadcast(self, scale: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        import jax.numpy as jnp  # on first use: building a scaling loads no JAX
        from jax import lax

        scale, shape = self._fitted_scale(scale, shape)
        # A reshape of a broadcast, not jnp.repeat: XLA fuses it into the
        # elementwise kernel as index arithmetic (repeat becomes a gather).
        a = self._axis(len(shape))
        nblocks = scale.shape[a]
        size = self._block(shape[a])
        full = jnp.broadcast_to(
            jnp.expand_dims(scale, a + 1), (*shape[:a], nblocks, size, *shape[a + 1 :])
        ).reshape((*shape[:a], nblocks * size, *shape[a + 1 :]))
        if nblocks * size != shape[a]:  # a last, partial block
            full = lax.slice_in_dim(full, 0, shape[a], axis=a)
        return full

    def describe(self) -> str:
        return (
            f"per-block {self.size} on axis {self.axis}"
            + (", power of two" if self.power_of_two else "")
            + _scale_note(self)
        )


_SCALE_DTYPES: dict[str, np.dtype[Any]] = {
    "float32": np.dtype(np.float32),
    "float8_e8m0fnu": np.dtype(ml_dtypes.float8_e8m0fnu),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}


def scale_dtype(scaling: Scaling) -> np.dtype[Any]:
    """numpy dtype of the stored scale array of `scaling`.

    Examples:
        >>> scale_dtype(PerBlock(32, power_of_two=True, scale_format="e8m0"))
        dtype(float8_e8m0fnu)
    """
    return _SCALE_DTYPES[scaling.scale_format]


def two_level(scaling: Scaling | None) -> bool:
    """Whether `scaling` keeps a float32 tensor scale above its block scales
    (`Scaling.two_level`; False for no scaling)."""
    return scaling is not None and scaling.two_level


def scale_nbytes(scaling: Scaling, shape: tuple[int, ...]) -> int:
    """Bytes of the scales an encoding of `shape` holds (tensor scale included)."""
    scale_shape = scaling.scale_shape(shape) if shape else ()
    count = math.prod(int(n) for n in scale_shape)
    return count * scale_dtype(scaling).itemsize + (4 if two_level(scaling) else 0)
