"""Reading checkpoints: `Reader`, which raises `CheckpointError` for any bad file.

A `Reader` parses a safetensors header and checks every field of it (and of
the `"precision"` metadata, when present) against the file and against the
limits of `_layout` (`MAX_ARRAYS`, `MAX_NAME_LENGTH`, `MAX_RANK`,
`MAX_ELEMENTS`, `MAX_PATH_DEPTH`, `MAX_JSON_TOKENS`) before a byte
of tensor data is allocated; then it reads tensors one at a time, whole or in
row blocks, each checked against the CRC-32 recorded when it was saved and
against the invariants every encoder guarantees (`data_violation`,
`scale_violation`). Every error is a `CheckpointError` whose message starts
with the file's path and names the entry.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import dtypes
from dtypes import Format

from .._errors import CheckpointError
from ._file_checks import json_tokens, open_regular, other_format, parse_json, physical_memory
from ._invariants import encoding_problem, tensor_scale_shape, violation
from ._layout import (
    _DTYPE_NAMES,
    _DTYPES,
    _LOGICAL,
    MAX_ARRAYS,
    MAX_JSON_TOKENS,
    METADATA_KEY,
    ROLE_WORDS,
    VERSION,
    VERSION_KEY,
    VERSIONS,
    Leaf,
    LeafArrays,
    _tensors_crc,
    format_from_json,
    looks_like_ours,
    scaling_from_json,
)
from ._names import check_names, name_problem, path_and_shape, shape_problem

#: Foreign float tensors load as Tensors stored in the format of their dtype.
_DTYPE_FORMATS: dict[str, Format] = {
    "F32": dtypes.float32,
    "F16": dtypes.float16,
    "BF16": dtypes.bfloat16,
    "F8_E4M3": dtypes.float8_e4m3fn,
    "F8_E5M2": dtypes.float8_e5m2,
}

MAX_HEADER_BYTES = 100 * 1024 * 1024
_ALIGN = 64  # jax aliases host buffers aligned like this instead of copying them


#: The fields of a header entry, and of a leaf of the precision metadata by layout version.
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})
_LEAF_KEYS = {
    1: frozenset({"name", "path", "kind", "format", "scaling", "dtype", "shape", "scale"}),
    2: frozenset(
        {"name", "path", "kind", "format", "scaling", "dtype", "shape", "scale"}
        | {"tensor_scale", "zero_point"}
    ),
}
_LEAF_KEYS[3] = _LEAF_KEYS[2] | {"tensor_scale_shape"}
#: numpy's name of each safetensors dtype (`np.dtype.name` is slow Python).
_STORED_DTYPE_NAMES = {key: dtype.name for key, dtype in _DTYPES.items()}
#: A CRC-32 as the precision metadata writes it.
_CRC_TEXT = re.compile(r"[0-9a-f]{8}")


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized array whose buffer jax can alias without copying."""
    return _aligned_bytes(math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)


def _aligned_bytes(nbytes: int) -> np.ndarray:
    """`nbytes` uninitialized bytes (uint8) whose buffer jax can alias without copying."""
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start : start + nbytes]


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


class Reader:
    """An open, fully validated checkpoint whose tensors are read one at a time.

    Opening parses and checks the header (and the `"precision"` metadata when
    present) against the file's size; no tensor data is read until `read`.
    Use as a context manager.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self._file = open_regular(self.path)
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

    def fill(self, f: Any, offset: int, view: memoryview, name: str) -> None:
        """Read exactly `len(view)` bytes of tensor `name` at `offset` of file `f` into `view`."""
        f.seek(offset)
        done = 0
        while done < len(view):
            got = f.readinto(view[done:])
            if not got:
                raise self.error(f"tensor {name!r}: the file ended while reading it")
            done += got

    def check_crc(self, name: str, crc: int) -> None:
        """Raise unless `crc` is the CRC-32 recorded for `name` (files written by `save`)."""
        if self.crc is not None and crc != self.crc[name]:
            raise self.error(
                f"tensor {name!r}: its bytes do not match the CRC-32 recorded when it was saved "
                "(the file is corrupted)"
            )

    # -- header ------------------------------------------------------------
    def _parse(self) -> None:
        self._memory = physical_memory()  # (asked once: 65,536 tensors may be read)
        size = os.fstat(self._file.fileno()).st_size
        self.size = size
        if size < 8:
            raise self.error(
                f"not a safetensors file: {size} bytes is shorter than the 8-byte header length"
            )
        n, header = self._header()
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
        self._role: dict[str, tuple[Leaf, str]] = {}
        self.version = VERSION  # of the precision metadata (set from the header below)
        self.leaves: list[Leaf]
        self.crc: dict[str, int] | None  # CRC-32 of each array; None in a foreign file
        self.leaves, self.crc = self._leaves_of(meta)
        self.foreign = self.crc is None

    def _header(self) -> tuple[int, dict[str, Any]]:
        """The header's length and its JSON object, its work bounded before parsing."""
        head = self._file.read(8)
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES:
            other = other_format(head)
            if other is not None:
                raise self.error(f"not a safetensors file but {other}")
            raise self.error(
                f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit "
                "(not a safetensors file, or corrupted)"
            )
        if 8 + n > self.size:
            raise self.error(
                f"truncated: the header claims {n} bytes but the file has only {self.size - 8} "
                "after the length field"
            )
        raw = self._file.read(n)
        # Bound the work before json builds anything: a header of millions of
        # zero-size entries or deep nests is refused here, in one pass of bytes.
        tokens = json_tokens(raw)
        if tokens > MAX_JSON_TOKENS:
            raise self.error(
                f"the header holds up to {tokens} JSON values, more than the limit of "
                f"{MAX_JSON_TOKENS} (corrupted, or not written by a checkpoint writer)"
            )
        declared = raw.count(b'"data_offsets"')
        if declared > MAX_ARRAYS:
            raise self.error(
                f"the header declares {declared} tensors, more than the limit of {MAX_ARRAYS}"
            )
        try:
            text = raw.decode("utf-8")
            if not text.startswith("{"):
                raise CheckpointError("the header does not start with '{'")
            header = parse_json(text)
        except (ValueError, RecursionError) as exc:
            raise self.error(
                f"not a safetensors file: the header is not valid JSON ({exc})"
            ) from None
        if not isinstance(header, dict):
            raise self.error("the header is not a JSON object")
        if len(header) > MAX_ARRAYS + 1:
            raise self.error(
                f"the header declares {len(header) - 1} tensors, more than the limit of "
                f"{MAX_ARRAYS}"
            )
        return n, header

    def _leaves_of(self, meta: dict[str, str]) -> tuple[list[Leaf], dict[str, int] | None]:
        """The leaves and CRCs the precision metadata describes (checked against the
        entries), or each entry as a plain array and no CRCs in a file of another writer."""
        if looks_like_ours(meta):
            marker = meta.get(VERSION_KEY)
            if marker not in [str(v) for v in VERSIONS] or METADATA_KEY not in meta:
                if isinstance(marker, str) and marker.isdigit() and int(marker) > VERSION:
                    raise self.error(
                        f"the precision metadata is layout version {marker}, newer than this "
                        f"library reads ({', '.join(map(str, VERSIONS))}); upgrade precision"
                    )
                raise self.error(
                    f"the precision metadata is damaged or from another version: expected keys "
                    f"{METADATA_KEY!r} and {VERSION_KEY!r} (one of "
                    f"{', '.join(repr(str(v)) for v in VERSIONS)}), found {sorted(meta)!r:.200}"
                )
            self.version = int(marker)
            leaves, crc = self._precision_leaves(meta[METADATA_KEY])
            for leaf in leaves:
                for (aname, _, _), role in zip(leaf.arrays(), leaf.roles(), strict=True):
                    self._role[aname] = (leaf, role)
            return leaves, crc
        return self._foreign_leaves(), None

    def _entry(self, name: str, info: Any) -> Entry:
        problem = name_problem(name)
        if problem:
            raise self.error(f"tensor {name[:200]!r}...: {problem}")
        if not isinstance(info, dict) or info.keys() != _ENTRY_KEYS:
            raise self.error(
                f"tensor {name!r}: expected an object with dtype, shape and data_offsets, "
                f"got {info!r:.200}"
            )
        dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype_name, str) or dtype_name not in _DTYPES:
            raise self.error(
                f"tensor {name!r}: unsupported dtype {dtype_name!r:.100} (supported: "
                f"{', '.join(_DTYPES)})"
            )
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise self.error(f"tensor {name!r}: shape {shape!r:.200} is not a list of sizes")
        problem = shape_problem(tuple(shape))
        if problem:
            raise self.error(f"tensor {name!r}: {problem}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise self.error(f"tensor {name!r}: data_offsets {offsets!r:.200} is not [begin, end]")
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
        tokens = json_tokens(text)
        if tokens > MAX_JSON_TOKENS:
            raise self.error(
                f"the precision metadata holds up to {tokens} JSON values, more than the limit "
                f"of {MAX_JSON_TOKENS}"
            )
        try:
            doc = parse_json(text)
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
        if doc["version"] != self.version or type(doc["version"]) is not int:
            raise self.error(
                f"precision metadata version {doc['version']!r:.50} is not the version "
                f"{self.version} the header's {VERSION_KEY!r} marks (this library reads "
                f"versions {', '.join(map(str, VERSIONS))}; upgrade precision for a newer one)"
            )
        if not isinstance(doc["tensors"], list):
            raise self.error("the precision metadata's tensors is not a list")
        if len(doc["tensors"]) > MAX_ARRAYS:
            raise self.error(
                f"the precision metadata describes {len(doc['tensors'])} leaves, more than the "
                f"limit of {MAX_ARRAYS}"
            )
        if doc["tensors_crc32"] != _tensors_crc(doc["tensors"]):
            raise self.error(
                "the precision metadata does not match its CRC-32 (the header is corrupted)"
            )
        leaves = [self._leaf_from_metadata(item) for item in doc["tensors"]]
        try:
            check_names(leaves)
        except (ValueError, TypeError) as exc:
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
            or not all(isinstance(v, str) and _CRC_TEXT.fullmatch(v) for v in crc.values())
        ):
            raise self.error("the precision metadata's crc32 map is malformed")
        return leaves, {k: int(v, 16) for k, v in crc.items()}

    def _leaf_from_metadata(self, item: Any) -> Leaf:
        name = self._leaf_name(item)

        def bad(what: str) -> CheckpointError:
            return self.error(f"precision metadata of {name!r}: {what}")

        found = path_and_shape(item["path"], item["shape"], name)
        if isinstance(found, str):
            raise bad(found)
        key_path, shape = found
        entry = self.entries.get(name)
        if entry is None:
            raise bad("its data tensor is missing from the file")
        try:
            fmt = None if item["format"] is None else format_from_json(item["format"], self.version)
            scaling = scaling_from_json(item["scaling"], self.version)
        except (ValueError, TypeError) as exc:
            raise bad(str(exc)) from None
        kind, dtype_name = item["kind"], item["dtype"]
        if not isinstance(kind, str) or not isinstance(dtype_name, str):
            raise bad(f"kind {kind!r:.100} and dtype {dtype_name!r:.100} must be strings")
        extras = (item.get("tensor_scale"), item.get("zero_point"))
        if kind == "array":
            arrays = (item["scale"], *extras)
            if fmt is not None or scaling is not None or any(a is not None for a in arrays):
                raise bad("a plain array has no format, scaling, scales or zero points")
            dtype = entry.dtype
            if dtype_name != _STORED_DTYPE_NAMES[entry.dtype_name]:
                raise bad(f"dtype {dtype_name!r} disagrees with the stored {dtype.name}")
        elif kind == "tensor":
            dtype = self._tensor_dtype(item, fmt, scaling, tuple(shape), bad)
        else:
            raise bad(f"unknown kind {kind!r:.100}")
        ts_shape = tensor_scale_shape(item, scaling, tuple(shape), self.version)
        if isinstance(ts_shape, str):
            raise bad(ts_shape)
        leaf = Leaf(
            name,
            key_path,
            kind,
            dtype,
            tuple(shape),
            fmt,
            scaling,
            item["scale"],
            *extras,
            ts_shape,
        )
        self._check_arrays(leaf, bad)
        return leaf

    def _leaf_name(self, item: Any) -> str:
        """The name of one leaf of the metadata, once the leaf has the keys of this
        version's leaves and the name is one a checkpoint may hold."""
        keys = _LEAF_KEYS[self.version]
        if not isinstance(item, dict) or item.keys() != keys:
            raise self.error(f"precision metadata: malformed leaf {item!r:.200}")
        name = item["name"]
        if not isinstance(name, str):
            raise self.error(f"precision metadata: leaf name {name!r:.200} is not a string")
        problem = name_problem(name)
        if problem:
            raise self.error(f"precision metadata of {name[:200]!r}...: {problem}")
        return name

    def _tensor_dtype(
        self,
        item: dict[str, Any],
        fmt: Format | None,
        scaling: Any,
        shape: tuple[int, ...],
        bad: Callable[[str], CheckpointError],
    ) -> np.dtype:
        """The logical dtype of a tensor leaf, once its format, scaling and arrays are
        ones an encoder writes."""
        name, dtype_name = item["name"], item["dtype"]
        if fmt is None:
            raise bad("a tensor needs a format")
        if dtype_name not in _LOGICAL:
            raise bad(f"logical dtype {dtype_name!r} is not one of {sorted(_LOGICAL)}")
        dtype = _LOGICAL[dtype_name]
        if fmt.kind != "float" and fmt.kind != "scale" and scaling is None:
            raise bad(f"{fmt.name} codes need a scaling")
        problem = encoding_problem(fmt, scaling, shape)
        if problem:
            raise bad(problem)
        expected = Leaf.tensor(name, (), dtype, shape, fmt, scaling)
        for key in ("scale", "tensor_scale", "zero_point"):
            want = getattr(expected, key)
            if item.get(key) != want:
                raise bad(
                    f"its {ROLE_WORDS[key]} must be "
                    + ("absent" if want is None else f"stored as {want!r}")
                    + f" under {fmt.name} with scaling {scaling}, not {item.get(key)!r:.200}"
                )
        if scaling is not None and shape:
            try:
                scaling.validate(shape)
            except ValueError as exc:
                raise bad(str(exc)) from None
        return dtype

    def _check_arrays(self, leaf: Leaf, bad: Callable[[str], CheckpointError]) -> None:
        """Refuse a leaf whose arrays are missing or stored in another dtype or shape."""
        fmt, shape = leaf.format, leaf.shape
        for aname, adtype, ashape in leaf.arrays():
            stored = self.entries.get(aname)
            if stored is None:
                raise bad(f"array {aname!r} is missing from the file")
            if stored.shape != ashape or _DTYPES[stored.dtype_name] != adtype:
                raise bad(
                    f"array {aname!r} is stored as {stored.dtype_name}{list(stored.shape)} but "
                    f"{'its format ' + fmt.name if fmt else 'the leaf'} with logical shape "
                    f"{list(shape)} needs {_DTYPE_NAMES[adtype]}{list(ashape)}"
                )

    # -- data --------------------------------------------------------------
    def check_values(self, name: str, array: np.ndarray, *, whole_rows: bool = True) -> None:
        """Refuse an array (or block of whole rows) that breaks its encoding's invariants.

        `read` and `iter_rows` call it; a caller reading bytes itself calls it
        on what it read (`whole_rows=False` for a 1-D block that does not end
        the array). Plain arrays and foreign files have no invariants.
        """
        role = self._role.get(name)
        if role is None:
            return
        leaf, what = role
        if leaf.format is None:
            return  # a plain array: any bytes are values
        problem = violation(leaf, what, array, whole_rows=whole_rows)
        if problem:
            raise self.error(
                f"tensor {name!r}: its {leaf.format.name} {ROLE_WORDS[what]}: the encoding "
                f"{problem}, which no encoder writes (the file was altered after it was saved)"
            )

    def _allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        nbytes = dtype.itemsize
        for d in shape:
            nbytes *= d
        return self._allocate_bytes(name, nbytes).view(dtype).reshape(shape)

    def _allocate_bytes(self, name: str, nbytes: int) -> np.ndarray:
        """`nbytes` aligned bytes for tensor `name`, refused beyond the machine's memory."""
        memory = self._memory
        if memory is not None and nbytes > memory:
            raise self.error(
                f"tensor {name!r} declares {nbytes} bytes, more than this machine's "
                f"{memory} bytes of memory; it cannot be loaded whole here"
            )
        try:
            return _aligned_bytes(nbytes)
        except MemoryError:
            raise self.error(
                f"tensor {name!r}: cannot allocate the {nbytes} bytes it declares"
            ) from None

    def read(self, name: str) -> np.ndarray:
        """The array stored as `name`, in a fresh aligned buffer, CRC-checked."""
        entry = self.entries[name]
        raw = self._allocate_bytes(name, entry.end - entry.begin)  # the shape's bytes (_entry)
        self.fill(self._file, entry.begin, raw.data, name)
        if self.crc is not None:
            self.check_crc(name, zlib.crc32(raw.data))
        out = raw.view(_DTYPES[entry.dtype_name]).reshape(entry.shape)
        self.check_values(name, out)
        return out

    def iter_rows(self, name: str, rows: int) -> Iterator[np.ndarray]:
        """The array stored as `name` in slices of `rows` rows (first axis), CRC-checked.

        The CRC-32 covers the whole tensor, so a mismatch is raised after the
        last slice: a caller writing the slices somewhere must discard them
        then (`write` does, by raising through).
        """
        entry = self.entries[name]
        if not entry.shape:
            raise self.error(f"tensor {name!r} is a scalar; read it with read()")
        role = self._role.get(name)
        if len(entry.shape) == 1 and role is not None and role[0].format is not None:
            if role[0].format.packed:
                rows = max(rows, entry.shape[0])  # one block: fields may straddle bytes
        row_shape = entry.shape[1:]
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * entry.dtype.itemsize
        crc = 0
        for start in range(0, entry.shape[0], rows):
            n = min(rows, entry.shape[0] - start)
            out = self._allocate(name, (n, *row_shape), entry.dtype)
            view = out.reshape(-1).view(np.uint8).data
            self.fill(self._file, entry.begin + start * row_bytes, view, name)
            if self.crc is not None:
                crc = zlib.crc32(view, crc)
            del view
            self.check_values(name, out, whole_rows=start + n == entry.shape[0])
            yield out
        self.check_crc(name, crc)

    def read_leaf(self, leaf: Leaf) -> LeafArrays:
        """Every array of one leaf (data, and its scales, tensor scale and zero points)."""
        if leaf.scale is None and leaf.tensor_scale is None and leaf.zero_point is None:
            return LeafArrays(self.read(leaf.name))  # its data alone (arrays(): one, named as it)
        arrays = {
            role: self.read(name)
            for (name, _, _), role in zip(leaf.arrays(), leaf.roles(), strict=True)
        }
        return LeafArrays(**arrays)
