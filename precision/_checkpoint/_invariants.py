"""Invariants of stored encodings: what every encoder guarantees about its bytes.

The reader (`_reader`) refuses a file that breaks one after each tensor is
read, and the writer (`_leaves`, through `save`) refuses to write such an
encoding: `save` never writes what `load` refuses. Each check is a few
vectorised integer operations per byte, in slices so temporaries stay small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np

import dtypes
from dtypes import (
    AsymmetricIntFormat,
    CodebookFormat,
    E8M0Format,
    FloatFormat,
    Format,
    IntFormat,
)

from ._layout import (
    E4M3_MAX,
    MAX_ELEMENTS,
    SCALE_DTYPES,
    Leaf,
    e8m0_offset,
    element_top,
    file_dtype,
)

# --------------------------------------------------------------------------
# invariants of stored encodings
#
# What every encoder guarantees about the bytes it produces, checked with a
# few vectorised integer operations per byte (in slices, so the temporaries
# stay small): the reader refuses a file that breaks one, so a damaged or
# forged file whose CRCs were re-sealed still cannot load as numbers no
# encoding gives, and the writer refuses to save such an encoding.

_CHUNK = 1 << 22  # elements per slice of the elementwise checks
_TINY32 = 0x00800000  # float32 bits of 2**-126, the smallest normal (and smallest scale)
_F32_MAX = float(np.finfo(np.float32).max)


def _slices(flat: np.ndarray) -> Iterator[np.ndarray]:
    for start in range(0, flat.size, _CHUNK):
        yield flat[start : start + _CHUNK]


def _any(flat: np.ndarray, bad: Callable[[np.ndarray], Any]) -> bool:
    return any(bool(np.any(bad(part))) for part in _slices(flat))


def _has_field(flat: np.ndarray, bits: int, value: int) -> bool:
    """Whether any `bits`-wide field (2 or 4) of the bytes `flat` equals `value`.

    Eight bytes at a time as uint64 words: XOR turns the wanted fields into
    zero fields, and `(t - LOW) & ~t & HIGH` is nonzero exactly when some
    field of `t` is zero (a borrow can only set bits above a real zero field),
    a few word operations instead of a shift and compare per field.
    """
    reps = 64 // bits
    low = sum(1 << (k * bits) for k in range(reps))
    high = low << (bits - 1)
    pattern = np.uint64(value * low)
    low64, high64 = np.uint64(low), np.uint64(high)
    words = flat[: flat.size - flat.size % 8].view(np.uint64)
    for part in _slices(words):
        t = part ^ pattern
        if np.any((t - low64) & ~t & high64):
            return True
    tail = flat[flat.size - flat.size % 8 :].astype(np.uint16)
    mask = (1 << bits) - 1
    return any(bool(np.any(((tail >> k) & mask) == value)) for k in range(0, 8, bits))


def _padding_violation(fmt: Format, n: int, data: np.ndarray) -> str | None:
    """Nonzero bits past the last code of each row (the packed last byte)."""
    used = (n * fmt.code_bits) % 8
    if not used or data.shape[-1] == 0:
        return None
    last = data[..., -1] if data.ndim else data
    if np.any(np.asarray(last) >> np.uint8(used)):
        return f"has nonzero padding bits after the last code of a row (bits {used}..7)"
    return None


def _fields(fmt: Format, data: np.ndarray, n: int) -> np.ndarray:
    """The unpacked code fields of packed `data` rows (n fields a row), as uint16."""
    w = fmt.code_bits
    bits = np.unpackbits(data, axis=-1, bitorder="little")[..., : n * w]
    bits = bits.reshape((*data.shape[:-1], n, w))
    weights = (np.uint16(1) << np.arange(w, dtype=np.uint16)).astype(np.uint16)
    fields: np.ndarray = (bits.astype(np.uint16) * weights).sum(axis=-1, dtype=np.uint16)
    return fields


def _float_code_violation(fmt: FloatFormat, codes: np.ndarray, scaled: bool) -> str | None:
    """Codes (bit patterns, sign at bit `bits - 1`) that no encoding of `fmt` gives."""
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    width = 1 + e + m
    codes = codes.reshape(-1)
    if fmt.code_bits > width and _any(codes, lambda c: c >> width):
        return f"holds codes wider than {width} bits"
    if not scaled:
        return None  # unscaled: every pattern is a value, inf or NaN of the format
    # A scaled encoding saturates onto the finite range: no inf, no NaN codes.
    mag = (1 << (e + m)) - 1
    top = ((1 << e) - 1) << m
    if fmt.finite and not fmt.nan:
        return None
    if fmt.finite:  # the only NaN code is all ones
        bad = lambda c: (c & mag) == mag
    else:  # all-ones exponent: inf or NaN
        bad = lambda c: (c & top) == top
    if _any(codes, bad):
        return "holds inf or NaN codes under a scaling (scaled encodings are finite)"
    return None


def _wide_float_violation(fmt: FloatFormat, values: np.ndarray, scaled: bool) -> str | None:
    """float32-container values off `fmt`'s grid (tf32 and other wide custom layouts)."""
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    u = values.reshape(-1).view(np.uint32)
    low = np.uint32((1 << (23 - m)) - 1)
    top = int(np.array(fmt.max, np.float32).view(np.uint32))
    min_normal = int(np.array(fmt.min_normal, np.float32).view(np.uint32))
    if e == 8 and fmt.has_inf and fmt.nan:
        # float32's exponent range (tf32): only the low mantissa bits of
        # finite values must be zero; every inf and NaN pattern is allowed
        # unscaled, none scaled.
        exponent = np.uint32(0x7F800000)
        for part in _slices(u):
            special = (part & exponent) == exponent
            if scaled and np.any(special):
                return "holds inf or NaN values its format cannot hold"
            if np.any((part & low).astype(bool) & ~special):
                return f"holds values off {fmt.name}'s grid (nonzero low mantissa bits)"
        return None
    for part in _slices(u):
        mag = part & np.uint32(0x7FFFFFFF)
        special = mag >= np.uint32(0x7F800000)
        inf = mag == np.uint32(0x7F800000)
        if np.any(special) and (
            scaled or (np.any(inf) and not fmt.has_inf) or (np.any(special & ~inf) and not fmt.nan)
        ):
            return "holds inf or NaN values its format cannot hold"
        finite = mag[~special]
        if np.any(finite > np.uint32(top)):
            return f"holds values beyond {fmt.name}'s largest, {fmt.max}"
        normal = finite[finite >= np.uint32(min_normal)]
        if np.any(normal & low):
            return f"holds values off {fmt.name}'s grid (nonzero low mantissa bits)"
        sub = finite[finite < np.uint32(min_normal)]
        if sub.size and e < 8:
            # below the format's smallest normal: multiples of its smallest subnormal
            x = np.ldexp(sub.view(np.float32).astype(np.float64), -(fmt.emin - m))
            if np.any(x != np.floor(x)):
                return f"holds values off {fmt.name}'s subnormal grid"
        elif sub.size and np.any(sub & low):
            return f"holds values off {fmt.name}'s grid (nonzero low mantissa bits)"
    return None


def data_violation(leaf: Leaf, data: np.ndarray, *, whole_rows: bool = True) -> str | None:
    """Why `data` (a leaf's stored codes, as in the file) is no encoding of its format, or None.

    `data` may be a block of rows (first axis) of the stored array;
    `whole_rows=False` says a 1-D block does not end where the array does, so
    its last byte holds no padding.
    """
    fmt = leaf.format
    if leaf.kind != "tensor" or fmt is None or data.size == 0:
        return None
    if isinstance(fmt, AsymmetricIntFormat | CodebookFormat):
        return _index_violation(leaf, fmt, data, whole_rows)
    if not isinstance(fmt, FloatFormat | IntFormat):
        return None  # E8M0: every byte is a value (0xFF is its NaN, what NaN encodes to)
    scaled = leaf.scaling is not None
    n = leaf.shape[-1] if leaf.shape else 1
    if fmt.packed:
        data = np.asarray(data).view(np.uint8)
        if whole_rows or data.ndim > 1:
            problem = _padding_violation(fmt, n, data)
            if problem:
                return problem
        if isinstance(fmt, IntFormat):
            if fmt.binary:
                return None  # every bit is a code, ±1
            if _has_field(data.reshape(-1), fmt.bits, 1 << (fmt.bits - 1)):
                low = -(1 << (fmt.bits - 1))
                return (
                    f"holds the code {low}, outside the symmetric range [-{fmt.qmax}, {fmt.qmax}]"
                )
            return None
        if data.ndim == 1 and not whole_rows:
            return None  # fields may straddle the block's ends: checked whole (see reader)
        rows = data.reshape(-1, data.shape[-1])
        step = max(1, _CHUNK // (8 * max(rows.shape[1], 1)))  # unpacking takes 8x the bytes
        for start in range(0, rows.shape[0], step):
            problem = _float_code_violation(
                fmt, _fields(fmt, rows[start : start + step], n), scaled
            )
            if problem:
                return problem
        return None
    if isinstance(fmt, IntFormat):  # int8: codes in [-127, 127]
        if _any(np.asarray(data).view(np.int8).reshape(-1), lambda c: c == -128):
            return "holds the code -128, outside the symmetric range [-127, 127]"
        return None
    container = np.dtype(fmt.container)
    if fmt.native_dtype is not None:
        if fmt.is_full_precision or not scaled:
            return None  # every bit pattern of a native type is a value of the format
        codes = np.asarray(data).view(np.dtype(f"u{container.itemsize}"))
        return _float_code_violation(fmt, codes.reshape(-1), scaled)
    if container == np.float32:
        return _wide_float_violation(fmt, np.asarray(data).view(np.float32), scaled)
    return _float_code_violation(fmt, np.asarray(data).view(np.uint8).reshape(-1), scaled)


def _index_violation(
    leaf: Leaf, fmt: AsymmetricIntFormat | CodebookFormat, data: np.ndarray, whole_rows: bool
) -> str | None:
    """Codes of a code book or asymmetric integers: table indices, zero padding bits."""
    count = len(fmt.values) if isinstance(fmt, CodebookFormat) else 1 << fmt.bits
    n = leaf.shape[-1] if leaf.shape else 1
    data = np.asarray(data).view(np.uint8)
    if not fmt.packed:
        if count < 256 and _any(data.reshape(-1), lambda c: c >= count):
            return f"holds codes past the last of its {count} entries"
        return None
    if whole_rows or data.ndim > 1:
        problem = _padding_violation(fmt, n, data)
        if problem:
            return problem
    if count == 1 << fmt.code_bits or (data.ndim == 1 and not whole_rows):
        return None  # every field is a code (or fields straddle the block: checked whole)
    rows = data.reshape(-1, data.shape[-1])
    step = max(1, _CHUNK // (8 * max(rows.shape[1], 1)))
    for start in range(0, rows.shape[0], step):
        if np.any(_fields(fmt, rows[start : start + step], n) >= count):
            return f"holds codes past the last of its {count} entries"
    return None


def _widen(leaf: Leaf, fmt: Format, scale: np.ndarray) -> np.ndarray:
    """float32 scales of stored `scale` (file dtype), as decoding multiplies codes by them.

    E8M0 byte b is 2**(b - 127 - offset) built from bits (byte 0 gives 0, not
    2**-127: below every scale an encoder writes); 0xFF is refused before.
    """
    assert leaf.scaling is not None
    scale_format = leaf.scaling.scale_format
    if scale_format == "float8_e8m0fnu":
        bits = scale.view(np.uint8).astype(np.uint32) << np.uint32(23)
        widened = bits.view(np.float32)
        offset = e8m0_offset(fmt)
        return widened * np.float32(2.0**-offset) if offset else widened
    return scale.view(SCALE_DTYPES[scale_format]).astype(np.float32)


def scale_violation(leaf: Leaf, scale: np.ndarray) -> str | None:
    """Why `scale` (a leaf's stored scales) holds a value no encoder gives, or None.

    Every scale, widened to float32 as decoding does, is a positive, finite
    float32 normal (an all-zero group gets 1, a tiny one 2**-126) small
    enough that the format's largest code times it is finite; int1's scale is
    a mean of |x|, which is 0 for an all-zero group; under `power_of_two`
    every scale is an exact power of two (or, in float16 and bfloat16, the
    format's largest value, where larger powers are clamped). E8M0 bytes are
    never 0xFF (NaN). Two-level e4m3 block scales are finite and not
    negative (zero for a block that rounds to zero); their bound is checked
    with the tensor scale (`tensor_scale_violation`).
    """
    fmt, scaling = leaf.format, leaf.scaling
    if leaf.kind != "tensor" or scaling is None or fmt is None or scale.size == 0:
        return None
    container = leaf.scale_container
    assert container is not None
    if np.dtype(scale.dtype) != file_dtype(container):
        return None  # the reader's dtype check refuses it
    scale_format = scaling.scale_format
    flat = np.asarray(scale).reshape(-1)
    binary = isinstance(fmt, IntFormat) and fmt.binary
    top = element_top(fmt)
    clamp = 0
    if scale_format in ("bfloat16", "float16"):
        clamp = int(np.array(ml_dtypes.finfo(container).max, np.float32).view(np.uint32))
    for raw in _slices(flat):
        if scale_format == "float8_e4m3fn":
            b = raw.view(np.uint8)
            if np.any(b & np.uint8(0x80)):
                return "has a negative scale"
            if np.any(b == np.uint8(0x7F)):
                return "has a NaN scale (from non-finite input?)"
            continue
        if scale_format == "float8_e8m0fnu" and np.any(raw.view(np.uint8) == np.uint8(0xFF)):
            return "has a NaN scale (E8M0 byte 0xFF, from non-finite input?)"
        part = _widen(leaf, fmt, raw).view(np.uint32)
        if np.any(part >> np.uint32(31)):
            return "has a negative scale"
        if np.any(part >= np.uint32(0x7F800000)):
            return "has an infinite or NaN scale (from non-finite input?)"
        small = part < np.uint32(_TINY32)
        if binary:
            small &= part != 0
        if np.any(small):
            return "has a zero or subnormal scale (every scale is at least 2**-126)"
        off = (part & np.uint32(0x7FFFFF)) != 0
        if scaling.power_of_two and np.any(off & (part != np.uint32(clamp))):
            return "has a scale that is not a power of two under power_of_two=True"
        # Encoders pick scales so that the largest code decodes finite. An asymmetric
        # group may span up to twice float32's largest value (3.4e38 and -3.4e38): its
        # end codes decode clamped to that value, so the bound there is twice as wide.
        limit = _F32_MAX * (2 if isinstance(fmt, dtypes.AsymmetricIntFormat) else 1)
        if np.any(part.view(np.float32).astype(np.float64) * top > limit):
            return f"has a scale so large that {top:g} times it overflows float32"
    return None


def tensor_scale_shape(
    item: dict[str, Any], scaling: Any, shape: tuple[int, ...], version: int
) -> tuple[int, ...] | str:
    """The shape of a metadata leaf's tensor scale — `()`, or (layout 3) one per layer of
    a stack — or why its `tensor_scale_shape` is none a writer gives."""
    given = item.get("tensor_scale_shape")
    if given is None:
        if version >= 3 and item.get("tensor_scale") is not None:
            return "its tensor scale needs a tensor_scale_shape (a list)"
        return ()
    if item.get("tensor_scale") is None:
        return f"tensor_scale_shape {given!r:.100} without a tensor scale"
    ok = isinstance(given, list) and all(type(d) is int for d in given)
    if not ok or scaling is None or not scaling.tensor_scale_fits(tuple(given), shape):
        return (
            f"tensor_scale_shape {given!r:.100} does not fit its shape {list(shape)} "
            "([] or, per axis, 1 or the axis' length)"
        )
    return tuple(given)


def tensor_scale_violation(leaf: Leaf, tensor_scale: np.ndarray) -> str | None:
    """Why a two-level encoding's float32 tensor scale is none an encoder gives, or None.

    It is `amax / (448 * top)` of the tensor (1/g in NVFP4's recipe): a
    positive finite normal float32, small enough that the largest block
    scale (448) times it times the largest element is finite.
    """
    fmt = leaf.format
    if fmt is None or tensor_scale.dtype != np.float32:
        return None  # the reader's dtype and shape checks refuse it
    bits = tensor_scale.reshape(-1).view(np.uint32)  # one, or one per layer of a stack
    if np.any(bits >> 31):
        return "has a negative tensor scale"
    if np.any(bits >= 0x7F800000):
        return "has an infinite or NaN tensor scale (from non-finite input?)"
    if np.any(bits < _TINY32):
        return "has a zero or subnormal tensor scale (it is at least 2**-126)"
    top = tensor_scale.reshape(-1).astype(np.float64) * E4M3_MAX * element_top(fmt)
    if np.any(top > _F32_MAX):
        return "has a tensor scale so large that the largest block's values overflow float32"
    return None


def zero_point_violation(leaf: Leaf, zero_point: np.ndarray) -> str | None:
    """Why zero points are none an asymmetric encoder gives (past the largest code), or None."""
    fmt = leaf.format
    if not isinstance(fmt, AsymmetricIntFormat) or zero_point.dtype != np.uint8:
        return None
    if _any(zero_point.reshape(-1), lambda z: z > fmt.qmax):
        return f"has a zero point past the largest code, {fmt.qmax}"
    return None


def violation(leaf: Leaf, role: str, array: np.ndarray, *, whole_rows: bool = True) -> str | None:
    """Why `array`, stored in `role` (see `ROLES`) of `leaf`, is no encoding's, or None."""
    if leaf.kind != "tensor" or leaf.format is None:
        return None  # a plain array: any bytes are values
    if role == "data":
        return data_violation(leaf, array, whole_rows=whole_rows)
    if role == "scale":
        return scale_violation(leaf, array)
    if role == "tensor_scale":
        return tensor_scale_violation(leaf, array)
    return zero_point_violation(leaf, array)


def encoding_problem(fmt: Format, scaling: Any, shape: tuple[int, ...]) -> str | None:
    """Why no encoder gives `fmt` under `scaling` for `shape`, or None."""
    if scaling is None:
        return None
    if isinstance(fmt, E8M0Format):
        return "float8_e8m0fnu is a scale format: its values are never scaled"
    scale_format = scaling.scale_format
    if isinstance(fmt, AsymmetricIntFormat | CodebookFormat) and (
        scaling.power_of_two or scale_format not in ("float32", "bfloat16", "float16")
    ):
        return (
            f"{fmt.name} keeps exact group scales: float32, bfloat16 or float16 without "
            f"power_of_two, not {scaling}"
        )
    if (
        isinstance(fmt, IntFormat)
        and fmt.binary
        and scale_format
        not in (
            "float32",
            "bfloat16",
            "float16",
        )
    ):
        return f"int1 scales are means of |x| and cannot be stored as {scale_format}"
    if scale_format == "float8_e4m3fn" and not isinstance(fmt, FloatFormat):
        return "two-level float8_e4m3fn scales (NVFP4) are for float elements"
    if isinstance(fmt, IntFormat) and fmt.binary and scaling.power_of_two:
        return "int1 scales are means of |x| and have no power-of-two variant"
    if isinstance(fmt, FloatFormat) and fmt.emax >= 127:
        return f"{fmt.name} has float32's exponent range and is never scaled"
    size = getattr(scaling, "size", None)
    if size is not None and shape:
        # The decoder broadcasts scales over whole blocks before slicing:
        # the padded shape must be as bounded as a real one.
        axis = scaling.axis % len(shape)
        padded = -(-shape[axis] // size) * size
        rest = 1
        for i, d in enumerate(shape):
            if i != axis:
                rest *= max(d, 1)
        if padded * rest > MAX_ELEMENTS:
            return (
                f"per-block size {size} pads axis {axis} of {list(shape)} beyond the limit "
                "of 2**48 elements"
            )
    return None
