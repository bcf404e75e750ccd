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

The class needs only numpy; its operations are computed in its codec,
`_asymmetric_codec`, which `Format`'s methods import on first use.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from ._argument_checks import check_format_fields, check_scaling_field, resolve_scaling
from ._errors import FormatError
from ._format import Format, packed_nbytes
from ._scaling import PerTensor, Scaling, scale_nbytes, shape_of

__all__ = ["CALIBRATIONS", "AsymmetricIntFormat", "uint4", "uint8"]

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
    _codec: ClassVar[str] = "_asymmetric_codec"

    def __post_init__(self) -> None:
        check_scaling_field(self, self.scaling)
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 2 <= self.bits <= 8:
            raise FormatError(
                f"AsymmetricIntFormat({self.bits!r}) is not supported: bits must be an int from "
                "2 to 8; pass e.g. AsymmetricIntFormat(4)"
            )
        if self.calibration not in CALIBRATIONS:
            raise FormatError(
                f"calibration={self.calibration!r} is not known; choose 'minmax' or 'absmax'"
            )
        check_format_fields(self, f"AsymmetricIntFormat({self.bits})")
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

    def nbytes(self, shape: tuple[int, ...], scaling: Scaling | None = None) -> int:
        """Packed codes, scales at their format's width, and one byte per zero point."""
        shape = shape_of(shape)
        scaling = resolve_scaling(self, scaling)
        assert scaling is not None  # a default scaling, always
        groups = math.prod(scaling.scale_shape(shape)) if shape else 1
        return packed_nbytes(shape, self.code_bits) + scale_nbytes(scaling, shape) + groups

    def __repr__(self) -> str:
        return f"AsymmetricIntFormat({self.bits}, calibration={self.calibration!r})"


uint8 = AsymmetricIntFormat(8)
"""uint8: codes 0..255 with a scale and a zero point per group (min/max calibration)."""
uint4 = AsymmetricIntFormat(4)
"""uint4: codes 0..15, two a byte, with a scale and a zero point per group (min/max)."""
