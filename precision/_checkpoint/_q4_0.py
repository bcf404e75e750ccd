"""Q4_0's grid: ggml's block of 32 values with a signed float16 scale, and ggml's rounding.

ggml's Q4_0 holds, per block of 32 values, codes 0..15 standing for -8..7 times a float16
scale `d`, which ggml's quantizer sets to `d = max / -8`, `max` the block's value of
largest magnitude: that value is code -8 exactly and the other side reaches `7 |d|`, one
level more than this library's int4 (-7..7 times `absmax / 7`) and a step 7/8 as wide. As
this library's `uint4` with a zero point the same numbers are `|d| * (q - z)`: `z = 8`
where `max < 0`, and `z = 7` with the codes mirrored (`q -> 15 - q`) where `max > 0`.

Two users: `calibrate(format="q4_0")` rounds onto that grid (GPTQ with `rule` as each
group's scale rule, AWQ and round-to-nearest with `encode`), and `precision convert
--layout gguf` rounds a float weight written as Q4_0 with `encode`, code for code as
ggml's own quantizer. Either gives a uint4 encoding in blocks of 32 with float16 scales
and zero points 7 or 8, which the GGUF writer turns back into Q4_0's bytes, the zero
points into the sign of `d` (`_gguf.block_bytes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import dtypes

__all__ = ["FORMAT", "NAME", "SCALING", "decoded", "encode", "grid_codes", "is_q4_0", "rule"]

NAME = "q4_0"
#: The format calibration is told (a uint4 named q4_0: its groups are ruled here).
FORMAT = dtypes.AsymmetricIntFormat(4, name=NAME)
#: Q4_0's only scaling: blocks of 32 with float16 scales (placed along the inputs).
SCALING = dtypes.PerBlock(32, scale_format="float16")


def is_q4_0(fmt: Any) -> bool:
    return isinstance(fmt, dtypes.AsymmetricIntFormat) and fmt.name == NAME


def rule(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stored float16 scale, its value, zero point) of each row of one block `cols`:
    ggml's `d = max / -8` in float32, stored as float16, as `|d|` and a zero point."""
    x = np.asarray(cols, np.float32)
    rows = np.arange(x.shape[0])
    signed = x[rows, np.argmax(np.abs(x), axis=1)]  # the first of largest magnitude
    d = (signed / np.float32(-8)).astype(np.float16)
    stored = np.abs(d)
    zero = np.where(signed > 0, 7.0, 8.0)
    empty = stored == 0  # an all-zero block (or one that rounds to zero): scale 1, code 8
    stored = np.where(empty, np.float16(1), stored)
    zero = np.where(empty, 8.0, zero)
    return stored, stored.astype(np.float64), zero


def _blocks(w: np.ndarray, axis: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """`w` as (groups, 32) rows: blocks of 32 along `axis`, and the moved shape."""
    moved = np.moveaxis(np.asarray(w, np.float32), axis, -1)
    return moved.reshape(-1, 32), moved.shape


def grid_codes(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes 0..15 in `w`'s shape, float16 scales, zero points 7 or 8 per block) of `w`
    rounded to nearest on Q4_0's grid in blocks of 32 along `axis`, code for code as
    ggml's quantizer rounds: with the float32 `d` before it is stored (`x * (1 / d) +
    8.5`, truncated, at most 15). `w` is finite; `axis` a multiple of 32 long."""
    blocks, shape = _blocks(w, axis)
    stored, _, zero = rule(blocks)
    rows = np.arange(blocks.shape[0])
    d = blocks[rows, np.argmax(np.abs(blocks), axis=1)] / np.float32(-8)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    ggml = np.minimum(np.trunc(blocks * inverse[:, None] + np.float32(8.5)), 15)
    codes = np.where(zero[:, None] == 7, 15 - ggml, ggml)  # d < 0: mirrored about 7.5
    codes[d.astype(np.float16) == 0] = 8  # a block whose scale is 0 as stored: zeros
    back = (*shape[:-1], shape[-1] // 32)
    return (
        np.moveaxis(codes.reshape(shape), -1, axis).astype(np.int16),
        np.moveaxis(stored.reshape(back), -1, axis),
        np.moveaxis(zero.reshape(back), -1, axis).astype(np.int16),
    )


def encode(w: np.ndarray, axis: int) -> dtypes.Encoded:
    """`w` rounded to nearest on Q4_0's grid in blocks of 32 along `axis` (`grid_codes`),
    as a uint4 encoding with zero points 7 or 8."""
    codes, stored, zero = grid_codes(w, axis)
    scaling = dtypes.PerBlock(32, axis, scale_format="float16")
    return dtypes.from_codes(codes, stored, "uint4", scaling, zero_point=zero)


def decoded(w: np.ndarray, axis: int) -> np.ndarray:
    """The values `encode` gives (float32)."""
    return np.asarray(encode(w, axis).decode(), np.float32)
