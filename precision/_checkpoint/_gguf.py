"""GGUF files: the layouts of ours that coincide with ggml's types, and reading them back.

GGUF (llama.cpp's file) stores each tensor in one ggml type. Three quantized types are
one of our encodings with its bytes rearranged, block by block of 32 values along the
last axis:

* **Q8_0** is int8 with `PerBlock(32)` float16 scales: a block is its float16 scale `d`
  (2 bytes) then its 32 codes (int8); a value is `d * q`;
* **Q4_0** is int4 with `PerBlock(32)` float16 scales: `d` then 16 bytes, byte j holding
  value j in its low nibble and value j + 16 in its high nibble, each as `q + 8`
  (0..15); a value is `d * (nibble - 8)`;
* **MXFP4** is mxfp4 (e2m1 values, `PerBlock(32)` E8M0 scales): the E8M0 byte `e`, then
  the e2m1 codes ordered as in Q4_0 (no offset); a value is `e2m1(code) * 2**(e - 127)`.

Our own order packs a row's nibbles in sequence (value 2k low, 2k + 1 high). F32, F16,
BF16 hold unscaled float32, float16 and bfloat16 tensors as they are, and I8 to I64
and F64 integer and float64 arrays. ggml counts a shape from its last axis; the gguf
package turns it around, so shapes here are numpy's.

Writing goes through the `gguf` package's writer into this library's atomic temporary
file; reading through its `GGUFReader` (optional: `pip install 'precision[gguf]'`).
Other ggml types (k-quants, i-quants, Q4_1, Q5_*) have no equivalent here: `read`
refuses them by name.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import ml_dtypes
import numpy as np

import dtypes
from dtypes import AsymmetricIntFormat, FloatFormat, Format, IntFormat, PerBlock, Scaling

from .._errors import CheckpointError
from ._atomic_file import _TempFile, write_error
from ._layout import Leaf, LeafArrays
from ._third_party_codes import checked, stored, tensor_leaf

__all__ = [
    "BLOCK",
    "MAGIC",
    "block_bytes",
    "contents",
    "gguf_type",
    "is_gguf",
    "packed_fields",
    "read",
    "refusal",
    "transposed",
    "write_file",
]

MAGIC = b"GGUF"
BLOCK = 32
#: ggml type of each unscaled float format and each plain array dtype (by numpy name).
_FLOAT_TYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_ARRAY_TYPES = {"int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "float64": "F64"}
#: Bytes per block of 32 values of the quantized types.
_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "MXFP4": 17}
_MX = PerBlock(BLOCK, power_of_two=True, scale_format="float8_e8m0fnu")
_HOLDS = (
    "GGUF holds int8 and int4 per block of 32 values with float16 scales (Q8_0, Q4_0), "
    "mxfp4 (MXFP4), and unscaled float32, float16 and bfloat16"
)


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ModuleNotFoundError(
            "GGUF files need the gguf package; install it with pip install 'precision[gguf]'",
            name="gguf",
        ) from None
    return gguf


def gguf_type(fmt: Format | None, scaling: Scaling | None, dtype: np.dtype) -> str | None:
    """The ggml type holding a tensor of `fmt` with `scaling` (a plain array of `dtype`
    when `fmt` is None) with our bytes rearranged, or None."""
    if fmt is None:  # a plain array: an integer or float64 type, or a float one as it is
        return _ARRAY_TYPES.get(dtype.name) or _FLOAT_TYPES.get(dtype.name)
    if scaling is None:
        known = _FLOAT_TYPES.get(fmt.name)
        return known if known is not None and dtypes.get(fmt.name) == fmt else None
    block = isinstance(scaling, PerBlock) and scaling.size == BLOCK and scaling.axis == -1
    if isinstance(fmt, IntFormat) and not fmt.binary and fmt.bits in (4, 8) and block:
        if scaling.scale_format == "float16":
            return "Q8_0" if fmt.bits == 8 else "Q4_0"
    if isinstance(fmt, AsymmetricIntFormat) and fmt.bits == 4 and block:
        # Q4_0's grid as calibrate(format="q4_0") writes it: zero points 7 or 8, which
        # `block_bytes` checks (refusal() refuses converting into it)
        if fmt.calibration == "minmax" and scaling.scale_format == "float16":
            return "Q4_0"
    if (
        isinstance(fmt, FloatFormat)
        and (fmt.exponent_bits, fmt.mantissa_bits) == (2, 1)
        and fmt.finite
        and scaling == _MX
    ):
        return "MXFP4"
    return None


def refusal(name: str, fmt: Format, scaling: Scaling | None, shape: tuple[int, ...]) -> str | None:
    """Why GGUF cannot hold tensor `name` converted to `fmt` with `scaling`, or None (a
    message naming no tensor: the caller lists them)."""
    kind = gguf_type(fmt, scaling, np.dtype(np.float32))
    if isinstance(fmt, AsymmetricIntFormat):
        return (
            f"{fmt.name}'s zero points are its groups' own; GGUF's Q4_0 holds uint4 only with "
            "zero points 7 or 8 (calibrate(format='q4_0') writes them); use --to int4"
        )
    if kind == "BF16" and not shape:
        return "a BF16 scalar is not read back by the gguf package; keep it (--exclude)"
    if kind is not None:
        return None
    where = f"{fmt.name} with {scaling or 'no scaling'}"
    if scaling is not None and "scales" not in str(scaling):
        where += ", float32 scales"
    if isinstance(fmt, IntFormat) and not fmt.binary and fmt.bits in (4, 8):
        return (
            f"{where}: {_HOLDS}; use --scaling per-block:32:fp16 (ggml's "
            f"{'Q8_0' if fmt.bits == 8 else 'Q4_0'})"
        )
    return (
        f"{where}: {_HOLDS}; use --to int8 or int4 with --scaling per-block:32:fp16, --to "
        "mxfp4, or --to bf16"
    )


# --------------------------------------------------------------------------
# our arrays -> ggml blocks


def _swizzled(fields: np.ndarray) -> np.ndarray:
    """Nibble bytes of ggml's order from 4-bit fields (blocks × 32): j low, j + 16 high."""
    out: np.ndarray = fields[:, :16] | (fields[:, 16:] << np.uint8(4))
    return out


def _fields(packed_rows: np.ndarray) -> np.ndarray:
    """4-bit fields (blocks × 32) of our packed bytes (value 2k low, 2k + 1 high)."""
    flat = packed_rows.reshape(-1)
    out = np.empty((flat.size, 2), np.uint8)
    out[:, 0] = flat & np.uint8(0xF)
    out[:, 1] = flat >> np.uint8(4)
    return out.reshape(-1, BLOCK)


def _offset_fields(raw: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> Any:
    """(Q4_0's fields, signed float16 scales) of uint4 codes with zero points 7 or 8:
    `s * (q - 8)` as it is; `s * (q - 7)` as `-s * ((15 - q) - 8)`."""
    zero = np.asarray(zero).reshape(-1)
    if not np.all((zero == 7) | (zero == 8)):
        bad = sorted(set(np.unique(zero).tolist()) - {7, 8})
        raise CheckpointError(
            f"uint4 zero points {bad[:4]} are not Q4_0's grid (7 or 8, as calibrate("
            "format='q4_0') writes them); convert the weights with --to int4"
        )
    fields = _fields(raw)
    mirrored = (zero == 7)[:, None]
    fields = np.where(mirrored, np.uint8(15) - fields, fields)
    signed = np.where(mirrored[:, 0], -scale.reshape(-1), scale.reshape(-1))
    return fields, signed.astype(np.float16)


def block_bytes(
    kind: str, data: np.ndarray, scale: np.ndarray, zero: np.ndarray | None = None
) -> np.ndarray:
    """ggml's blocks (uint8, blocks × bytes) of our stored codes `data` and scales
    `scale` (float16 scales, or E8M0 bytes for MXFP4; uint4's `zero` points for Q4_0's
    grid), blocks in row order."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if zero is not None:
        fields, scale = _offset_fields(raw, np.asarray(scale), zero)
    head = np.ascontiguousarray(scale).reshape(-1, 1).view(np.uint8)  # (blocks, 2 or 1)
    if kind == "Q8_0":
        body = raw.reshape(-1, BLOCK)
    elif zero is not None:
        body = _swizzled(fields)
    elif kind == "Q4_0":
        body = _swizzled(_fields(raw) ^ np.uint8(8))
    else:
        body = _swizzled(_fields(raw))
    return np.concatenate([head, body], axis=1)


def transposed(data: np.ndarray, scale: np.ndarray, shape: tuple[int, int], packed: bool) -> Any:
    """(codes, scales) of a matrix of `shape` blocked along axis 0, for its transpose
    blocked along its last axis: the same codes and scales (or zero points, given as
    `scale`), moved (4-bit codes `packed` two a byte along the last axis, as ours are,
    unpacked and packed again)."""
    rows, cols = shape
    if packed:
        raw = np.asarray(data).reshape(rows, -1)
        fields = np.empty((rows, 2 * raw.shape[1]), np.uint8)
        fields[:, 0::2], fields[:, 1::2] = raw & np.uint8(0xF), raw >> np.uint8(4)
        moved = np.ascontiguousarray(fields[:, :cols].T)  # rows: a multiple of 32
        codes = packed_fields(moved.reshape(-1)).reshape(cols, rows // 2)
    else:
        codes = np.ascontiguousarray(np.asarray(data).reshape(rows, cols).T)
    return codes, np.ascontiguousarray(np.asarray(scale).reshape(rows // BLOCK, cols).T)


# --------------------------------------------------------------------------
# writing


#: The kinds of typed keys `write_file` writes, and the gguf value type of each.
_KINDS = {
    "u32": "UINT32",
    "f32": "FLOAT32",
    "str": "STRING",
    "bool": "BOOL",
    "strs": "STRING",
    "i32s": "INT32",
}


def _add(gguf: Any, writer: Any, key: str, kind: str, value: Any) -> None:
    """One typed key; arrays (`strs`, `i32s`) with their element type."""
    vtype = gguf.GGUFValueType[_KINDS[kind]]
    if kind.endswith("s"):
        writer.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, sub_type=vtype)
    else:
        writer.add_key_value(key, value, vtype)


def write_file(
    path: str,
    tensors: list[tuple[str, tuple[int, ...], str]],
    produce: Iterable[np.ndarray],
    *,
    metadata: dict[str, str],
    overwrite: bool,
    guard: Callable[[], AbstractContextManager[Any]] | None = None,
    mode: int | None = None,
    arch: str = "",
    keys: Iterable[tuple[str, str, Any]] = (),
) -> int:
    """Atomically write a GGUF file of `tensors` ((name, numpy shape, ggml type) each),
    whose data `produce` yields in order (ggml's bytes, or the float or integer array);
    `metadata` becomes string keys, `keys` typed ones ((key, kind, value), `kind` one of
    `_KINDS`) after `general.architecture` = `arch` (none when empty: the tensors alone,
    see docs/cli.md). Returns the bytes written."""
    gguf = _gguf()
    from gguf.gguf_writer import WriterState  # the gguf package's own (0.17 and later)

    kinds = [gguf.GGMLQuantizationType[kind] for _, _, kind in tensors]
    writer = gguf.GGUFWriter(None, arch=arch)
    if any(kind in _BLOCK_BYTES for _, _, kind in tensors):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, kind, value in keys:
        if key != "general.architecture":
            _add(gguf, writer, key, kind, value)
    for key, value in metadata.items():
        writer.add_string(key, value)
    for (name, shape, _), kind in zip(tensors, kinds, strict=True):
        size, per = gguf.GGML_QUANT_SIZES[kind]
        n = int(np.prod(shape, dtype=np.int64)) // size * per
        writer.add_tensor_info(name, shape, np.dtype(np.float32), n, raw_dtype=kind)
    temp = _TempFile(path, overwrite=overwrite, mode=mode)
    try:
        with os.fdopen(temp.fd, "wb", closefd=False) as f:
            # The writer writes to the files it holds: hand it ours (an unnamed file on
            # Linux), so an interrupted write leaves nothing behind.
            writer.fout, writer.state = [f], WriterState.EMPTY
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for array in produce:
                writer.write_tensor_data(np.ascontiguousarray(array))
            f.flush()
            size = f.seek(0, os.SEEK_END)
        with guard() if guard is not None else contextlib.nullcontext():
            temp.commit()
    except OSError as exc:
        temp.discard()
        if exc.filename is None and exc.errno is not None:  # a full disk, a size limit
            raise write_error(path, exc) from None
        raise
    except BaseException:
        temp.discard()
        raise
    finally:
        os.close(temp.fd)
    return int(size)


# --------------------------------------------------------------------------
# reading


def is_gguf(path: str) -> bool:
    """Whether `path` is a regular file starting with GGUF's magic bytes."""
    try:
        if not os.path.isfile(path):
            return False
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def _blocks(data: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(scale bytes, body bytes) of every block of a quantized tensor's data."""
    flat = np.asarray(data).reshape(-1, _BLOCK_BYTES[kind])
    head = 1 if kind == "MXFP4" else 2
    return flat[:, :head], flat[:, head:]


def _unswizzled(body: np.ndarray) -> np.ndarray:
    """4-bit fields (blocks × 32) in value order of ggml's nibble bytes (blocks × 16)."""
    return np.concatenate([body & np.uint8(0xF), body >> np.uint8(4)], axis=1)


def _tensor(
    name: str, kind: str, shape: tuple[int, ...], data: Any, where: str
) -> tuple[Leaf, LeafArrays]:
    if kind in ("F32", "F16", "BF16"):
        fmt = {"F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16}[kind]
        container = np.dtype(ml_dtypes.bfloat16) if kind == "BF16" else None
        values = np.array(data)
        values = values.view(container).reshape(shape) if container else values.reshape(shape)
        return tensor_leaf(name, shape, fmt, None), LeafArrays(values)
    if kind in _ARRAY_TYPES.values():
        values = np.array(data).reshape(shape)
        return Leaf(name, (("key", name),), "array", values.dtype, shape), LeafArrays(values)
    if kind not in _BLOCK_BYTES:
        raise CheckpointError(
            f"{where}: tensor {name!r} is ggml type {kind}, which no format of this library "
            "holds (Q8_0, Q4_0, MXFP4, F32, F16, BF16 and integer types are read); "
            "dequantize it with gguf.quants.dequantize"
        )
    head, body = _blocks(data, kind)
    groups = (*shape[:-1], shape[-1] // BLOCK)
    if kind == "MXFP4":
        fields = _unswizzled(body)
        # ggml writes E8M0 byte 0 for a block of zeros; ours have scale 1 (byte 127)
        zero = (head[:, 0] == 0) & np.all((fields & np.uint8(7)) == 0, axis=1)
        exponents = np.where(zero, np.uint8(127), head[:, 0])
        fields = np.where(zero[:, None], np.uint8(0), fields)
        leaf = tensor_leaf(name, shape, dtypes.get("mxfp4"), _MX)
        return checked(leaf, packed_fields(fields), exponents.reshape(groups), where)
    scale = head.copy().view(np.float16).reshape(groups)
    if kind == "Q8_0":
        codes = body.view(np.int8).reshape(shape)
        bits = 8
    else:
        codes = (_unswizzled(body).astype(np.int8) - np.int8(8)).reshape(shape)
        bits = 4
    return stored(name, codes, bits, scale, PerBlock(BLOCK, scale_format="float16"), where)


def packed_fields(fields: np.ndarray) -> np.ndarray:
    """Our packed bytes (value 2k low, 2k + 1 high) of 4-bit fields in value order."""
    pairs = fields.reshape(-1, 2)
    out: np.ndarray = pairs[:, 0] | (pairs[:, 1] << np.uint8(4))
    return out


def contents(path: str) -> tuple[dict[str, Any], list[tuple[str, str, tuple[int, ...], int]]]:
    """(keys, tensors) of a GGUF file: every key's value (an array as `[N items]`, but
    short ones), and each tensor's (name, ggml type, numpy shape, bytes)."""
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError, KeyError) as exc:
        raise CheckpointError(f"{path}: not a GGUF file this reader can open ({exc})") from None
    keys: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        array = field.types[0] == gguf.GGUFValueType.ARRAY
        if array and len(field.data) > 8:
            keys[key] = f"[{len(field.data)} items]"
        else:
            value = field.contents()
            # a float32 as its shortest float32 spelling (1e-05, not 9.99999974e-06)
            keys[key] = float(str(np.float32(value))) if isinstance(value, float) else value
    tensors = [
        (
            t.name,
            t.tensor_type.name,
            tuple(int(d) for d in reversed(t.shape.tolist())),
            int(t.n_bytes),
        )
        for t in reader.tensors
    ]
    return keys, tensors


def read(path: str) -> list[tuple[Leaf, LeafArrays]]:
    """Every tensor of a GGUF file as a leaf (named as in the file) with its arrays."""
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError, KeyError) as exc:
        raise CheckpointError(f"{path}: not a GGUF file this reader can open ({exc})") from None
    out = []
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        out.append(_tensor(t.name, t.tensor_type.name, shape, t.data, path))
    return out
