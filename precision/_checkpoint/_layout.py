"""How a checkpoint is laid out: what each tree leaf is stored as, and trees <-> leaves.

Layout (see docs/cli.md, "Checkpoints"): an 8-byte little-endian header
length, a JSON header mapping tensor names to `dtype`, `shape` and
`data_offsets`, with a `__metadata__` map of strings, then the raw bytes.
A reduced Tensor is stored as its container array under its key-path name and
its float32 scales under `name + ":scale"`; the `"precision"` metadata entry is
a JSON document describing every leaf (key path, format, scaling, logical
dtype and shape) and the CRC-32 of every tensor.

This module holds what the reader (`_checkpoint_reader`) and the writer
(`_io`) share: the safetensors dtype tables, `Leaf` (one entry of the
`"precision"` metadata), formats and scalings as JSON, key paths and the
tensor names they give, `flatten`/`unflatten`, and the CRC-32 of the leaf
descriptions.
"""

from __future__ import annotations

import binascii
import dataclasses
import json
from typing import Any

import ml_dtypes
import numpy as np
from jax import tree_util

import dtypes
from dtypes import Encoded, FloatFormat, Format, IntFormat, PerAxis, PerBlock, PerTensor, Scaling
from dtypes._packing import packed_length

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

#: Logical dtypes a Tensor may declare.
_LOGICAL = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}

METADATA_KEY = "precision"
VERSION_KEY = "precision_version"  # a second marker: one damaged key cannot pass as foreign
VERSION = 1
SCALE_SUFFIX = ":scale"


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


def _tensors_crc(tensors: list[Any]) -> str:
    """CRC-32 of the leaf descriptions in their compact JSON form."""
    return f"{binascii.crc32(json.dumps(tensors, separators=(',', ':')).encode()):08x}"


# --------------------------------------------------------------------------
# trees <-> leaves


def _tensor_type() -> type | None:
    try:
        from .._tensor import Tensor
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
