"""The named encodings beyond the element formats: the objects themselves.

The registry (`_registry`) lists each of them in `ENCODINGS`. They are:

- ml_dtypes' element layouts that `FORMATS` does not list
  (`float4_e2m1fn`, `float6_e2m3fn`, `float6_e3m2fn`, `float8_e4m3`,
  `float8_e3m4`), defined here, and the E8M0 scale format `float8_e8m0fnu`
  (`_e8m0`);
- the OCP MX v1.0 and NVFP4 compositions, defined here. A composition is an
  ordinary format that carries its scaling in its `scaling` field:
  `encode(x)`, `round(x)` and `nbytes(shape)` with no scaling use it, and
  equality covers it (`mxfp4 != float4_e2m1fn`, though both hold e2m1 codes);
- the storage encodings `nf4` (code book, `_codebook`) and `uint8`/`uint4`
  (zero point, `_asymmetric`).
"""

from __future__ import annotations

from ._float import FloatFormat
from ._int import IntFormat
from ._scaling import PerBlock

__all__ = [
    "MX_BLOCK",
    "NVFP4_BLOCK",
    "float4_e2m1fn",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float8_e3m4",
    "float8_e4m3",
    "mxfp4",
    "mxfp6_e2m3",
    "mxfp6_e3m2",
    "mxfp8_e4m3",
    "mxfp8_e5m2",
    "mxint8",
    "nvfp4",
]

MX_BLOCK = PerBlock(32, power_of_two=True, scale_format="float8_e8m0fnu")
"""OCP MX scaling: blocks of 32 along the last axis, E8M0 scales by the MX rule."""
NVFP4_BLOCK = PerBlock(16, scale_format="float8_e4m3fn")
"""NVFP4 scaling: blocks of 16, e4m3 scales under one float32 tensor scale."""

float4_e2m1fn = FloatFormat(2, 1, finite=True)
float6_e2m3fn = FloatFormat(2, 3, finite=True)
float6_e3m2fn = FloatFormat(3, 2, finite=True)
float8_e4m3 = FloatFormat(4, 3)
float8_e3m4 = FloatFormat(3, 4)

mxfp8_e4m3 = FloatFormat(4, 3, finite=True, scaling=MX_BLOCK, name="mxfp8_e4m3")
mxfp8_e5m2 = FloatFormat(5, 2, scaling=MX_BLOCK, name="mxfp8_e5m2")
mxfp6_e3m2 = FloatFormat(3, 2, finite=True, scaling=MX_BLOCK, name="mxfp6_e3m2")
mxfp6_e2m3 = FloatFormat(2, 3, finite=True, scaling=MX_BLOCK, name="mxfp6_e2m3")
mxfp4 = FloatFormat(2, 1, finite=True, scaling=MX_BLOCK, name="mxfp4")
mxint8 = IntFormat(8, scaling=MX_BLOCK, name="mxint8")
nvfp4 = FloatFormat(2, 1, finite=True, scaling=NVFP4_BLOCK, name="nvfp4")
