"""Asymmetric (zero-point) unsigned integer formats: `uint8`, `uint4`.

A storage encoding. Over each scaling group, with `qmax = 2**bits - 1`:

- calibration `"minmax"`: `lo = min(min(x), 0)`, `hi = max(max(x), 0)` (the
  range always holds 0, so zero is stored exactly);
  `"absmax"`: `lo = -absmax`, `hi = absmax` (a symmetric range).
- `scale = (hi - lo) / qmax` (float32, then rounded to the scaling's scale
  format: float32, bfloat16 or float16); an all-zero group gets scale 1.
  A scale below 2**-126 becomes 2**-126 (XLA on CPU flushes subnormals).
- `inv = 1 / scale` (the stored scale, as float32), computed once per group.
- `zero_point = clip(round_half_even(-lo * inv), 0, qmax)`, stored as uint8.
- `code = clip(round(x * inv) + zero_point, 0, qmax)` under the rounding mode.
- decoding: `(code - zero_point) * scale`.

Codes are packed densely along the last axis (two uint4 codes a byte).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _codec, _packing, _scale_format
from ._codebook import _check_encoded, _packed_nbytes, _prepare
from ._encoded import Encoded
from ._errors import FormatError
from ._formats import Format
from ._rounding import ROUNDING_MODES, round_integer
from ._scaling import PerTensor, Scaling

__all__ = ["AsymmetricIntFormat", "uint4", "uint8"]

CALIBRATIONS = ("minmax", "absmax")


@dataclasses.dataclass(frozen=True)
class AsymmetricIntFormat(Format):
    """Unsigned `bits`-bit codes with a scale and a zero point per group.

    Args:
        bits: 2 to 8.
        calibration: `"minmax"` (the group's range, widened to hold 0) or
            `"absmax"` (the symmetric range `[-absmax, absmax]`).
        scaling: the default scaling (per-tensor when omitted).
        name: display name (default `uint<bits>`, with `_absmax` for absmax).

    Examples:
        >>> import numpy as np
        >>> enc = uint8.encode(np.array([0.0, 1.0, 2.0, 5.1], np.float32))
        >>> enc.data.tolist(), enc.zero_point.tolist(), enc.nbytes
        ([0, 50, 100, 255], [0], 9)
    """

    bits: int
    calibration: str = dataclasses.field(default="minmax", kw_only=True)
    scaling: Scaling | None = dataclasses.field(default=None, kw_only=True)
    name: str = dataclasses.field(default="", kw_only=True, compare=False)

    kind: ClassVar[str] = "uint"

    def __post_init__(self):
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 2 <= self.bits <= 8:
            raise FormatError(
                f"AsymmetricIntFormat({self.bits!r}) is not supported: bits must be an int from "
                "2 to 8; pass e.g. AsymmetricIntFormat(4)"
            )
        if self.calibration not in CALIBRATIONS:
            raise FormatError(
                f"calibration={self.calibration!r} is not known; choose 'minmax' or 'absmax'"
            )
        if not self.name:
            suffix = "" if self.calibration == "minmax" else "_absmax"
            object.__setattr__(self, "name", f"uint{self.bits}{suffix}")

    @property
    def qmax(self) -> int:
        """Largest code, `2**bits - 1`."""
        return (1 << self.bits) - 1

    @property
    def max(self) -> float:
        return float(self.qmax)

    @property
    def container(self) -> np.dtype:
        return np.dtype(np.uint8)

    @property
    def code_bits(self) -> int:
        return self.bits

    def default_scaling(self) -> Scaling:
        return self.scaling if self.scaling is not None else PerTensor()

    def encode(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> Encoded:
        """Encode `x` into codes, scales and zero points (see the module docstring)."""
        x, scaling = _prepare(self, x, scaling, rounding, key, modes=ROUNDING_MODES)
        return _encode_jit(self, scaling, rounding, x, key)

    def decode(self, encoded: Encoded, dtype: Any = np.float32) -> jax.Array:
        """`(code - zero_point) * scale` per group."""
        _check_encoded(self, encoded)
        return _decode_jit(self, encoded, jnp.dtype(dtype))

    def round(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> jax.Array:
        """`decode(encode(x))` as float32, straight-through for gradients."""
        return _codec.storage_round(self, scaling, rounding, x, key)

    def nbytes(self, shape: tuple[int, ...], scaling: Scaling | None = None) -> int:
        """Packed codes, scales at their format's width, and one byte per zero point."""
        shape = tuple(int(n) for n in shape)
        scaling = self.default_scaling() if scaling is None else scaling
        groups = math.prod(scaling.scale_shape(shape)) if shape else 1
        return (
            _packed_nbytes(shape, self.code_bits)
            + _scale_format.scale_nbytes(scaling, shape)
            + groups
        )

    def __repr__(self) -> str:
        return f"AsymmetricIntFormat({self.bits}, calibration={self.calibration!r})"


def _group(scaling: Scaling, x: jax.Array, reduce) -> jax.Array:
    return scaling.group_reduce(x, lambda a, axes: reduce(a, axis=axes, keepdims=True))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _encode_jit(fmt: AsymmetricIntFormat, scaling: Scaling, rounding: str, x, key) -> Encoded:
    scalar = x.ndim == 0
    xs = _codec.flush_subnormals(x.reshape(1) if scalar else x)
    xg = lax.stop_gradient(xs)
    bad = _group(scaling, (~jnp.isfinite(xg)).astype(jnp.float32), jnp.sum) > 0
    if fmt.calibration == "minmax":
        hi = jnp.maximum(_group(scaling, xg, jnp.max), 0)  # zero padding keeps 0 in range
        lo = jnp.minimum(_group(scaling, xg, jnp.min), 0)
    else:
        hi = _group(scaling, jnp.abs(xg), jnp.max)
        lo = -hi
    span = hi - lo
    qmax32 = np.float32(fmt.qmax)
    scale = span / (span * jnp.float32(0) + qmax32)  # a real division, not * (1/qmax)
    scale = jnp.where(span == 0, jnp.float32(1), jnp.maximum(scale, _codec.TINY))
    scale = jnp.where(bad, jnp.float32(jnp.nan), scale)
    stored, _, inv, pre = _scale_format.narrow(xs, scaling, scale, scale, scale, fmt.qmax, 0)
    if scaling.scale_format == "float32":
        s32 = stored
        pre = jnp.where(s32 > np.float32(2.0**100), jnp.float32(2.0**-64), jnp.float32(1))
        inv = jnp.float32(1) / (s32 * pre)
    inv = jnp.where(jnp.isfinite(inv), inv, jnp.float32(0))
    zero_point = jnp.clip(jnp.round(-(lo * pre) * inv), 0, fmt.qmax)
    y = _codec._times_reciprocal(xs, scaling, inv, pre)
    rounded = round_integer(y, rounding, key)
    codes = jnp.clip(rounded + scaling.broadcast(zero_point, xs.shape), 0, fmt.qmax)
    codes = codes.astype(jnp.uint8)
    zero_point = zero_point.astype(jnp.uint8)
    if scalar:
        codes, stored, zero_point = codes.reshape(()), stored.reshape(()), zero_point.reshape(())
    data = codes if fmt.bits == 8 else _packing.pack(codes.reshape(codes.shape or (1,)), fmt.bits)
    last = None if (scalar or fmt.bits == 8) else x.shape[-1]
    return Encoded(data, stored, fmt, scaling, last, zero_point=zero_point)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _decode_jit(fmt: AsymmetricIntFormat, enc: Encoded, dtype) -> jax.Array:
    shape = enc.shape
    if fmt.bits == 8:
        codes = enc.data
    else:
        codes = _packing.unpack(enc.data, fmt.bits, shape[-1] if shape else 1, signed=False)
        codes = codes.reshape(shape)
    assert enc.scale is not None  # asymmetric codes always have scales and zero points
    assert enc.scaling is not None
    assert enc.zero_point is not None
    scale = _scale_format.widen(enc.scale, None, enc.scaling, 0)
    zp = enc.zero_point.astype(jnp.float32)
    if shape:
        scale = enc.scaling.broadcast(scale, shape)
        zp = enc.scaling.broadcast(zp, shape)
    return ((codes.astype(jnp.float32) - zp) * scale).astype(dtype)


uint8 = AsymmetricIntFormat(8)
"""uint8: codes 0..255 with a scale and a zero point per group (min/max calibration)."""
uint4 = AsymmetricIntFormat(4)
"""uint4: codes 0..15, two a byte, with a scale and a zero point per group (min/max)."""
