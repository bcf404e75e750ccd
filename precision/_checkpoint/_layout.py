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
carry the extra fields; a file holding a stack with a tensor scale per layer
as version 3 (every leaf also gives `tensor_scale_shape`). The reader reads
all three.

This module holds what the reader (`_reader`) and the writer (`_io`) share:
the safetensors dtype tables, the limits of a checkpoint, `Leaf` (one entry
of the `"precision"` metadata), formats and scalings as JSON, the tensor
names key paths give, and the CRC-32 of the leaf descriptions. Beside it:
`_leaves` turns a tree into leaves and back (`flatten`/`unflatten`), and
`_invariants` holds the invariants of stored encodings, which the writer
checks before a file is written and the reader after each tensor is read:
`save` never writes what `load` refuses.
"""

from __future__ import annotations

import binascii
import dataclasses
import json
import math
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
#: `np.dtype.name` of the dtypes above (a property computed in Python at every call).
_NUMPY_NAMES: dict[np.dtype, str] = {d: d.name for d in [*_DTYPES.values(), *_LOGICAL.values()]}

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
VERSION = 3  # the newest layout; a file is written at the lowest version that describes it
VERSIONS = (1, 2, 3)  # the layouts the reader reads
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


class LeafArrays(NamedTuple):
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
    # a tensor scale per layer of a stack (layout 3), e.g. (layers, 1, 1); () for one
    tensor_scale_shape: tuple[int, ...] = ()

    @classmethod
    def tensor(
        cls,
        name: str,
        path: tuple[tuple[str, Any], ...],
        dtype: np.dtype,
        shape: tuple[int, ...],
        fmt: Format,
        scaling: Scaling | None,
        tensor_scale_shape: tuple[int, ...] = (),
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
            name + TENSOR_SCALE_SUFFIX if scaling is not None and scaling.two_level else None,
            name + ZERO_POINT_SUFFIX if scaled and isinstance(fmt, AsymmetricIntFormat) else None,
            tensor_scale_shape,
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
        if self.tensor_scale_shape:
            return 3
        if not isinstance(fmt, FloatFormat | IntFormat) or fmt.scaling is not None:
            return 2
        if scaling is not None and scaling.scale_format != "float32":
            return 2
        return 1

    def arrays(self) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
        """The (name, file dtype, shape) of every array this leaf stores, data first."""
        # Computed once: saving and loading ask for every leaf's arrays several
        # times (limits, names, header): microseconds each, seconds for 65,536 leaves.
        known = self.__dict__.get("_arrays")
        if known is None:
            known = self._arrays_of_leaf()
            object.__setattr__(self, "_arrays", known)
        return list(known)

    def _arrays_of_leaf(self) -> tuple[tuple[str, np.dtype, tuple[int, ...]], ...]:
        out = [(self.name, self.data_dtype, self.data_shape)]
        scale_shape, scale_container = self.scale_shape, self.scale_container
        if self.scale is not None:
            assert scale_shape is not None  # a stored scale comes with its scaling
            assert scale_container is not None
            out.append((self.scale, file_dtype(scale_container), scale_shape))
        if self.tensor_scale is not None:
            out.append((self.tensor_scale, np.dtype(np.float32), self.tensor_scale_shape))
        if self.zero_point is not None:
            assert scale_shape is not None  # zero points come with scales
            out.append((self.zero_point, np.dtype(np.uint8), scale_shape))
        return tuple(out)

    def to_json(self, version: int = VERSION) -> dict[str, Any]:
        out = {
            "name": self.name,
            "path": [list(p) for p in self.path],
            "kind": self.kind,
            "format": None if self.format is None else format_to_json(self.format, version),
            "scaling": scaling_to_json(self.scaling, version),
            "dtype": _NUMPY_NAMES.get(self.dtype) or self.dtype.name,
            "shape": list(self.shape),
            "scale": self.scale,
        }
        if version >= 2:
            out["tensor_scale"] = self.tensor_scale
            out["zero_point"] = self.zero_point
        if version >= 3:
            ts = self.tensor_scale_shape
            out["tensor_scale_shape"] = None if self.tensor_scale is None else list(ts)
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
    except dtypes.FormatError:  # (the answer: no format has that name)
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
        # A file names a format by its canonical name only (`format_to_json`), never by an
        # alias or a layout name `dtypes.get` would also read: what a file means must not
        # depend on the names the reading version knows besides.
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
        axis = scaling.axis  # several axes: a JSON list of two or more
        out = {"type": "per-axis", "axis": list(axis) if isinstance(axis, tuple) else axis}
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
    args: dict[str, Any] = {}
    for key in fields[kind]:
        value = spec[key]
        several = kind == "per-axis" and isinstance(value, list)
        for v in value if several else [value]:
            if type(v) is not int:
                raise CheckpointError(f"scaling field {key!r} must be an integer, got {value!r}")
            if not -MAX_RANK <= v <= (MAX_ELEMENTS if key == "size" else MAX_RANK):
                raise CheckpointError(f"scaling field {key!r} = {value} is out of range")
        if several and (len(value) < 2 or len(set(value)) != len(value)):
            raise CheckpointError(
                f"per-axis axes {value!r:.100} must be two or more distinct integers"
            )
        args[key] = tuple(value) if several else value
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
    return _text_crc(json.dumps(tensors, separators=(",", ":")))


def _text_crc(text: str) -> str:
    """`_tensors_crc` of leaf descriptions whose compact JSON is `text`."""
    return f"{binascii.crc32(text.encode()):08x}"


def looks_like_ours(meta: dict[str, str]) -> bool:
    """Whether a header's metadata was written by `save` (even if damaged since).

    A file whose metadata marker was corrupted must not load as a foreign
    file (its packed codes would come back as plain bytes), so any trace of
    ours counts: either key, a key that starts like them, or our document.
    """
    return any(
        key.startswith("precision") or value.startswith('{"version":')
        for key, value in meta.items()
    )
