"""How a checkpoint is laid out: what each tree leaf is stored as, and trees <-> leaves.

Layout (see docs/cli.md, "Checkpoints"): an 8-byte little-endian header
length, a JSON header mapping tensor names to `dtype`, `shape` and
`data_offsets`, with a `__metadata__` map of strings, then the raw bytes.
A reduced Tensor is stored as its container array under its key-path name and
its float32 scales under `name + ":scale"`; the `"precision"` metadata entry is
a JSON document describing every leaf (key path, format, scaling, logical
dtype and shape) and the CRC-32 of every tensor.

This module holds what the reader (`_reader`) and the writer (`_io`) share:
the safetensors dtype tables, the limits of a checkpoint, `Leaf` (one entry
of the `"precision"` metadata), formats and scalings as JSON, key paths and
the tensor names they give, `flatten`/`unflatten`, the CRC-32 of the leaf
descriptions, and the invariants of stored encodings (`data_violation`,
`scale_violation`), which the writer checks before a file is written and the
reader after each tensor is read: `save` never writes what `load` refuses.
"""

from __future__ import annotations

import binascii
import dataclasses
import json
from typing import Any

import jax
import ml_dtypes
import numpy as np
from jax import tree_util

import dtypes
from dtypes import Encoded, FloatFormat, Format, IntFormat, PerAxis, PerBlock, PerTensor, Scaling

from .._errors import CheckpointError, SaveError, SaveTypeError

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
_LOGICAL: dict[str, np.dtype] = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}

# -- limits ---------------------------------------------------------------
# Bounds on what one file may declare, checked before anything is allocated
# (documented in docs/checkpoints.md). They are far above real models and
# make a header's cost proportional to its size: a hostile header cannot
# make `load` build millions of objects or arrays whose sizes overflow.

#: Arrays in one file (a reduced Tensor stores two: its codes and its scales).
MAX_ARRAYS = 1 << 16
#: Characters of one array name (its key path joined with dots).
MAX_NAME_LENGTH = 4096
#: Dimensions of one array (numpy 1.x's own limit).
MAX_RANK = 32
#: Product of the dimensions of one shape, zero dimensions counted as 1 (so a
#: zero-size shape cannot hide a dimension that overflows numpy's sizes).
MAX_ELEMENTS = 1 << 48
#: Keys in one leaf's key path.
MAX_PATH_DEPTH = 256
#: JSON values one header (or its precision metadata) may hold, bounded before
#: it is parsed by counting the bytes `,` `[` `{` (each value but the first
#: of a container follows a comma): parsing builds at most this many objects.
#: A flat tree saved by `save` needs about 17 per array.
MAX_JSON_TOKENS = 1 << 23

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
        return fmt.data_shape(self.shape)

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
            scale_shape = self.scale_shape
            assert scale_shape is not None  # a stored scale comes with its scaling
            out.append((self.scale, np.dtype(np.float32), scale_shape))
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
    clash = _builtin_named(fmt.name)
    if clash is not None and clash != fmt:
        raise SaveError(
            f"cannot save a {fmt!r} under the name {fmt.name!r}, which is the built-in "
            f"{clash!r}: a file reader would take one for the other; give it another name, "
            f"e.g. {type(fmt).__name__}(..., name='{fmt.name}_custom')"
        )
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
    raise SaveTypeError(
        f"cannot store format {fmt!r}: only FloatFormat and IntFormat are supported"
    )


def _builtin_named(name: str) -> Format | None:
    """The built-in format a name or alias denotes, if any."""
    try:
        return dtypes.get(name)
    except (ValueError, TypeError):
        return None


def format_from_json(spec: Any) -> Format:
    """Inverse of `format_to_json`; raises `CheckpointError` on a bad spec.

    The error names no file; the reader adds its path.
    """
    if isinstance(spec, str):
        if spec not in dtypes.FORMATS:
            raise CheckpointError(f"unknown format {spec!r} (known: {', '.join(dtypes.FORMATS)})")
        return dtypes.FORMATS[spec]
    if not isinstance(spec, dict):
        raise CheckpointError(f"a format is a name or an object, got {spec!r}")
    kind = spec.get("kind")
    if kind == "float":
        _exact_keys(
            spec, {"kind", "exponent_bits", "mantissa_bits", "finite", "nan", "saturate", "name"}
        )
        for key in ("exponent_bits", "mantissa_bits"):
            if type(spec[key]) is not int:
                raise CheckpointError(f"format field {key!r} must be an integer, got {spec[key]!r}")
        for key in ("finite", "nan", "saturate"):
            if type(spec[key]) is not bool:
                raise CheckpointError(
                    f"format field {key!r} must be true or false, got {spec[key]!r}"
                )
        if not isinstance(spec["name"], str):
            raise CheckpointError(f"format name must be a string, got {spec['name']!r}")
        fmt: Format = FloatFormat(
            spec["exponent_bits"],
            spec["mantissa_bits"],
            finite=spec["finite"],
            nan=spec["nan"],
            saturate=spec["saturate"],
            name=spec["name"],
        )
        return _no_clash(fmt)
    if kind == "int":
        _exact_keys(spec, {"kind", "bits", "name"})
        if type(spec["bits"]) is not int or not isinstance(spec["name"], str):
            raise CheckpointError(f"bad int format {spec!r}")
        return _no_clash(IntFormat(spec["bits"], name=spec["name"]))
    raise CheckpointError(f"unknown format kind {kind!r} in {spec!r}")


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
        raise SaveTypeError(f"cannot store scaling {scaling!r}")
    out["power_of_two"] = scaling.power_of_two
    return out


def scaling_from_json(spec: Any) -> Scaling | None:
    """Inverse of `scaling_to_json`; raises ValueError on a bad spec."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise CheckpointError(f"a scaling is an object or null, got {spec!r}")
    kind = spec.get("type")
    fields = {"per-tensor": (), "per-axis": ("axis",), "per-block": ("size", "axis")}
    if not isinstance(kind, str) or kind not in fields:
        raise CheckpointError(f"unknown scaling type {kind!r:.100}")
    _exact_keys(spec, {"type", "power_of_two", *fields[kind]})
    if type(spec["power_of_two"]) is not bool:
        raise CheckpointError(f"scaling power_of_two must be true or false, got {spec!r}")
    for key in fields[kind]:
        if type(spec[key]) is not int:
            raise CheckpointError(f"scaling field {key!r} must be an integer, got {spec[key]!r}")
        if not -MAX_RANK <= spec[key] <= (MAX_ELEMENTS if key == "size" else MAX_RANK):
            raise CheckpointError(f"scaling field {key!r} = {spec[key]} is out of range")
    args = {key: spec[key] for key in fields[kind]}
    cls = {"per-tensor": PerTensor, "per-axis": PerAxis, "per-block": PerBlock}[kind]
    return cls(power_of_two=spec["power_of_two"], **args)


def _no_clash(fmt: Format) -> Format:
    """`fmt`, unless its name is a built-in format's that it is not."""
    clash = _builtin_named(fmt.name)
    if clash is not None and clash != fmt:
        raise CheckpointError(
            f"a custom format {fmt!r} is named {fmt.name!r}, the name of the built-in {clash!r} "
            "(save never writes this)"
        )
    return fmt


def _exact_keys(spec: dict, keys: set[str]) -> None:
    if set(spec) != keys:
        missing = sorted(keys - set(spec))
        extra = sorted(set(spec) - keys)
        raise CheckpointError(f"fields missing {missing} / unexpected {extra} in {spec!r}")


def _tensors_crc(tensors: list[Any]) -> str:
    """CRC-32 of the leaf descriptions in their compact JSON form."""
    return f"{binascii.crc32(json.dumps(tensors, separators=(',', ':')).encode()):08x}"


# --------------------------------------------------------------------------
# trees <-> leaves


def _tensor_type() -> type[Any] | None:
    try:
        from .._tensor import Tensor
    except ImportError:  # the Tensor module is optional while it is being written
        return None
    return Tensor


def _path_entry(entry: Any) -> tuple[str, Any]:
    if isinstance(entry, tree_util.DictKey):
        key = entry.key
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise SaveTypeError(
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
    raise SaveTypeError(f"cannot save a tree whose key path holds {entry!r}")


def path_name(path: tuple[tuple[str, Any], ...]) -> str:
    """The tensor name of a key path: its keys joined with dots ('tensor' for the root)."""
    return ".".join(str(key) for _, key in path) if path else "tensor"


def unstored_layout(fmt: Format, scaling: Scaling | None) -> str | None:
    """What this file layout cannot yet describe of an encoding (narrow or two-level
    scales, zero points, code books, named compositions), or None when it can."""
    if not isinstance(fmt, FloatFormat | IntFormat):
        return f"the {fmt.name} encoding ({type(fmt).__name__})"
    if getattr(fmt, "scaling", None) is not None:
        return f"the composition {fmt.name} (a format carrying its scaling)"
    if scaling is not None and scaling.scale_format != "float32":
        return f"{scaling.scale_format} scales"
    return None


def _refuse_unstored_layout(name: str, enc: Encoded) -> None:
    """Refuse what `unstored_layout` names, before anything is written."""
    what = unstored_layout(enc.format, enc.scaling)
    if what is None and (enc.tensor_scale is not None or enc.zero_point is not None):
        what = "a tensor scale or zero points"
    if what is not None:
        raise SaveTypeError(
            f"cannot save {name!r}: checkpoints do not store {what} yet (only FloatFormat and "
            "IntFormat element formats with float32 scales); keep such tensors out of the "
            "tree, or re-encode them with float32 scales (e.g. PerBlock(32, power_of_two=True))"
        )


def _describe(path: tuple[tuple[str, Any], ...], leaf: Any) -> tuple[Leaf, list[np.ndarray]]:
    """A leaf's storage description and its arrays (data first)."""
    name = path_name(path)
    tensor_type = _tensor_type()
    if tensor_type is not None and isinstance(leaf, tensor_type):
        enc, dtype = leaf.encoded, np.dtype(leaf.dtype)
    elif isinstance(leaf, Encoded):
        enc, dtype = leaf, np.dtype(np.float32)
    else:
        dt = getattr(leaf, "dtype", None)
        if dt is not None and jax.dtypes.issubdtype(dt, jax.dtypes.prng_key):
            raise SaveTypeError(
                f"cannot save leaf {name!r}: it is a PRNG key ({dt}), not numbers; store its "
                "key data instead (jax.random.key_data(key), restored with "
                "jax.random.wrap_key_data), or leave the key out of the saved tree"
            )
        arr = np.asarray(leaf)
        if arr.dtype not in _DTYPE_NAMES:
            raise SaveTypeError(
                f"cannot save leaf {name!r} of type {type(leaf).__name__} and dtype {arr.dtype}: "
                f"a checkpoint holds Tensors and arrays of dtypes {sorted(map(str, _DTYPE_NAMES))}"
            )
        return Leaf(name, path, "array", arr.dtype, arr.shape), [arr]
    if dtype.name not in _LOGICAL:
        raise SaveTypeError(
            f"cannot save Tensor {name!r} of logical dtype {dtype}: a checkpoint holds "
            f"{' and '.join(_LOGICAL)} Tensors; convert it with .astype('float32') first"
        )
    _refuse_unstored_layout(name, enc)
    scale = None if enc.scale is None else name + SCALE_SUFFIX
    spec = Leaf(name, path, "tensor", dtype, tuple(enc.shape), enc.format, enc.scaling, scale)
    arrays = [np.asarray(enc.data)]
    if arrays[0].dtype == spec.container and spec.container != spec.data_dtype:
        arrays[0] = arrays[0].view(spec.data_dtype)
    if enc.scale is not None:
        arrays.append(np.asarray(enc.scale))
    check_limits([spec])
    for (aname, adtype, ashape), arr in zip(spec.arrays(), arrays, strict=True):
        if arr.dtype != adtype or tuple(arr.shape) != ashape:  # pragma: no cover - Encoded bug
            raise SaveError(
                f"leaf {name!r}: array {aname!r} is {arr.dtype}{list(arr.shape)}, expected "
                f"{adtype}{list(ashape)} for {enc.format.name}"
            )
    problem = data_violation(spec, arrays[0]) or (
        None if enc.scale is None else scale_violation(spec, arrays[1])
    )
    if problem is not None:
        raise SaveError(
            f"cannot save {name!r}: its {enc.format.name} encoding {problem}, which no encoder "
            "produces (load would refuse the file); re-encode it from finite values with "
            f"to_reduced_precision({enc.format.name!r})"
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


def _specials(text: str) -> int:
    return text.count(",") + text.count("[") + text.count("{")


def _json_tokens_bound(spec: Leaf) -> int:
    """More than the `,` `[` `{` a leaf adds to a header (entries, metadata, CRCs)."""
    tokens = 40 + 4 * len(spec.path) + 2 * len(spec.shape) + 4 * _specials(spec.name)
    tokens += sum(_specials(str(key)) for _, key in spec.path)
    for name, _, shape in spec.arrays():
        tokens += 8 + len(shape) + 3 * _specials(name)
    return tokens


def check_limits(leaves: list[Leaf]) -> None:
    """Raise `SaveError` when leaves exceed what a checkpoint may hold (`MAX_*`)."""
    count = 0
    tokens = 0
    for spec in leaves:
        tokens += _json_tokens_bound(spec)
        if len(spec.path) > MAX_PATH_DEPTH:
            raise SaveError(
                f"cannot save {spec.name[:200]!r}: its key path has {len(spec.path)} keys, more "
                f"than a checkpoint's {MAX_PATH_DEPTH}; flatten the tree first"
            )
        for name, _, shape in spec.arrays():
            count += 1
            problem = name_problem(name) or shape_problem(shape)
            if problem is None and spec.shape != shape:
                problem = shape_problem(spec.shape)
            if problem is not None:
                raise SaveError(
                    f"cannot save {name[:200]!r}: {problem}; split the tree or the tensor"
                )
    if count > MAX_ARRAYS:
        raise SaveError(
            f"cannot save {count} arrays in one checkpoint (the limit is {MAX_ARRAYS}); save "
            "the tree in several files"
        )
    if tokens > MAX_JSON_TOKENS:
        raise SaveError(
            f"cannot save this tree in one checkpoint: its header would hold up to {tokens} "
            f"JSON values (the limit is {MAX_JSON_TOKENS}; deep key paths cost the most); "
            "save the tree in several files"
        )


def name_problem(name: str) -> str | None:
    """Why `name` cannot name an array in a checkpoint, or None."""
    if len(name) > MAX_NAME_LENGTH:
        return f"its name has {len(name)} characters, more than the limit of {MAX_NAME_LENGTH}"
    return None


def shape_problem(shape: tuple[int, ...]) -> str | None:
    """Why `shape` is beyond a checkpoint's limits (`MAX_RANK`, `MAX_ELEMENTS`), or None."""
    if len(shape) > MAX_RANK:
        return f"its shape has {len(shape)} dimensions, more than the limit of {MAX_RANK}"
    total = 1
    for d in shape:
        total *= max(d, 1)  # Python integers: no overflow
        if total > MAX_ELEMENTS:
            return (
                f"its shape {list(shape)!s:.200} exceeds the limit of 2**48 elements (zero "
                "dimensions counted as 1)"
            )
    return None


def check_names(leaves: list[Leaf]) -> None:
    """Raise `SaveError` when two stored arrays would share a name or the limits are exceeded."""
    check_limits(leaves)
    seen: dict[str, str] = {}
    for spec in leaves:
        for name, _, _ in spec.arrays():
            if name == "__metadata__" or name in seen:
                other = seen.get(name, "the header's metadata")
                raise SaveError(
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
        raise CheckpointError("a leaf at the root cannot have siblings")
    kinds = {path[0][0] for path, _ in items}
    if len(kinds) > 1:
        raise CheckpointError(f"one level of the tree mixes key kinds {sorted(kinds)}")
    groups: dict[Any, list] = {}
    for path, value in items:
        groups.setdefault(path[0][1], []).append((path[1:], value))
    children = {key: unflatten(group) for key, group in groups.items()}
    if kinds == {"index"}:
        if sorted(children) != list(range(len(children))):
            raise CheckpointError(
                f"list indices {sorted(children)!s:.200} are not 0..{len(children) - 1}"
            )
        return [children[i] for i in range(len(children))]
    return children


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


def _slices(flat: np.ndarray):
    for start in range(0, flat.size, _CHUNK):
        yield flat[start : start + _CHUNK]


def _any(flat: np.ndarray, bad) -> bool:
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
    return (bits.astype(np.uint16) * weights).sum(axis=-1, dtype=np.uint16)


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
    if leaf.kind != "tensor" or not isinstance(fmt, FloatFormat | IntFormat) or data.size == 0:
        return None  # other kinds of format are not stored (`format_to_json` refuses them)
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


def scale_violation(leaf: Leaf, scale: np.ndarray) -> str | None:
    """Why `scale` (a leaf's float32 scales) holds a value no encoder gives, or None.

    Every scale is a positive, finite float32 normal (an all-zero group gets
    1, a tiny one 2**-126) small enough that the format's largest code times
    it is finite; int1's scale is a mean of |x|, which is 0 for an all-zero
    group; under `power_of_two` every scale is an exact power of two.
    """
    fmt = leaf.format
    if leaf.kind != "tensor" or leaf.scaling is None or scale.size == 0:
        return None
    if not isinstance(fmt, FloatFormat | IntFormat):
        return None  # other kinds of format are not stored (`format_to_json` refuses them)
    if np.dtype(scale.dtype) != np.float32:
        return None  # only float32 scales are stored (`Leaf.arrays`); the shape check refuses
    u = np.asarray(scale).reshape(-1).view(np.uint32)
    binary = isinstance(fmt, IntFormat) and fmt.binary
    top = float(fmt.qmax if isinstance(fmt, IntFormat) else fmt.max)
    for part in _slices(u):
        if np.any(part >> np.uint32(31)):
            return "has a negative scale"
        if np.any(part >= np.uint32(0x7F800000)):
            return "has an infinite or NaN scale (from non-finite input?)"
        small = part < np.uint32(_TINY32)
        if binary:
            small &= part != 0
        if np.any(small):
            return "has a zero or subnormal scale (every scale is at least 2**-126)"
        if leaf.scaling.power_of_two and np.any(part & np.uint32(0x7FFFFF)):
            return "has a scale that is not a power of two under power_of_two=True"
        # Encoders pick scales so that the largest code decodes finite.
        if np.any(part.view(np.float32).astype(np.float64) * top > _F32_MAX):
            return f"has a scale so large that {top:g} times it overflows float32"
    return None
