"""What the readers of other tools' quantized layouts share (`_compressed_tensors`, `_gguf`).

Those layouts hold integer codes of a few bits and a scale per group, as ours do, but
other writers use codes we do not (-2**(bits-1), the one value a symmetric format
leaves out) and zero or negative scales. `stored` turns such codes into this
library's arrays: the narrowest symmetric integer format that holds them (int4 codes
of -8 are held in int8), scales made positive (a zero scale's values are 0: scale 1,
codes 0; a negative one flips its codes), and every array checked against the
invariants `load` checks in our own files. Codes no symmetric format holds (-128 in
int8) are decoded instead, exactly as the layout says (code times scale, one float32
product), into a float32 leaf.
"""

from __future__ import annotations

import numpy as np

import dtypes
from dtypes import Format, IntFormat, PerAxis, PerBlock, Scaling

from .._errors import CheckpointError
from ._invariants import violation
from ._layout import Leaf, LeafArrays

__all__ = ["checked", "codes_of", "packed", "stored", "tensor_leaf"]


def tensor_leaf(name: str, shape: tuple[int, ...], fmt: Format, scaling: Scaling | None) -> Leaf:
    """A float32 tensor leaf named after a flat file's tensor (its key path is the name)."""
    return Leaf.tensor(name, (("key", name),), np.dtype(np.float32), shape, fmt, scaling)


def packed(codes: np.ndarray, bits: int) -> np.ndarray:
    """Our stored rows of signed `codes` (int8, rows × cols) as `bits`-bit fields:
    two's complement, packed along each row from the low bits, rows padded to bytes."""
    if bits == 8:
        return np.ascontiguousarray(codes, np.int8)
    per = 8 // bits
    rows, cols = codes.shape
    fields = np.zeros((rows, -(-cols // per) * per), np.uint8)
    fields[:, :cols] = codes.astype(np.uint8) & np.uint8((1 << bits) - 1)
    grouped = fields.reshape(rows, -1, per)
    out = np.zeros(grouped.shape[:2], np.uint8)
    for k in range(per):
        out |= grouped[:, :, k] << np.uint8(k * bits)
    return out


def codes_of(rows: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """The signed codes (int8, rows × cols) of our packed rows of `bits`-bit fields."""
    if bits == 8:
        return rows.view(np.int8)
    per = 8 // bits
    shifts = np.arange(per, dtype=np.uint8) * np.uint8(bits)
    fields = (rows[:, :, None] >> shifts) & np.uint8((1 << bits) - 1)
    fields = fields.reshape(rows.shape[0], -1)[:, :cols].astype(np.int16)
    signed: np.ndarray = np.where(fields >= 1 << (bits - 1), fields - (1 << bits), fields)
    return signed.astype(np.int8)


def _narrowest_int(codes: np.ndarray, bits: int) -> IntFormat | None:
    """The registry's symmetric integer format of `bits` or more bits that holds `codes`."""
    low = int(codes.min(initial=0))
    high = int(codes.max(initial=0))
    for b in sorted({bits, 4, 8}):
        if b >= bits and max(-low, high) <= (1 << (b - 1)) - 1:
            fmt = dtypes.get(f"int{b}")
            assert isinstance(fmt, IntFormat)
            return fmt
    return None


def _expand(groups: np.ndarray, scaling: Scaling, shape: tuple[int, ...]) -> np.ndarray:
    """Per-group values (scales or flags) repeated over the values of each group."""
    if isinstance(scaling, PerBlock):
        return np.repeat(groups.reshape(*shape[:-1], -1), int(scaling.size), axis=-1)
    if isinstance(scaling, PerAxis):
        return groups.reshape(shape[0], *([1] * (len(shape) - 1)))
    return groups.reshape([1] * len(shape))


def stored(
    name: str,
    codes: np.ndarray,
    bits: int,
    scale: np.ndarray,
    scaling: Scaling,
    where: str,
) -> tuple[Leaf, LeafArrays]:
    """The leaf and arrays of integer `codes` (int8 or wider, the tensor's shape) with
    float scales (`scale`, one per group of `scaling`, in its scale format's dtype).

    Raises:
        CheckpointError: the arrays break an invariant of the encoding they fit.
    """
    shape = tuple(codes.shape)
    codes = codes.astype(np.int16)
    negative = np.signbit(scale)
    zero = scale == 0
    if np.any(negative | zero):
        codes = np.where(_expand(negative, scaling, shape), -codes, codes)
        codes = np.where(_expand(zero, scaling, shape), 0, codes)
        scale = np.where(zero, np.ones_like(scale), np.abs(scale))
    fmt = _narrowest_int(codes, bits)
    if fmt is None:
        wide = _expand(scale.astype(np.float32), scaling, shape)
        values = codes.astype(np.float32) * wide
        return tensor_leaf(name, shape, dtypes.float32, None), LeafArrays(values)
    data = packed(codes.reshape(-1, shape[-1] if shape else 1).astype(np.int8), fmt.bits)
    return checked(tensor_leaf(name, shape, fmt, scaling), data, scale, where)


def checked(leaf: Leaf, data: np.ndarray, scale: np.ndarray, where: str) -> tuple[Leaf, LeafArrays]:
    """`leaf` with its arrays in our stored dtypes and shapes, refused if they break an
    invariant of its encoding (as `load` refuses such bytes in our own files)."""
    arrays = leaf.arrays()
    data = np.ascontiguousarray(data).view(arrays[0][1]).reshape(arrays[0][2])
    scale = np.ascontiguousarray(scale).view(arrays[1][1]).reshape(arrays[1][2])
    for role, array in (("data", data), ("scale", scale)):
        problem = violation(leaf, role, array)
        if problem:
            assert leaf.format is not None
            raise CheckpointError(
                f"{where}: tensor {leaf.name!r}: its {leaf.format.name} {role}: the encoding "
                f"{problem}, which this library does not hold"
            )
    return leaf, LeafArrays(data, scale)
