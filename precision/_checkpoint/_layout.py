"""How a checkpoint is laid out: what each tree leaf is stored as, and trees <-> leaves.

Layout (see docs/cli.md, "Checkpoints"): an 8-byte little-endian header
length, a JSON header mapping tensor names to `dtype`, `shape` and
`data_offsets`, with a `__metadata__` map of strings, then the raw bytes.
A reduced Tensor is stored as its container array under its key-path name,
its scales (in their scale format) under `name + ":scale"`, a two-level
encoding's float32 tensor scale under `name + ":tensor_scale"` and an
asymmetric encoding's zero points under `name + ":zero_point"`; the
`"precision"` metadata entry is a JSON document describing every leaf (key
path, format, scaling, logical dtype and shape) and the CRC-32 of every
tensor.

Versions: a file whose leaves all fit layout 1 (FloatFormat and IntFormat
element formats, float32 scales) is written as version 1, which older
readers read; anything else (scale formats, tensor scales, zero points,
code books, compositions, E8M0) as version 2, whose leaves and scalings
carry the extra fields. The reader reads both.

This module holds what the reader (`_reader`) and the writer (`_io`) share:
the safetensors dtype tables, the limits of a checkpoint, `Leaf` (one entry
of the `"precision"` metadata), formats and scalings as JSON, key paths and
the tensor names they give, `flatten`/`unflatten`, the CRC-32 of the leaf
descriptions, and the invariants of stored encodings (`data_violation`,
`scale_violation`, `tensor_scale_violation`, `zero_point_violation`), which
the writer checks before a file is written and the reader after each tensor
is read: `save` never writes what `load` refuses.
"""

from __future__ import annotations

import binascii
import dataclasses
import json
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

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
    PerAxis,
    PerBlock,
    PerTensor,
    Scaling,
)

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
# (documented in docs/cli.md, "Safety"). They are far above real models and
# make a header's cost proportional to its size: a hostile header cannot
# make `load` build millions of objects or arrays whose sizes overflow.

#: Arrays in one file (a reduced Tensor stores up to four: its codes, its scales,
#: a tensor scale and zero points).
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
VERSION = 2  # the newest layout; a file is written at the lowest version that describes it
VERSIONS = (1, 2)  # the layouts the reader reads
SCALE_SUFFIX = ":scale"
TENSOR_SCALE_SUFFIX = ":tensor_scale"
ZERO_POINT_SUFFIX = ":zero_point"

#: numpy types of the scale arrays in memory, by `Scaling.scale_format`. In the
#: file, a type safetensors has no name for (E8M0) is stored as its bytes (U8).
SCALE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float8_e8m0fnu": np.dtype(ml_dtypes.float8_e8m0fnu),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
#: e4m3's largest value: the bound of a two-level (NVFP4) block scale.
E4M3_MAX = 448.0


def file_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype an array of `dtype` is stored as: itself, or its bytes (U8) when
    safetensors has no name for it (ml_dtypes' float8_e4m3, float8_e3m4, E8M0)."""
    return dtype if dtype in _DTYPE_NAMES else np.dtype(np.uint8)


def two_level(scaling: Scaling | None) -> bool:
    """Whether `scaling` keeps a float32 tensor scale above e4m3 block scales (NVFP4)."""
    return scaling is not None and scaling.scale_format == "float8_e4m3fn"


def e8m0_offset(fmt: Format) -> int:
    """log2 of the implicit scale of `fmt`'s elements that an E8M0 byte folds in.

    The OCP MX rule: MXINT8's elements are `code / 64`, so for an integer
    format the byte holds `log2(scale) + floor(log2(qmax)) + 127`; for float
    elements (and in every other scale format) the offset is 0.
    """
    if isinstance(fmt, IntFormat) and not fmt.binary:
        return math.floor(math.log2(fmt.qmax))
    return 0


def element_top(fmt: Format) -> float:
    """The largest magnitude a code of `fmt` is multiplied by its scale with."""
    if isinstance(fmt, IntFormat | AsymmetricIntFormat):
        return float(fmt.qmax)
    return float(fmt.max)


#: The arrays a tensor leaf may store, in file order, and what messages call them.
ROLES = ("data", "scale", "tensor_scale", "zero_point")
ROLE_WORDS = {
    "data": "codes",
    "scale": "scales",
    "tensor_scale": "tensor scale",
    "zero_point": "zero points",
}


class Stored(NamedTuple):
    """The arrays of one leaf as read from a file (views of the file's dtypes)."""

    data: np.ndarray
    scale: np.ndarray | None = None
    tensor_scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None


# --------------------------------------------------------------------------
# leaves: what one tree leaf is stored as


@dataclasses.dataclass(frozen=True)
class Leaf:
    """How one tree leaf is stored (one entry of the `"precision"` metadata).

    `kind` is `"tensor"` (a precision Tensor: `format`, `scaling` and logical
    `dtype` apply, `scale`, `tensor_scale` and `zero_point` name the arrays
    beside the codes, each None when the encoding has none) or `"array"` (a
    plain array stored as it is: `format` and `scaling` are None).
    """

    name: str
    path: tuple[tuple[str, Any], ...]
    kind: str
    dtype: np.dtype
    shape: tuple[int, ...]
    format: Format | None = None
    scaling: Scaling | None = None
    scale: str | None = None
    tensor_scale: str | None = None
    zero_point: str | None = None

    @classmethod
    def tensor(
        cls,
        name: str,
        path: tuple[tuple[str, Any], ...],
        dtype: np.dtype,
        shape: tuple[int, ...],
        fmt: Format,
        scaling: Scaling | None,
    ) -> Leaf:
        """A tensor leaf with the arrays its encoding stores, named after `name`."""
        scaled = scaling is not None
        return cls(
            name,
            path,
            "tensor",
            dtype,
            shape,
            fmt,
            scaling,
            name + SCALE_SUFFIX if scaled else None,
            name + TENSOR_SCALE_SUFFIX if two_level(scaling) else None,
            name + ZERO_POINT_SUFFIX if scaled and isinstance(fmt, AsymmetricIntFormat) else None,
        )

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
        safetensors name (ml_dtypes' float8_e4m3, float8_e3m4, E8M0).
        """
        return file_dtype(self.container)

    @property
    def scale_container(self) -> np.dtype | None:
        """numpy dtype of the scale array in memory (its scale format), or None."""
        return None if self.scaling is None else SCALE_DTYPES[self.scaling.scale_format]

    @property
    def scale_shape(self) -> tuple[int, ...] | None:
        """Shape of the stored scale array, or None when there is none."""
        if self.scaling is None:
            return None
        return self.scaling.scale_shape(self.shape) if self.shape else ()

    def roles(self) -> list[str]:
        """What each array of `arrays()` holds: a name of `ROLES`."""
        return [r for r in ROLES if r == "data" or getattr(self, r) is not None]

    @property
    def version(self) -> int:
        """The lowest layout version that describes this leaf."""
        fmt, scaling = self.format, self.scaling
        if fmt is None:
            return 1
        if not isinstance(fmt, FloatFormat | IntFormat) or fmt.scaling is not None:
            return 2
        if scaling is not None and scaling.scale_format != "float32":
            return 2
        return 1

    def arrays(self) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
        """The (name, file dtype, shape) of every array this leaf stores, data first."""
        out = [(self.name, self.data_dtype, self.data_shape)]
        scale_shape, scale_container = self.scale_shape, self.scale_container
        if self.scale is not None:
            assert scale_shape is not None  # a stored scale comes with its scaling
            assert scale_container is not None
            out.append((self.scale, file_dtype(scale_container), scale_shape))
        if self.tensor_scale is not None:
            out.append((self.tensor_scale, np.dtype(np.float32), ()))
        if self.zero_point is not None:
            assert scale_shape is not None  # zero points come with scales
            out.append((self.zero_point, np.dtype(np.uint8), scale_shape))
        return out

    def to_json(self, version: int = VERSION) -> dict[str, Any]:
        out = {
            "name": self.name,
            "path": [list(p) for p in self.path],
            "kind": self.kind,
            "format": None if self.format is None else format_to_json(self.format, version),
            "scaling": scaling_to_json(self.scaling, version),
            "dtype": self.dtype.name,
            "shape": list(self.shape),
            "scale": self.scale,
        }
        if version >= 2:
            out["tensor_scale"] = self.tensor_scale
            out["zero_point"] = self.zero_point
        return out


def format_to_json(fmt: Format, version: int = VERSION) -> str | dict[str, Any]:
    """A format as its canonical name, or its full parameters.

    Layout 1 names the formats of `dtypes.FORMATS` and spells out custom
    float and int layouts. Layout 2 also spells out every other encoding, so
    the file describes itself: a composition's own scaling (`mxfp4`), an
    asymmetric integer's bits and calibration, a code book's whole table
    (NF4's included); E8M0 is named.
    """
    known = dtypes.FORMATS.get(fmt.name)
    if known is not None and known == fmt:
        return fmt.name
    if isinstance(fmt, E8M0Format):
        return "float8_e8m0fnu"
    clash = _builtin_named(fmt.name)
    if clash is not None and not _same_layout(clash, fmt):
        raise SaveError(
            f"cannot save a {fmt!r} under the name {fmt.name!r}, which is the built-in "
            f"{clash!r}: a file reader would take one for the other; give it another name, "
            f"e.g. {type(fmt).__name__}(..., name='{fmt.name}_custom')"
        )
    own: dict[str, Any] = {}
    if version >= 2 and isinstance(fmt, FloatFormat | IntFormat):
        own = {"scaling": scaling_to_json(fmt.scaling, version)}
    if isinstance(fmt, FloatFormat):
        return {
            "kind": "float",
            "exponent_bits": fmt.exponent_bits,
            "mantissa_bits": fmt.mantissa_bits,
            "finite": fmt.finite,
            "nan": bool(fmt.nan),
            "saturate": fmt.saturate,
            **own,
            "name": fmt.name,
        }
    if isinstance(fmt, IntFormat):
        return {"kind": "int", "bits": fmt.bits, **own, "name": fmt.name}
    if isinstance(fmt, AsymmetricIntFormat):
        return {
            "kind": "uint",
            "bits": fmt.bits,
            "calibration": fmt.calibration,
            "scaling": scaling_to_json(fmt.scaling, version),
            "name": fmt.name,
        }
    if isinstance(fmt, CodebookFormat):
        return {
            "kind": "codebook",
            "values": [float(v) for v in fmt.values],
            "scaling": scaling_to_json(fmt.scaling, version),
            "name": fmt.name,
        }
    raise SaveTypeError(
        f"cannot store format {fmt!r} ({type(fmt).__name__}): checkpoints store FloatFormat, "
        "IntFormat, AsymmetricIntFormat, CodebookFormat and E8M0 encodings"
    )


def _builtin_named(name: str) -> Format | None:
    """The built-in format a name or alias denotes, if any."""
    try:
        return dtypes.get(name)
    except (ValueError, TypeError):
        return None


def _same_layout(a: Format, b: Format) -> bool:
    """Whether `a` and `b` hold the same values the same way, default scalings aside.

    A format's own scaling is only the default of `encode`; what a leaf was
    encoded with is its `scaling`. So `AsymmetricIntFormat(4, scaling=PerBlock(64))`
    may keep the name `uint4`, but a table other than NF4's may not be `nf4`.
    """
    if type(a) is not type(b):
        return False
    if hasattr(a, "scaling") and hasattr(b, "scaling"):
        a = dataclasses.replace(a, scaling=None)  # type: ignore[type-var]
        b = dataclasses.replace(b, scaling=None)  # type: ignore[type-var]
    return a == b


#: Fields of a format object, by kind and layout version.
_FORMAT_FIELDS: dict[str, tuple[set[str], int]] = {
    "float": ({"kind", "exponent_bits", "mantissa_bits", "finite", "nan", "saturate", "name"}, 1),
    "int": ({"kind", "bits", "name"}, 1),
    "uint": ({"kind", "bits", "calibration", "scaling", "name"}, 2),
    "codebook": ({"kind", "values", "scaling", "name"}, 2),
}


def format_from_json(spec: Any, version: int = VERSION) -> Format:
    """Inverse of `format_to_json`; raises `CheckpointError` on a bad spec.

    The error names no file; the reader adds its path.
    """
    if isinstance(spec, str):
        if spec in dtypes.FORMATS:
            return dtypes.FORMATS[spec]
        e8m0 = dtypes.ENCODINGS.get("float8_e8m0fnu")
        if version >= 2 and spec == "float8_e8m0fnu" and isinstance(e8m0, E8M0Format):
            return e8m0
        raise CheckpointError(f"unknown format {spec!r} (known: {', '.join(dtypes.FORMATS)})")
    if not isinstance(spec, dict):
        raise CheckpointError(f"a format is a name or an object, got {spec!r:.200}")
    kind = spec.get("kind")
    if not isinstance(kind, str) or kind not in _FORMAT_FIELDS:
        raise CheckpointError(f"unknown format kind {kind!r:.100} in {spec!r:.200}")
    fields, since = _FORMAT_FIELDS[kind]
    if version < since:
        raise CheckpointError(f"a {kind} format needs layout version 2, this file is {version}")
    if version >= 2 and kind in ("float", "int"):
        fields = fields | {"scaling"}
    _exact_keys(spec, fields)
    if not isinstance(spec["name"], str):
        raise CheckpointError(f"format name must be a string, got {spec['name']!r:.100}")
    own = scaling_from_json(spec["scaling"], version) if "scaling" in spec else None
    try:
        fmt = _format_of(kind, spec, own)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"bad {kind} format {spec!r:.200}: {exc}") from None
    return _no_clash(fmt)


def _format_of(kind: str, spec: dict[str, Any], own: Scaling | None) -> Format:
    for key in ("exponent_bits", "mantissa_bits", "bits"):
        if key in spec and type(spec[key]) is not int:
            raise CheckpointError(f"format field {key!r} must be an integer, got {spec[key]!r}")
    for key in ("finite", "nan", "saturate"):
        if key in spec and type(spec[key]) is not bool:
            raise CheckpointError(f"format field {key!r} must be true or false, got {spec[key]!r}")
    if kind == "float":
        return FloatFormat(
            spec["exponent_bits"],
            spec["mantissa_bits"],
            finite=spec["finite"],
            nan=spec["nan"],
            saturate=spec["saturate"],
            scaling=own,
            name=spec["name"],
        )
    if kind == "int":
        return IntFormat(spec["bits"], scaling=own, name=spec["name"])
    if kind == "uint":
        if not isinstance(spec["calibration"], str):
            raise CheckpointError(f"calibration must be a string, got {spec['calibration']!r}")
        return AsymmetricIntFormat(
            spec["bits"], calibration=spec["calibration"], scaling=own, name=spec["name"]
        )
    values = spec["values"]
    if not isinstance(values, list) or not 2 <= len(values) <= 1 << 16:
        raise CheckpointError("a code book's values must be a list of 2 to 65536 numbers")
    if not all(type(v) is float for v in values):
        raise CheckpointError("a code book's values must all be numbers written with a point")
    table = np.asarray(values, np.float64)
    with np.errstate(over="ignore"):  # 1e308 is no float32: refused just below
        narrow = table.astype(np.float32)
    if not np.all(np.isfinite(narrow)) or np.any(narrow != table):
        raise CheckpointError("a code book's values must be finite float32 numbers")
    if np.any(np.diff(table) <= 0):
        raise CheckpointError("a code book's values must be sorted, each larger than the last")
    return CodebookFormat(values, scaling=own, name=spec["name"])


def scaling_to_json(scaling: Scaling | None, version: int = VERSION) -> dict[str, Any] | None:
    """A scaling as a JSON object (None stays None); layout 2 adds its scale format."""
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
    if version >= 2:
        out["scale_format"] = scaling.scale_format
    return out


def scaling_from_json(spec: Any, version: int = VERSION) -> Scaling | None:
    """Inverse of `scaling_to_json`; raises ValueError on a bad spec."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise CheckpointError(f"a scaling is an object or null, got {spec!r:.200}")
    kind = spec.get("type")
    fields = {"per-tensor": (), "per-axis": ("axis",), "per-block": ("size", "axis")}
    if not isinstance(kind, str) or kind not in fields:
        raise CheckpointError(f"unknown scaling type {kind!r:.100}")
    extra = {"scale_format"} if version >= 2 else set()
    _exact_keys(spec, {"type", "power_of_two", *fields[kind], *extra})
    if type(spec["power_of_two"]) is not bool:
        raise CheckpointError(f"scaling power_of_two must be true or false, got {spec!r}")
    scale_format = spec.get("scale_format", "float32")
    if not isinstance(scale_format, str) or scale_format not in SCALE_DTYPES:
        raise CheckpointError(
            f"scale_format {scale_format!r:.100} is not one of {', '.join(SCALE_DTYPES)}"
        )
    for key in fields[kind]:
        if type(spec[key]) is not int:
            raise CheckpointError(f"scaling field {key!r} must be an integer, got {spec[key]!r}")
        if not -MAX_RANK <= spec[key] <= (MAX_ELEMENTS if key == "size" else MAX_RANK):
            raise CheckpointError(f"scaling field {key!r} = {spec[key]} is out of range")
    args = {key: spec[key] for key in fields[kind]}
    cls = {"per-tensor": PerTensor, "per-axis": PerAxis, "per-block": PerBlock}[kind]
    scaling: Scaling = cls(power_of_two=spec["power_of_two"], scale_format=scale_format, **args)
    return scaling


def _no_clash(fmt: Format) -> Format:
    """`fmt`, unless its name is a built-in format's that it is not."""
    clash = _builtin_named(fmt.name)
    if clash is not None and not _same_layout(clash, fmt):
        raise CheckpointError(
            f"a custom format {fmt!r} is named {fmt.name!r}, the name of the built-in {clash!r} "
            "(save never writes this)"
        )
    return fmt


def _exact_keys(spec: dict[str, Any], keys: set[str]) -> None:
    if set(spec) != keys:
        missing = sorted(keys - set(spec))
        extra = sorted(set(spec) - keys)
        raise CheckpointError(f"fields missing {missing} / unexpected {extra} in {spec!r:.200}")


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
    from jax import tree_util

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


def _describe(path: tuple[tuple[str, Any], ...], leaf: Any) -> tuple[Leaf, list[np.ndarray]]:
    """A leaf's storage description and its arrays (data first)."""
    import jax

    name = path_name(path)
    tensor_type = _tensor_type()
    if tensor_type is not None and isinstance(leaf, tensor_type):
        enc, dtype = leaf.encoded, np.dtype(leaf.dtype)
    elif isinstance(leaf, dtypes.Encoded):
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
    fmt = enc.format
    spec = Leaf.tensor(name, path, dtype, tuple(enc.shape), fmt, enc.scaling)
    arrays = []
    for role, array in zip(
        ROLES, (enc.data, enc.scale, enc.tensor_scale, enc.zero_point), strict=True
    ):
        if (array is None) != (role != "data" and getattr(spec, role) is None):
            raise SaveError(  # pragma: no cover - an Encoded no encoder builds
                f"cannot save {name!r}: its {fmt.name} encoding "
                f"{'lacks' if array is None else 'holds'} {ROLE_WORDS[role]}, which "
                f"{fmt.name} under {enc.scaling} does not have"
            )
        if array is not None:
            a = np.asarray(array)
            arrays.append(a.view(file_dtype(a.dtype)) if a.dtype not in _DTYPE_NAMES else a)
    check_limits([spec])
    for (aname, adtype, ashape), arr in zip(spec.arrays(), arrays, strict=True):
        if arr.dtype != adtype or tuple(arr.shape) != ashape:  # pragma: no cover - Encoded bug
            raise SaveError(
                f"leaf {name!r}: array {aname!r} is {arr.dtype}{list(arr.shape)}, expected "
                f"{adtype}{list(ashape)} for {fmt.name}"
            )
    for role, arr in zip(spec.roles(), arrays, strict=True):
        problem = violation(spec, role, arr)
        if problem is not None:
            raise SaveError(
                f"cannot save {name!r}: its {fmt.name} {ROLE_WORDS[role]}: the encoding "
                f"{problem}, which no encoder produces (load would refuse the file); re-encode "
                f"it from finite values with to_reduced_precision({fmt.name!r})"
            )
    return spec, arrays


def flatten(tree: Any) -> list[tuple[Leaf, list[np.ndarray]]]:
    """Every leaf of `tree` (Tensors, Encoded values and arrays) with its arrays."""
    tensor_type = _tensor_type()
    from jax import tree_util

    encoded = dtypes.Encoded
    leaf_types = (encoded,) if tensor_type is None else (encoded, tensor_type)
    pairs = tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, leaf_types))[0]
    out = [_describe(tuple(_path_entry(e) for e in path), leaf) for path, leaf in pairs]
    check_names([spec for spec, _ in out])
    return out


def _specials(text: str) -> int:
    return text.count(",") + text.count("[") + text.count("{")


def _json_tokens_bound(spec: Leaf) -> int:
    """More than the `,` `[` `{` a leaf adds to a header (entries, metadata, CRCs)."""
    tokens = 60 + 4 * len(spec.path) + 2 * len(spec.shape) + 4 * _specials(spec.name)
    if spec.format is not None:
        tokens += 2 * _specials(spec.format.name)
    if isinstance(spec.format, CodebookFormat):
        tokens += 2 * len(spec.format.values)
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
    groups: dict[Any, list[tuple[Any, Any]]] = {}
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
        # Encoders pick scales so that the largest code decodes finite.
        if np.any(part.view(np.float32).astype(np.float64) * top > _F32_MAX):
            return f"has a scale so large that {top:g} times it overflows float32"
    return None


def tensor_scale_violation(leaf: Leaf, tensor_scale: np.ndarray) -> str | None:
    """Why a two-level encoding's float32 tensor scale is none an encoder gives, or None.

    It is `amax / (448 * top)` of the tensor (1/g in NVFP4's recipe): a
    positive finite normal float32, small enough that the largest block
    scale (448) times it times the largest element is finite.
    """
    fmt = leaf.format
    if fmt is None or tensor_scale.dtype != np.float32 or tensor_scale.size != 1:
        return None  # the reader's dtype and shape checks refuse it
    bits = int(tensor_scale.reshape(-1).view(np.uint32)[0])
    value = float(tensor_scale.reshape(-1)[0])
    if bits >> 31:
        return "has a negative tensor scale"
    if bits >= 0x7F800000:
        return "has an infinite or NaN tensor scale (from non-finite input?)"
    if bits < _TINY32:
        return "has a zero or subnormal tensor scale (it is at least 2**-126)"
    if value * E4M3_MAX * element_top(fmt) > _F32_MAX:
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
