"""Scaling schemes: how a tensor is cut into groups that share one float32 scale.

A scaling is a frozen, hashable value object; it never holds data. The group
arithmetic (absmax per group, broadcasting a scale back over its group) lives
here too so that encode and decode share one definition of a "group".
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax.numpy as jnp
import numpy as np
from jax import lax

from ._errors import ScalingError

__all__ = ["SCALE_FORMATS", "PerAxis", "PerBlock", "PerTensor", "Scaling"]

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


def _check_scale_format(scaling) -> None:
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
        raise ScalingError(
            f"{kind}(scale_format='float8_e8m0fnu') needs power_of_two=True: E8M0 holds only "
            f"powers of two (the OCP MX rule); pass {kind}(..., power_of_two=True, "
            "scale_format='float8_e8m0fnu')"
        )
    if key == "float8_e4m3fn" and scaling.power_of_two:
        raise ScalingError(
            f"{kind}(scale_format='float8_e4m3fn', power_of_two=True): e4m3 block scales follow "
            "the two-level NVFP4 recipe (absmax scales under a float32 tensor scale), not powers "
            "of two; drop power_of_two, or store powers of two as 'float8_e8m0fnu'"
        )


def _scale_note(scaling) -> str:
    fmt = scaling.scale_format
    if fmt == "float32":
        return ""
    if fmt == "float8_e4m3fn":
        return ", float8_e4m3fn scales under a float32 tensor scale"
    return f", {fmt} scales"


def _as_int(value, what: str, example: str) -> int:
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


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Base class of the scaling schemes (not instantiated directly)."""

    power_of_two: bool = dataclasses.field(default=False, kw_only=True)
    scale_format: str = dataclasses.field(default="float32", kw_only=True)

    def __post_init__(self):
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

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the scale array kept for a tensor of logical `shape`."""
        raise NotImplementedError

    def group_reduce(self, x: jnp.ndarray, reduce) -> jnp.ndarray:
        """Apply `reduce(array, axes)` (keeping dims) over every group.

        The result has `scale_shape(x.shape)`.
        """
        raise NotImplementedError

    def broadcast(self, scale: jnp.ndarray, shape: tuple[int, ...]) -> jnp.ndarray:
        """Expand a per-group array back to the logical `shape`."""
        return jnp.broadcast_to(scale, shape)

    def validate(self, shape: tuple[int, ...]) -> None:
        """Raise `ScalingError` (a `ValueError`) if this scaling cannot apply to `shape`."""

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
        return (1,) * len(shape)

    def group_reduce(self, x, reduce):
        return reduce(x, tuple(range(x.ndim)))

    def describe(self) -> str:
        return "per-tensor" + (", power of two" if self.power_of_two else "") + _scale_note(self)


@dataclasses.dataclass(frozen=True)
class PerAxis(Scaling):
    """One scale per index along `axis` (per channel / per row).

    Examples:
        >>> PerAxis(0).scale_shape((3, 4))
        (3, 1)
    """

    axis: int = 0

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "axis", _as_int(self.axis, "PerAxis axis", "PerAxis(0)"))

    def _axis(self, ndim: int) -> int:
        return self.axis % ndim

    def validate(self, shape):
        if not shape or not -len(shape) <= self.axis < len(shape):
            raise ScalingError(
                f"PerAxis(axis={self.axis}) does not fit a tensor of shape {tuple(shape)}; "
                f"choose an axis in [-{len(shape)}, {len(shape) - 1}] or use PerTensor()"
            )

    def scale_shape(self, shape):
        self.validate(shape)
        a = self._axis(len(shape))
        return tuple(n if i == a else 1 for i, n in enumerate(shape))

    def group_reduce(self, x, reduce):
        self.validate(x.shape)
        a = self._axis(x.ndim)
        return reduce(x, tuple(i for i in range(x.ndim) if i != a))

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

    def __post_init__(self):
        super().__post_init__()
        size = _as_int(self.size, "PerBlock size", "PerBlock(32)")
        if size < 1:
            raise ScalingError(
                f"PerBlock size must be at least 1, got {size}; pass e.g. PerBlock(32)"
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

    def validate(self, shape):
        if not shape or not -len(shape) <= self.axis < len(shape):
            raise ScalingError(
                f"PerBlock(axis={self.axis}) does not fit a tensor of shape {tuple(shape)}; "
                f"choose an axis in [-{len(shape)}, {len(shape) - 1}] or use PerTensor()"
            )

    def _axis(self, ndim: int) -> int:
        return self.axis % ndim

    def scale_shape(self, shape):
        self.validate(shape)
        a = self._axis(len(shape))
        # integer ceiling division: n / size in floats is inexact past 2**53
        return tuple(-(-n // self.size) if i == a else n for i, n in enumerate(shape))

    def group_reduce(self, x, reduce):
        self.validate(x.shape)
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

    def broadcast(self, scale, shape):
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


def group_sizes(scaling: Scaling, shape: tuple[int, ...]) -> jnp.ndarray:
    """Number of real (unpadded) elements in each group, shaped like the scale.

    Counted with Python integers from the static shape (a float32 sum of ones
    stops counting at 2**24), then given as float32.
    """
    shape = tuple(shape)
    scale_shape = scaling.scale_shape(shape)
    total = math.prod(shape)
    if isinstance(scaling, PerBlock) and shape:
        a = scaling._axis(len(shape))
        n = shape[a]
        size = scaling._block(n)
        counts = np.full(scale_shape[a], size, np.float64)  # one block is one group
        if counts.size and n % size:
            counts[-1] = n % size
        bshape = [1] * len(shape)
        bshape[a] = scale_shape[a]
        counts = np.broadcast_to(counts.reshape(bshape), scale_shape)
    else:
        groups = math.prod(scale_shape)
        counts = np.full(scale_shape, total // groups if groups else 0, np.float64)
    return jnp.asarray(counts.astype(np.float32))
