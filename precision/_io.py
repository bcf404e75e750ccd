"""Checkpoints: trees of Tensors saved to and loaded from safetensors files.

The file format is written here with numpy and json rather than through a
library so that we control the two things a checkpoint must get right:

* **atomicity** — bytes go to a temporary file in the destination directory,
  which is flushed, fsynced and renamed over the destination, and the
  directory is fsynced; any error removes the temporary file and leaves an
  existing destination untouched;
* **validation** — every header field is checked against the file before a
  byte of tensor data is allocated, and the tensors a `precision` file
  describes are checked against their declared format, scaling and shape and
  against a CRC-32 of their bytes, so a damaged file raises `CheckpointError`
  instead of returning wrong numbers.

Layout (see docs/cli.md, "Checkpoints"): an 8-byte little-endian header
length, a JSON header mapping tensor names to `dtype`, `shape` and
`data_offsets`, with a `__metadata__` map of strings, then the raw bytes.
A reduced Tensor is stored as its container array under its key-path name and
its float32 scales under `name + ":scale"`; the `"precision"` metadata entry is
a JSON document describing every leaf (key path, format, scaling, logical
dtype and shape) and the CRC-32 of every tensor.
"""

from __future__ import annotations

import binascii
import dataclasses
import errno
import json
import os
import re
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import jax
import ml_dtypes
import numpy as np
from jax import tree_util

import dtypes
from dtypes import Encoded, FloatFormat, Format, IntFormat, PerAxis, PerBlock, PerTensor, Scaling
from dtypes._packing import packed_length

from ._errors import PrecisionError

__all__ = ["CheckpointError", "load", "save"]


class CheckpointError(PrecisionError, ValueError):
    """A checkpoint file is truncated, corrupted, foreign or inconsistent.

    The message names the file and what is wrong with it. Raised before any
    wrong number could be returned.
    """


#: safetensors dtype strings and the numpy types that hold them.
_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16),
    "I16": np.dtype(np.int16),
    "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32),
    "U64": np.dtype(np.uint64),
    "I64": np.dtype(np.int64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
}
_DTYPE_NAMES: dict[np.dtype, str] = {v: k for k, v in _DTYPES.items()}

#: Foreign float tensors load as Tensors stored in the format of their dtype.
_DTYPE_FORMATS: dict[str, Format] = {
    "F32": dtypes.float32,
    "F16": dtypes.float16,
    "BF16": dtypes.bfloat16,
    "F8_E4M3": dtypes.float8_e4m3fn,
    "F8_E5M2": dtypes.float8_e5m2,
}

#: Logical dtypes a Tensor may declare.
_LOGICAL = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}

MAX_HEADER_BYTES = 100 * 1024 * 1024
METADATA_KEY = "precision"
VERSION_KEY = "precision_version"  # a second marker: one damaged key cannot pass as foreign
VERSION = 1
SCALE_SUFFIX = ":scale"
_MAX_PATH_DEPTH = 256
_ALIGN = 64  # jax aliases host buffers aligned like this instead of copying them


# --------------------------------------------------------------------------
# leaves: what one tree leaf is stored as


@dataclasses.dataclass(frozen=True)
class Leaf:
    """How one tree leaf is stored (one entry of the `"precision"` metadata).

    `kind` is `"tensor"` (a precision Tensor: `format`, `scaling` and logical
    `dtype` apply, `scale` names the scale array) or `"array"` (a plain array
    stored as it is: `format` and `scaling` are None).
    """

    name: str
    path: tuple[tuple[str, Any], ...]
    kind: str
    dtype: np.dtype
    shape: tuple[int, ...]
    format: Format | None = None
    scaling: Scaling | None = None
    scale: str | None = None

    @property
    def data_shape(self) -> tuple[int, ...]:
        """Shape of the stored data array."""
        fmt = self.format
        if fmt is None or not fmt.packed:
            return self.shape
        if not self.shape:
            return (1,)
        return (*self.shape[:-1], packed_length(self.shape[-1], fmt.code_bits))

    @property
    def container(self) -> np.dtype:
        """numpy dtype of the data array in memory (the format's container)."""
        return self.dtype if self.format is None else np.dtype(self.format.container)

    @property
    def data_dtype(self) -> np.dtype:
        """numpy dtype of the data array in the file.

        The container, or raw bytes (U8) for one-byte containers that have no
        safetensors name (ml_dtypes' float8_e4m3, float8_e3m4).
        """
        container = self.container
        return container if container in _DTYPE_NAMES else np.dtype(np.uint8)

    @property
    def scale_shape(self) -> tuple[int, ...] | None:
        """Shape of the stored scale array, or None when there is none."""
        if self.scaling is None:
            return None
        return self.scaling.scale_shape(self.shape) if self.shape else ()

    def arrays(self) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
        """The (name, dtype, shape) of every array this leaf stores, data first."""
        out = [(self.name, self.data_dtype, self.data_shape)]
        if self.scale is not None:
            out.append((self.scale, np.dtype(np.float32), self.scale_shape))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": [list(p) for p in self.path],
            "kind": self.kind,
            "format": None if self.format is None else format_to_json(self.format),
            "scaling": scaling_to_json(self.scaling),
            "dtype": self.dtype.name,
            "shape": list(self.shape),
            "scale": self.scale,
        }


def format_to_json(fmt: Format) -> str | dict[str, Any]:
    """A format as its canonical name, or its full parameters for a custom layout."""
    known = dtypes.FORMATS.get(fmt.name)
    if known is not None and known == fmt:
        return fmt.name
    if isinstance(fmt, FloatFormat):
        return {
            "kind": "float",
            "exponent_bits": fmt.exponent_bits,
            "mantissa_bits": fmt.mantissa_bits,
            "finite": fmt.finite,
            "nan": bool(fmt.nan),
            "saturate": fmt.saturate,
            "name": fmt.name,
        }
    if isinstance(fmt, IntFormat):
        return {"kind": "int", "bits": fmt.bits, "name": fmt.name}
    raise TypeError(f"cannot store format {fmt!r}: only FloatFormat and IntFormat are supported")


def format_from_json(spec: Any) -> Format:
    """Inverse of `format_to_json`; raises ValueError/TypeError on a bad spec."""
    if isinstance(spec, str):
        if spec not in dtypes.FORMATS:
            raise ValueError(f"unknown format {spec!r} (known: {', '.join(dtypes.FORMATS)})")
        return dtypes.FORMATS[spec]
    if not isinstance(spec, dict):
        raise ValueError(f"a format is a name or an object, got {spec!r}")
    kind = spec.get("kind")
    if kind == "float":
        _exact_keys(
            spec, {"kind", "exponent_bits", "mantissa_bits", "finite", "nan", "saturate", "name"}
        )
        for key in ("exponent_bits", "mantissa_bits"):
            if type(spec[key]) is not int:
                raise ValueError(f"format field {key!r} must be an integer, got {spec[key]!r}")
        for key in ("finite", "nan", "saturate"):
            if type(spec[key]) is not bool:
                raise ValueError(f"format field {key!r} must be true or false, got {spec[key]!r}")
        if not isinstance(spec["name"], str):
            raise ValueError(f"format name must be a string, got {spec['name']!r}")
        return FloatFormat(
            spec["exponent_bits"],
            spec["mantissa_bits"],
            finite=spec["finite"],
            nan=spec["nan"],
            saturate=spec["saturate"],
            name=spec["name"],
        )
    if kind == "int":
        _exact_keys(spec, {"kind", "bits", "name"})
        if type(spec["bits"]) is not int or not isinstance(spec["name"], str):
            raise ValueError(f"bad int format {spec!r}")
        return IntFormat(spec["bits"], name=spec["name"])
    raise ValueError(f"unknown format kind {kind!r} in {spec!r}")


def scaling_to_json(scaling: Scaling | None) -> dict[str, Any] | None:
    """A scaling as a JSON object (None stays None)."""
    if scaling is None:
        return None
    out: dict[str, Any]
    if isinstance(scaling, PerTensor):
        out = {"type": "per-tensor"}
    elif isinstance(scaling, PerAxis):
        out = {"type": "per-axis", "axis": scaling.axis}
    elif isinstance(scaling, PerBlock):
        out = {"type": "per-block", "size": scaling.size, "axis": scaling.axis}
    else:
        raise TypeError(f"cannot store scaling {scaling!r}")
    out["power_of_two"] = scaling.power_of_two
    return out


def scaling_from_json(spec: Any) -> Scaling | None:
    """Inverse of `scaling_to_json`; raises ValueError on a bad spec."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ValueError(f"a scaling is an object or null, got {spec!r}")
    kind = spec.get("type")
    fields = {"per-tensor": (), "per-axis": ("axis",), "per-block": ("size", "axis")}
    if kind not in fields:
        raise ValueError(f"unknown scaling type {kind!r}")
    _exact_keys(spec, {"type", "power_of_two", *fields[kind]})
    if type(spec["power_of_two"]) is not bool:
        raise ValueError(f"scaling power_of_two must be true or false, got {spec!r}")
    for key in fields[kind]:
        if type(spec[key]) is not int:
            raise ValueError(f"scaling field {key!r} must be an integer, got {spec[key]!r}")
    args = {key: spec[key] for key in fields[kind]}
    cls = {"per-tensor": PerTensor, "per-axis": PerAxis, "per-block": PerBlock}[kind]
    return cls(power_of_two=spec["power_of_two"], **args)


def _exact_keys(spec: dict, keys: set[str]) -> None:
    if set(spec) != keys:
        missing = sorted(keys - set(spec))
        extra = sorted(set(spec) - keys)
        raise ValueError(f"fields missing {missing} / unexpected {extra} in {spec!r}")


# --------------------------------------------------------------------------
# trees <-> leaves


def _tensor_type() -> type | None:
    try:
        from ._tensor import Tensor
    except ImportError:  # the Tensor module is optional while it is being written
        return None
    return Tensor


def _path_entry(entry: Any) -> tuple[str, Any]:
    if isinstance(entry, tree_util.DictKey):
        key = entry.key
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise TypeError(
                f"cannot save a dict key {key!r} of type {type(key).__name__}: checkpoint keys "
                "must be strings or integers"
            )
        return ("key", key)
    if isinstance(entry, tree_util.SequenceKey):
        return ("index", entry.idx)
    if isinstance(entry, tree_util.GetAttrKey):
        return ("attr", entry.name)
    if isinstance(entry, tree_util.FlattenedIndexKey):
        return ("index", entry.key)
    raise TypeError(f"cannot save a tree whose key path holds {entry!r}")


def path_name(path: tuple[tuple[str, Any], ...]) -> str:
    """The tensor name of a key path: its keys joined with dots ('tensor' for the root)."""
    return ".".join(str(key) for _, key in path) if path else "tensor"


def _describe(path: tuple[tuple[str, Any], ...], leaf: Any) -> tuple[Leaf, list[np.ndarray]]:
    """A leaf's storage description and its arrays (data first)."""
    name = path_name(path)
    tensor_type = _tensor_type()
    if tensor_type is not None and isinstance(leaf, tensor_type):
        enc, dtype = leaf.encoded, np.dtype(leaf.dtype)
    elif isinstance(leaf, Encoded):
        enc, dtype = leaf, np.dtype(np.float32)
    else:
        arr = np.asarray(leaf)
        if arr.dtype not in _DTYPE_NAMES:
            raise TypeError(
                f"cannot save leaf {name!r} of type {type(leaf).__name__} and dtype {arr.dtype}: "
                f"a checkpoint holds Tensors and arrays of dtypes {sorted(map(str, _DTYPE_NAMES))}"
            )
        return Leaf(name, path, "array", arr.dtype, arr.shape), [arr]
    if dtype.name not in _LOGICAL:
        raise TypeError(f"cannot save Tensor {name!r} of logical dtype {dtype}")
    scale = None if enc.scale is None else name + SCALE_SUFFIX
    spec = Leaf(name, path, "tensor", dtype, tuple(enc.shape), enc.format, enc.scaling, scale)
    arrays = [np.asarray(enc.data)]
    if arrays[0].dtype == spec.container and spec.container != spec.data_dtype:
        arrays[0] = arrays[0].view(spec.data_dtype)
    if enc.scale is not None:
        arrays.append(np.asarray(enc.scale))
    for (aname, adtype, ashape), arr in zip(spec.arrays(), arrays, strict=True):
        if arr.dtype != adtype or tuple(arr.shape) != ashape:  # pragma: no cover - Encoded bug
            raise ValueError(
                f"leaf {name!r}: array {aname!r} is {arr.dtype}{list(arr.shape)}, expected "
                f"{adtype}{list(ashape)} for {spec.format.name}"
            )
    return spec, arrays


def flatten(tree: Any) -> list[tuple[Leaf, list[np.ndarray]]]:
    """Every leaf of `tree` (Tensors, Encoded values and arrays) with its arrays."""
    tensor_type = _tensor_type()
    leaf_types = (Encoded,) if tensor_type is None else (Encoded, tensor_type)
    pairs = tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, leaf_types))[0]
    out = [_describe(tuple(_path_entry(e) for e in path), leaf) for path, leaf in pairs]
    check_names([spec for spec, _ in out])
    return out


def check_names(leaves: list[Leaf]) -> None:
    """Raise ValueError when two stored arrays would share a name."""
    seen: dict[str, str] = {}
    for spec in leaves:
        for name, _, _ in spec.arrays():
            if name == "__metadata__" or name in seen:
                other = seen.get(name, "the header's metadata")
                raise ValueError(
                    f"two leaves would be stored under the name {name!r} ({other} and "
                    f"{spec.name}); rename one of the keys"
                )
            seen[name] = spec.name


def unflatten(items: list[tuple[tuple[tuple[str, Any], ...], Any]]) -> Any:
    """Rebuild nested dicts and lists from (key path, value) pairs."""
    if not items:
        return {}
    if any(not path for path, _ in items):
        if len(items) == 1:
            return items[0][1]
        raise ValueError("a leaf at the root cannot have siblings")
    kinds = {path[0][0] for path, _ in items}
    if len(kinds) > 1:
        raise ValueError(f"one level of the tree mixes key kinds {sorted(kinds)}")
    groups: dict[Any, list] = {}
    for path, value in items:
        groups.setdefault(path[0][1], []).append((path[1:], value))
    children = {key: unflatten(group) for key, group in groups.items()}
    if kinds == {"index"}:
        if sorted(children) != list(range(len(children))):
            raise ValueError(f"list indices {sorted(children)} are not 0..{len(children) - 1}")
        return [children[i] for i in range(len(children))]
    return children


# --------------------------------------------------------------------------
# reading


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized array whose buffer jax can alias without copying."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start : start + nbytes].view(dtype).reshape(shape)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors header: dtype, shape and absolute byte range."""

    name: str
    dtype_name: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def dtype(self) -> np.dtype:
        return _DTYPES[self.dtype_name]

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constants(token: str) -> Any:
    raise ValueError(f"{token} is not allowed")


def _parse_json(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_strict_object, parse_constant=_no_constants)


class Reader:
    """An open, fully validated checkpoint whose tensors are read one at a time.

    Opening parses and checks the header (and the `"precision"` metadata when
    present) against the file's size; no tensor data is read until `read`.
    Use as a context manager.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._file = open(self.path, "rb")
        try:
            self._parse()
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def error(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {what}")

    # -- header ------------------------------------------------------------
    def _parse(self) -> None:
        size = os.fstat(self._file.fileno()).st_size
        self.size = size
        if size < 8:
            raise self.error(
                f"not a safetensors file: {size} bytes is shorter than the 8-byte header length"
            )
        n = int.from_bytes(self._file.read(8), "little")
        if n > MAX_HEADER_BYTES:
            raise self.error(
                f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit "
                "(not a safetensors file, or corrupted)"
            )
        if 8 + n > size:
            raise self.error(
                f"truncated: the header claims {n} bytes but the file has only {size - 8} after "
                "the length field"
            )
        raw = self._file.read(n)
        try:
            text = raw.decode("utf-8")
            if not text.startswith("{"):
                raise ValueError("the header does not start with '{'")
            header = _parse_json(text)
        except (ValueError, RecursionError) as exc:
            raise self.error(
                f"not a safetensors file: the header is not valid JSON ({exc})"
            ) from None
        if not isinstance(header, dict):
            raise self.error("the header is not a JSON object")
        self.data_start = 8 + n
        meta = header.pop("__metadata__", {})
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            raise self.error("__metadata__ must map strings to strings")
        self.metadata: dict[str, str] = meta
        self.entries: dict[str, Entry] = {}
        for name, info in header.items():
            self.entries[name] = self._entry(name, info)
        self._check_layout()
        if _looks_like_ours(meta):
            if meta.get(VERSION_KEY) != str(VERSION) or METADATA_KEY not in meta:
                raise self.error(
                    f"the precision metadata is damaged or from another version: expected keys "
                    f"{METADATA_KEY!r} and {VERSION_KEY!r} = '{VERSION}', found "
                    f"{sorted(meta)!r:.200}"
                )
            self.leaves, self.crc = self._precision_leaves(meta[METADATA_KEY])
        else:
            self.leaves, self.crc = self._foreign_leaves(), None
        self.foreign = self.crc is None

    def _entry(self, name: str, info: Any) -> Entry:
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise self.error(
                f"tensor {name!r}: expected an object with dtype, shape and data_offsets, "
                f"got {info!r:.200}"
            )
        dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype_name not in _DTYPES:
            raise self.error(
                f"tensor {name!r}: unsupported dtype {dtype_name!r} (supported: "
                f"{', '.join(_DTYPES)})"
            )
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise self.error(f"tensor {name!r}: shape {shape!r} is not a list of sizes")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise self.error(f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end]")
        # Python integers: an absurd shape cannot overflow into a plausible size.
        expected = _DTYPES[dtype_name].itemsize
        for d in shape:
            expected *= d
        if expected != offsets[1] - offsets[0]:
            raise self.error(
                f"tensor {name!r}: shape {shape} of {dtype_name} needs {expected} bytes but "
                f"data_offsets {offsets} hold {offsets[1] - offsets[0]}"
            )
        begin, end = self.data_start + offsets[0], self.data_start + offsets[1]
        return Entry(name, dtype_name, tuple(shape), begin, end)

    def _check_layout(self) -> None:
        position = self.data_start
        for entry in sorted(self.entries.values(), key=lambda e: (e.begin, e.end)):
            if entry.begin != position:
                what = "overlaps the previous tensor" if entry.begin < position else "leaves a gap"
                raise self.error(
                    f"tensor {entry.name!r} starts at byte {entry.begin - self.data_start} of "
                    f"the data, which {what} (expected {position - self.data_start})"
                )
            position = entry.end
        if position != self.size:
            if position > self.size:
                raise self.error(
                    f"truncated: the header describes {position} bytes but the file has {self.size}"
                )
            raise self.error(
                f"{self.size - position} bytes after the last tensor (the header describes "
                f"{position}, the file has {self.size})"
            )

    def _foreign_leaves(self) -> list[Leaf]:
        leaves = []
        for name, entry in self.entries.items():
            fmt = _DTYPE_FORMATS.get(entry.dtype_name)
            path = (("key", name),)
            if fmt is None:
                leaves.append(Leaf(name, path, "array", entry.dtype, entry.shape))
            else:
                leaves.append(
                    Leaf(name, path, "tensor", np.dtype(np.float32), entry.shape, fmt, None)
                )
        return leaves

    def _precision_leaves(self, text: str) -> tuple[list[Leaf], dict[str, int]]:
        try:
            doc = _parse_json(text)
        except (ValueError, RecursionError) as exc:
            raise self.error(f"the precision metadata is not valid JSON ({exc})") from None
        if not isinstance(doc, dict) or set(doc) != {
            "version",
            "tensors",
            "tensors_crc32",
            "crc32",
        }:
            raise self.error(
                "the precision metadata needs exactly version, tensors, tensors_crc32 and crc32"
            )
        if doc["version"] != VERSION:
            raise self.error(
                f"precision metadata version {doc['version']!r} is not supported (this library "
                f"reads version {VERSION}); upgrade precision"
            )
        if not isinstance(doc["tensors"], list):
            raise self.error("the precision metadata's tensors is not a list")
        if doc["tensors_crc32"] != _tensors_crc(doc["tensors"]):
            raise self.error(
                "the precision metadata does not match its CRC-32 (the header is corrupted)"
            )
        leaves = [self._leaf(item) for item in doc["tensors"]]
        try:
            check_names(leaves)
        except ValueError as exc:
            raise self.error(f"precision metadata: {exc}") from None
        stored = {name for leaf in leaves for name, _, _ in leaf.arrays()}
        if stored != set(self.entries):
            raise self.error(
                "the precision metadata and the tensors disagree: described but absent "
                f"{sorted(stored - set(self.entries))}, present but undescribed "
                f"{sorted(set(self.entries) - stored)}"
            )
        crc = doc["crc32"]
        if (
            not isinstance(crc, dict)
            or set(crc) != stored
            or not all(isinstance(v, str) and re.fullmatch(r"[0-9a-f]{8}", v) for v in crc.values())
        ):
            raise self.error("the precision metadata's crc32 map is malformed")
        return leaves, {k: int(v, 16) for k, v in crc.items()}

    def _leaf(self, item: Any) -> Leaf:
        keys = {"name", "path", "kind", "format", "scaling", "dtype", "shape", "scale"}
        if not isinstance(item, dict) or set(item) != keys:
            raise self.error(f"precision metadata: malformed leaf {item!r:.200}")
        name = item["name"]
        if not isinstance(name, str):
            raise self.error(f"precision metadata: leaf name {name!r} is not a string")

        def bad(what: str) -> CheckpointError:
            return self.error(f"precision metadata of {name!r}: {what}")

        path = item["path"]
        if (
            not isinstance(path, list)
            or len(path) > _MAX_PATH_DEPTH
            or not all(
                isinstance(p, list)
                and len(p) == 2
                and (
                    (p[0] in ("key", "attr") and isinstance(p[1], str))
                    or (p[0] in ("key", "index") and type(p[1]) is int)
                )
                for p in path
            )
        ):
            raise bad(f"bad key path {path!r:.200}")
        if path_name(tuple((p[0], p[1]) for p in path)) != name:
            raise bad(f"key path {path!r:.200} does not give the name {name!r}")
        shape = item["shape"]
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise bad(f"bad shape {shape!r}")
        entry = self.entries.get(name)
        if entry is None:
            raise bad("its data tensor is missing from the file")
        try:
            fmt = None if item["format"] is None else format_from_json(item["format"])
            scaling = scaling_from_json(item["scaling"])
        except (ValueError, TypeError) as exc:
            raise bad(str(exc)) from None
        kind, dtype_name = item["kind"], item["dtype"]
        if kind == "array":
            if fmt is not None or scaling is not None or item["scale"] is not None:
                raise bad("a plain array has no format, scaling or scale")
            dtype = entry.dtype
            if dtype_name != dtype.name:
                raise bad(f"dtype {dtype_name!r} disagrees with the stored {dtype.name}")
        elif kind == "tensor":
            if fmt is None:
                raise bad("a tensor needs a format")
            if dtype_name not in _LOGICAL:
                raise bad(f"logical dtype {dtype_name!r} is not one of {sorted(_LOGICAL)}")
            dtype = _LOGICAL[dtype_name]
            if fmt.kind == "int" and scaling is None:
                raise bad(f"{fmt.name} codes need a scaling")
            scale = item["scale"]
            if (scaling is None) != (scale is None):
                raise bad("a scale array is stored exactly when a scaling is declared")
            if scale is not None and scale != name + SCALE_SUFFIX:
                raise bad(f"its scale must be stored as {name + SCALE_SUFFIX!r}, not {scale!r}")
            if scaling is not None and shape:
                try:
                    scaling.validate(tuple(shape))
                except ValueError as exc:
                    raise bad(str(exc)) from None
        else:
            raise bad(f"unknown kind {kind!r}")
        leaf = Leaf(
            name,
            tuple((p[0], p[1]) for p in path),
            kind,
            dtype,
            tuple(shape),
            fmt,
            scaling,
            item["scale"],
        )
        for aname, adtype, ashape in leaf.arrays():
            stored = self.entries.get(aname)
            if stored is None:
                raise bad(f"array {aname!r} is missing from the file")
            if stored.dtype != adtype or stored.shape != ashape:
                raise bad(
                    f"array {aname!r} is stored as {stored.dtype_name}{list(stored.shape)} but "
                    f"{'its format ' + fmt.name if fmt else 'the leaf'} with logical shape "
                    f"{list(shape)} needs {_DTYPE_NAMES[adtype]}{list(ashape)}"
                )
        return leaf

    # -- data --------------------------------------------------------------
    def read(self, name: str) -> np.ndarray:
        """The array stored as `name`, in a fresh aligned buffer, CRC-checked."""
        entry = self.entries[name]
        out = aligned_empty(entry.shape, entry.dtype)
        view = memoryview(out.reshape(-1).view(np.uint8))
        self._file.seek(entry.begin)
        done = 0
        while done < entry.nbytes:
            got = self._file.readinto(view[done:])
            if not got:
                raise self.error(f"tensor {name!r}: the file ended while reading it")
            done += got
        if self.crc is not None and zlib.crc32(view) != self.crc[name]:
            raise self.error(
                f"tensor {name!r}: its bytes do not match the CRC-32 recorded when it was saved "
                "(the file is corrupted)"
            )
        return out

    def iter_rows(self, name: str, rows: int) -> Iterator[np.ndarray]:
        """The array stored as `name` in slices of `rows` rows (first axis), CRC-checked.

        The CRC-32 covers the whole tensor, so a mismatch is raised after the
        last slice: a caller writing the slices somewhere must discard them
        then (`write` does, by raising through).
        """
        entry = self.entries[name]
        if not entry.shape:
            raise ValueError(f"tensor {name!r} is a scalar; read it with read()")
        row_shape = entry.shape[1:]
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * entry.dtype.itemsize
        crc = 0
        for start in range(0, entry.shape[0], rows):
            n = min(rows, entry.shape[0] - start)
            out = aligned_empty((n, *row_shape), entry.dtype)
            view = memoryview(out.reshape(-1).view(np.uint8))
            self._file.seek(entry.begin + start * row_bytes)
            done = 0
            while done < n * row_bytes:
                got = self._file.readinto(view[done:])
                if not got:
                    raise self.error(f"tensor {name!r}: the file ended while reading it")
                done += got
            if self.crc is not None:
                crc = zlib.crc32(view, crc)
            del view
            yield out
        if self.crc is not None and crc != self.crc[name]:
            raise self.error(
                f"tensor {name!r}: its bytes do not match the CRC-32 recorded when it was saved "
                "(the file is corrupted)"
            )

    def read_leaf(self, leaf: Leaf) -> tuple[np.ndarray, np.ndarray | None]:
        """(data, scale or None) of one leaf."""
        data = self.read(leaf.name)
        return data, (None if leaf.scale is None else self.read(leaf.scale))


def _to_jax(arr: np.ndarray) -> jax.Array | np.ndarray:
    """A jax array aliasing `arr`, or `arr` itself for 64-bit data jax would truncate."""
    if arr.dtype.itemsize == 8 and not jax.config.read("jax_enable_x64"):
        return arr
    return jax.device_put(arr)


def encoded(leaf: Leaf, data: np.ndarray, scale: np.ndarray | None) -> Encoded:
    """The `Encoded` storage of a tensor leaf from its arrays."""
    assert leaf.format is not None
    last = (leaf.shape[-1] if leaf.shape else None) if leaf.format.packed else None
    jdata = jax.device_put(data.view(leaf.container))
    jscale = None if scale is None else jax.device_put(scale)
    return Encoded(jdata, jscale, leaf.format, leaf.scaling, last)


def materialize(leaf: Leaf, data: np.ndarray, scale: np.ndarray | None, as_arrays: bool) -> Any:
    """The value a leaf loads as: a Tensor, or logical arrays when `as_arrays`."""
    if leaf.kind == "array":
        return _to_jax(data)
    dtype = leaf.dtype
    if dtype.itemsize == 8 and not jax.config.read("jax_enable_x64"):
        raise CheckpointError(
            f"{leaf.name!r} is a float64 Tensor; enable 64-bit JAX "
            "(jax.config.update('jax_enable_x64', True)) before loading it"
        )
    enc = encoded(leaf, data, scale)
    if as_arrays:
        return enc.decode(dtype)
    tensor_type = _tensor_type()
    if tensor_type is None:  # pragma: no cover - only while the Tensor module is missing
        return enc
    return tensor_type.from_encoded(enc, dtype=dtype)


# --------------------------------------------------------------------------
# writing


def _header_bytes(
    arrays: list[tuple[str, np.dtype, tuple[int, ...]]], metadata: dict[str, str]
) -> bytes:
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape in arrays:
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        header[name] = {
            "dtype": _DTYPE_NAMES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # keep the data 8-byte aligned, as other writers do
    return len(text).to_bytes(8, "little") + text


def _tensors_crc(tensors: list[Any]) -> str:
    """CRC-32 of the leaf descriptions in their compact JSON form."""
    return f"{binascii.crc32(json.dumps(tensors, separators=(',', ':')).encode()):08x}"


def _metadata(leaves: list[Leaf], crc: dict[str, int]) -> dict[str, str]:
    tensors = [leaf.to_json() for leaf in leaves]
    doc = {
        "version": VERSION,
        "tensors": tensors,
        "tensors_crc32": _tensors_crc(tensors),
        "crc32": {name: f"{value:08x}" for name, value in crc.items()},
    }
    return {VERSION_KEY: str(VERSION), METADATA_KEY: json.dumps(doc, separators=(",", ":"))}


def _looks_like_ours(meta: dict[str, str]) -> bool:
    """Whether a header's metadata was written by `save` (even if damaged since).

    A file whose metadata marker was corrupted must not load as a foreign
    file (its packed codes would come back as plain bytes), so any trace of
    ours counts: either key, a key that starts like them, or our document.
    """
    return any(
        key.startswith("precision") or value.startswith('{"version":')
        for key, value in meta.items()
    )


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


_LINKABLE: dict[int, bool] = {}


def _link_fd(fd: int, name: str) -> None:
    """Give the unnamed file open as `fd` the name `name`."""
    try:
        os.link(f"/proc/self/fd/{fd}", name, follow_symlinks=True)
        return
    except OSError as exc:
        first = exc
    # Some kernels refuse the /proc route (EXDEV); linkat(AT_EMPTY_PATH) needs
    # CAP_DAC_READ_SEARCH but works there.
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, at_empty_path = -100, 0x1000
    if libc.linkat(fd, b"", at_fdcwd, os.fsencode(name), at_empty_path) != 0:
        raise first


def _can_link(directory: str, device: int) -> bool:
    """Whether unnamed files on `device` can be given a name (probed once)."""
    if device not in _LINKABLE:
        ok = False
        probe = os.path.join(directory, f".precision-probe.{os.getpid()}.tmp")
        try:
            fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o600)
            try:
                _link_fd(fd, probe)
                os.unlink(probe)
                ok = True
            finally:
                os.close(fd)
        except OSError:
            pass
        _LINKABLE[device] = ok
    return _LINKABLE[device]


class _TempFile:
    """The file a checkpoint is written to before it is renamed into place.

    On Linux it is an unnamed `O_TMPFILE` inode in the destination directory:
    if the process dies (even by SIGKILL) the kernel discards it, so no
    partial file is ever left behind. It gets a name only once its bytes are
    on disk, for the atomic rename. Elsewhere it is a hidden `mkstemp` file
    that an error removes.
    """

    def __init__(self, path: str):
        self.path = path
        self.directory = os.path.dirname(os.path.abspath(path))
        self.name: str | None = None
        try:
            self.fd = self._open_unnamed()
            if self.fd is None:
                self.fd, self.name = tempfile.mkstemp(
                    prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=self.directory
                )
                os.fchmod(self.fd, 0o644)
        except OSError as exc:
            raise type(exc)(
                exc.errno,
                f"cannot write {path}: no file can be created in {self.directory} ({exc.strerror})",
            ) from None

    def _open_unnamed(self) -> int | None:
        if not hasattr(os, "O_TMPFILE"):
            return None
        try:
            fd = os.open(self.directory, os.O_TMPFILE | os.O_WRONLY, 0o644)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                return None  # the filesystem has no unnamed files: use a named one
            raise
        if _can_link(self.directory, os.fstat(fd).st_dev):
            return fd
        os.close(fd)
        return None

    def commit(self) -> None:
        """fsync the bytes, rename the file over `path`, fsync the directory."""
        os.fsync(self.fd)
        if self.name is None:
            name = os.path.join(
                self.directory, f".{os.path.basename(self.path)}.{os.getpid()}.{id(self):x}.tmp"
            )
            _link_fd(self.fd, name)
            self.name = name
        os.replace(self.name, self.path)
        self.name = None
        _fsync_dir(self.directory)

    def discard(self) -> None:
        """Remove whatever was written (an unnamed file vanishes on close)."""
        if self.name is not None:
            try:
                os.unlink(self.name)
            except FileNotFoundError:
                pass
            self.name = None


def write(
    path: str | os.PathLike,
    leaves: list[Leaf],
    produce: Iterable[tuple[str, np.ndarray]],
    *,
    overwrite: bool,
) -> int:
    """Atomically write a checkpoint of `leaves`, whose arrays `produce` yields in order.

    `produce` is consumed lazily, so a caller can compute one tensor at a time
    and peak memory stays at about one tensor. An array may also be given as
    an iterator of slices along its first axis (row blocks, in order), so a
    tensor never has to be whole in memory. Returns the bytes written.

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
        OSError: the destination directory cannot be written (named in the message).
    """
    path = os.fspath(path)
    if os.path.islink(path):
        path = os.path.realpath(path)  # replace the file the link points to, keep the link
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, f"cannot write {path}: it is a directory")
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(
            f"{path} already exists; pass overwrite=True (--overwrite on the command line) to "
            "replace it"
        )
    check_names(leaves)
    arrays = [a for leaf in leaves for a in leaf.arrays()]
    crc = {name: 0 for name, _, _ in arrays}
    header = _header_bytes(arrays, _metadata(leaves, crc))
    temp = _TempFile(path)
    try:
        with os.fdopen(temp.fd, "wb", closefd=False) as f:
            f.write(header)
            produced = iter(produce)
            for name, dtype, shape in arrays:
                got_name, arr = next(produced)
                whole = isinstance(arr, np.ndarray)
                if got_name != name or (
                    whole and (arr.dtype != dtype or tuple(arr.shape) != tuple(shape))
                ):
                    raise ValueError(  # a bug in the caller, never silently written
                        f"expected array {name!r} {dtype}{list(shape)}, got {got_name!r} "
                        f"{getattr(arr, 'dtype', '')}{list(getattr(arr, 'shape', ''))}"
                    )
                value, written = 0, 0
                for part in [arr] if whole else arr:
                    if part.dtype != dtype or tuple(part.shape[1:]) != tuple(shape[1:]):
                        raise ValueError(
                            f"array {name!r}: a slice of {part.dtype}{list(part.shape)} does not "
                            f"fit {dtype}{list(shape)}"
                        )
                    view = memoryview(np.ascontiguousarray(part).reshape(-1).view(np.uint8))
                    value = zlib.crc32(view, value)
                    f.write(view)
                    written += len(view)
                    del view, part
                if written != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
                    raise ValueError(f"array {name!r}: {written} bytes produced, not {shape}")
                crc[name] = value
                del arr
            final = _header_bytes(arrays, _metadata(leaves, crc))
            assert len(final) == len(header)  # fixed-width CRCs: same length
            f.seek(0)
            f.write(final)
            size = f.seek(0, os.SEEK_END)
        temp.commit()
    except BaseException:
        temp.discard()
        raise
    finally:
        os.close(temp.fd)
    return size


# --------------------------------------------------------------------------
# public API


def save(path: str | os.PathLike, tree: Any, *, overwrite: bool = False) -> None:
    """Save a tree of Tensors and arrays to a safetensors file, atomically.

    Every leaf is stored exactly: a reduced Tensor as its container codes and
    float32 scales, with its format, scaling, logical dtype, shape and key path
    in the header's metadata; a plain array as it is. The file is written to
    a temporary file beside `path`, fsynced and renamed, so an error or a
    crash never leaves a partial file or damages an existing one.

    Args:
        path: destination file.
        tree: any pytree of `precision.Tensor`, `dtypes.Encoded` and arrays.
        overwrite: replace an existing file. Off by default, so a checkpoint
            (or the input of a conversion) is never replaced by accident.

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
        TypeError: a leaf is neither a Tensor nor an array of a storable dtype.
        ValueError: two leaves would be stored under the same name.
        OSError: the destination cannot be written.

    Examples:
        >>> import os, tempfile, numpy as np, precision
        >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        >>> w = precision.Tensor(np.array([[0.5, -1.25]], np.float32))
        >>> precision.save(path, {"w": w.to_reduced_precision("int4")})
        >>> precision.load(path)["w"].format.name
        'int4'
    """
    described = flatten(tree)
    leaves = [spec for spec, _ in described]
    pairs = (
        (name, arr)
        for spec, arrays in described
        for (name, _, _), arr in zip(spec.arrays(), arrays, strict=True)
    )
    write(path, leaves, pairs, overwrite=overwrite)


def load(path: str | os.PathLike, *, as_arrays: bool = False) -> Any:
    """Load a checkpoint written by `save`, or any safetensors file.

    A file written by `save` comes back as the nested dicts and lists of its
    key paths (tuples and custom pytree nodes come back as lists and dicts)
    with each Tensor in its stored format, bit for bit. A foreign
    safetensors file comes back as a dict of name to full-precision float32
    Tensor (F16, BF16 and F8 values widened exactly); integer and bool
    tensors load as arrays. Convert with `to_reduced_precision` to store them
    narrow again.

    Args:
        path: the file.
        as_arrays: give logical `jax.Array`s (decoded values) instead of Tensors.

    Returns:
        The tree.

    Raises:
        CheckpointError: the file is truncated, corrupted, not safetensors, or
            names a format or layout this library does not know.
        OSError: the file cannot be opened.

    Examples:
        >>> import os, tempfile, numpy as np, precision
        >>> path = os.path.join(tempfile.mkdtemp(), "x.safetensors")
        >>> precision.save(path, {"layers": [np.float32([1.5, 2.0])]})
        >>> precision.load(path, as_arrays=True)["layers"][0].tolist()
        [1.5, 2.0]
    """
    with Reader(path) as reader:
        items = []
        for leaf in reader.leaves:
            data, scale = reader.read_leaf(leaf)
            value = materialize(leaf, data, scale, as_arrays)
            if reader.foreign and not as_arrays and leaf.kind != "array":
                # Another framework's F16/BF16 weights are its full-precision
                # values: widen them (exactly) to full-precision float32.
                value = value.to_full_precision()
            items.append((leaf.path, value))
        try:
            return unflatten(items)
        except (ValueError, RecursionError) as exc:
            raise reader.error(f"the key paths do not form a tree ({exc})") from None
