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

The code is split by what it holds: `_checkpoint_layout` (the file layout:
what a leaf is stored as, formats and scalings as JSON, trees <-> leaves),
`_checkpoint_reader` (`Reader`, which validates a file and reads it) and
`_atomic_file` (the temporary file renamed into place). This module holds
the writer, what a stored leaf loads as, and the public `save` and `load`.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import math
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, BinaryIO, TypeGuard

import numpy as np

import dtypes
from dtypes import PrecisionTypeError

from .._errors import CheckpointError, SaveTypeError
from . import _compressed_tensors, _gguf
from ._atomic_file import _TempFile, refuse_special, write_error
from ._file_checks import available_memory
from ._layout import (
    _DTYPE_NAMES,
    METADATA_KEY,
    VERSION_KEY,
    Leaf,
    LeafArrays,
    _text_crc,
)
from ._layout import _tensors_crc as _tensors_crc  # (re-exported: tests seal documents)
from ._leaves import _tensor_type, flatten, unflatten
from ._names import check_names
from ._reader import Reader
from ._source import Source

if TYPE_CHECKING:
    import jax

    from dtypes import Encoded

__all__ = ["encoded", "load", "materialize", "save", "write"]


# --------------------------------------------------------------------------
# writing


_COMPACT = (",", ":")


class _Header:
    """The header of a file being written, built once: `bytes(crc)` only fills in the CRCs.

    Its bytes are those of `json.dumps` of the whole header (the tensor entries after
    `__metadata__`, whose `"precision"` entry is the JSON document of the leaves), put
    together from the parts that do not change, each dumped once: the CRCs are the only
    part written twice (zeros first, then their values, at the same fixed width).
    """

    def __init__(
        self,
        arrays: list[tuple[str, np.dtype, tuple[int, ...]]],
        leaves: list[Leaf],
        extra: dict[str, str],
        plain: bool = False,
    ):
        entries: dict[str, Any] = {}
        self.sizes: list[int] = []
        offset = 0
        for name, dtype, shape in arrays:
            n = math.prod(shape) * dtype.itemsize
            entries[name] = {
                "dtype": _DTYPE_NAMES[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + n],
            }
            self.sizes.append(n)
            offset += n
        # '{"__metadata__":' + metadata + ',' + the entries without their '{'
        text = json.dumps(entries, separators=_COMPACT)
        self._entries = "}" if text == "{}" else "," + text[1:]
        self.version = version = max([leaf.version for leaf in leaves], default=1)
        tensors = json.dumps([leaf.to_json(version) for leaf in leaves], separators=_COMPACT)
        self._doc = (
            f'{{"version":{json.dumps(version)},"tensors":{tensors},'
            f'"tensors_crc32":{json.dumps(_text_crc(tensors))},"crc32":'
        )
        self._extra = extra
        self._plain = plain

    def bytes(self, crc: dict[str, int]) -> bytes:
        """The header with these CRC-32s, its length before it, padded to 8 bytes
        (a plain header: `extra` alone, no description of the leaves and no CRCs)."""
        ours: dict[str, str] = {}
        if not self._plain:
            hexes = {name: f"{value:08x}" for name, value in crc.items()}
            crcs = json.dumps(hexes, separators=_COMPACT)
            ours = {VERSION_KEY: str(self.version), METADATA_KEY: self._doc + crcs + "}"}
        metadata = json.dumps({**self._extra, **ours}, separators=_COMPACT)
        text = ('{"__metadata__":' + metadata + self._entries).encode("utf-8")
        text += b" " * (-len(text) % 8)  # keep the data 8-byte aligned, as other writers do
        return len(text).to_bytes(8, "little") + text


def write(
    path: str | os.PathLike[str],
    leaves: list[Leaf],
    produce: Iterable[tuple[str, np.ndarray | Iterable[np.ndarray]]],
    *,
    overwrite: bool,
    metadata: dict[str, str] | None = None,
    guard: Callable[[], AbstractContextManager[Any]] | None = None,
    mode: int | None = None,
    checked: bool = False,
    plain: bool = False,
) -> int:
    """Atomically write a checkpoint of `leaves`, whose arrays `produce` yields in order.

    `produce` is consumed lazily, so a caller can compute one tensor at a time
    and peak memory stays at about one tensor. An array may also be given as
    an iterator of consecutive pieces of its bytes in order (any shapes, the
    array's dtype), so a tensor never has to be whole in memory; each piece
    is written before the next is asked for, so a producer may reuse its
    buffer. `metadata` adds string entries to the header's `__metadata__`
    (the keys `precision` writes take precedence). `guard`, when given, is a
    context manager factory entered around the final rename (the command
    line holds interrupts off there). `mode` gives a new file's permission bits
    (default: 0o666 under the umask; a replaced file keeps its own). `checked` says
    the caller ran `check_names` on these leaves already (`save`, through `flatten`).
    `plain` writes a safetensors file without this library's metadata (another
    tool's layout, `precision/_cli/_output_layouts.py`): `leaves` are then plain arrays.
    Returns the bytes written.

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
        OSError: the destination directory cannot be written (named in the message).
    """
    path = _destination(path, overwrite)
    if not checked:
        check_names(leaves)
    arrays = [a for leaf in leaves for a in leaf.arrays()]
    crc = {name: 0 for name, _, _ in arrays}
    extra = {str(k): str(v) for k, v in (metadata or {}).items()}
    layout = _Header(arrays, leaves, extra, plain)
    header = layout.bytes(crc)
    temp = _TempFile(path, overwrite=overwrite, mode=mode)
    try:
        with os.fdopen(temp.fd, "wb", closefd=False) as f:
            f.write(header)
            produced = iter(produce)
            for expected, size in zip(arrays, layout.sizes, strict=True):
                crc[expected[0]] = _write_array(f, expected, size, next(produced))
            final = layout.bytes(crc)
            assert len(final) == len(header)  # fixed-width CRCs: same length
            f.seek(0)
            f.write(final)
            size = f.seek(0, os.SEEK_END)
        os.fsync(temp.fd)  # the slow part of committing, before any guard
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
    return size


def _destination(path: str | os.PathLike[str], overwrite: bool) -> str:
    """The file `write` writes: `path`, or the file a link at `path` points to (the link
    is kept); refused when it is a directory or a special file, or exists and
    `overwrite` is False."""
    path = os.fspath(path)
    if os.path.islink(path):
        path = os.path.realpath(path)  # replace the file the link points to, keep the link
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, f"cannot write {path}: it is a directory")
    refuse_special(path)
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(
            f"{path} already exists; pass overwrite=True (--overwrite on the command line) to "
            "replace it"
        )
    return path


def _write_array(
    f: BinaryIO,
    expected: tuple[str, np.dtype, tuple[int, ...]],
    size: int,
    given: tuple[str, np.ndarray | Iterable[np.ndarray]],
) -> int:
    """Write the bytes of one array, `given` as `produce` yields it (its name, and the
    array or its pieces), checked against the (name, dtype, shape) `expected` and its
    `size` in bytes; returns their CRC-32."""
    name, dtype, shape = expected
    got_name, arr = given
    if got_name != name or (
        isinstance(arr, np.ndarray) and (arr.dtype != dtype or tuple(arr.shape) != tuple(shape))
    ):
        raise ValueError(  # a bug in the caller, never silently written
            f"expected array {name!r} {dtype}{list(shape)}, got {got_name!r} "
            f"{getattr(arr, 'dtype', '')}{list(getattr(arr, 'shape', ''))}"
        )
    value, written = 0, 0
    for part in [arr] if isinstance(arr, np.ndarray) else arr:
        if part.dtype != dtype:
            raise ValueError(
                f"array {name!r}: a piece of {part.dtype}{list(part.shape)} does not "
                f"fit {dtype}{list(shape)}"
            )
        view = np.ascontiguousarray(part).reshape(-1).view(np.uint8).data
        value = zlib.crc32(view, value)
        f.write(view)
        written += len(view)
        del view, part
    if written != size:
        raise ValueError(f"array {name!r}: {written} bytes produced, not {shape}")
    return value


# --------------------------------------------------------------------------
# loading: what a stored leaf becomes


def _to_jax(arr: np.ndarray) -> jax.Array | np.ndarray:
    """A jax array aliasing `arr`, or `arr` itself for 64-bit data jax would truncate."""
    import jax

    if not isinstance(arr, np.ndarray):
        return arr  # on the device already (moved in a batch by `load`)
    if arr.dtype.itemsize == 8 and not jax.config.read("jax_enable_x64"):
        return arr
    out: jax.Array = jax.device_put(arr)
    return out


#: `load` moves the arrays of this many bytes, or of this many leaves, to the device
#: in one call: one transfer per leaf made a file of many tiny tensors slow to load
#: (docs/benchmarks.md, "Checkpoints of many small tensors").
_BATCH_BYTES, _BATCH_LEAVES = 1 << 26, 4096


def _typed(leaf: Leaf, stored: LeafArrays) -> LeafArrays:
    """`stored` viewed as the types its leaf decodes (codes and scales in their containers)."""
    if leaf.kind == "array" or leaf.format is None:
        return stored
    scale = stored.scale
    if scale is not None:
        assert leaf.scale_container is not None  # a scale comes with its scaling
        scale = scale.view(leaf.scale_container)
    return LeafArrays(
        stored.data.view(leaf.container), scale, stored.tensor_scale, stored.zero_point
    )


#: Many small arrays of one shape and dtype go to the device `_JIT_ARGS` at a time through
#: a jitted identity, whose compiled dispatch takes numpy arguments in a fraction of the
#: Python time `jax.device_put` spends on each (figures in docs/benchmarks.md, "Checkpoints
#: of many small tensors"). It compiles once per shape and dtype, so only a batch's groups
#: of at least `_JIT_MIN` arrays of at most `_JIT_BYTES` each take it; the rest are moved
#: in one call.
_JIT_ARGS, _JIT_MIN, _JIT_BYTES = 16, 512, 1 << 16
_IDENTITY: list[Callable[..., tuple[Any, ...]]] = []


def _to_device(arrays: list[np.ndarray]) -> list[Any]:
    """`jax.device_put(arrays)`: the same uncommitted arrays on the default device."""
    import jax

    groups: dict[tuple[tuple[int, ...], np.dtype], list[int]] = {}
    for i, a in enumerate(arrays):
        if a.nbytes <= _JIT_BYTES:
            groups.setdefault((a.shape, a.dtype), []).append(i)
    out: list[Any] = [None] * len(arrays)
    for members in groups.values():
        if len(members) < _JIT_MIN:
            continue
        if not _IDENTITY:
            _IDENTITY.append(jax.jit(lambda *xs: xs))
        for k in range(0, len(members) - _JIT_ARGS + 1, _JIT_ARGS):
            chunk = members[k : k + _JIT_ARGS]
            for i, y in zip(chunk, _IDENTITY[0](*[arrays[i] for i in chunk]), strict=True):
                out[i] = y
    rest = [i for i, y in enumerate(out) if y is None]
    if rest:
        for i, y in zip(rest, jax.device_put([arrays[i] for i in rest]), strict=True):
            out[i] = y
    return out


def _on_device(batch: list[tuple[Leaf, LeafArrays]]) -> list[LeafArrays]:
    """Every array of `batch`, typed, moved to the device in one call (64-bit data stays in
    numpy unless JAX is 64-bit, which would truncate it)."""
    import jax

    x64 = bool(jax.config.read("jax_enable_x64"))

    def moves(a: np.ndarray | None) -> TypeGuard[np.ndarray]:
        return a is not None and (x64 or a.dtype.itemsize != 8)

    typed = [_typed(leaf, stored) for leaf, stored in batch]
    moved = iter(_to_device([a for s in typed for a in s if moves(a)]))
    # (LeafArrays now holding device arrays: `encoded` and `_to_jax` take them as they are)
    return [
        # (data alone, as most leaves are: no generator for each)
        (LeafArrays(next(moved)) if moves(s.data) else s)
        if s.scale is None and s.tensor_scale is None and s.zero_point is None
        else LeafArrays._make([next(moved) if moves(a) else a for a in s])
        for s in typed
    ]


def encoded(leaf: Leaf, stored: LeafArrays) -> Encoded:
    """The `Encoded` storage of a tensor leaf from its arrays (as read from the file)."""
    import jax

    assert leaf.format is not None
    last = (leaf.shape[-1] if leaf.shape else None) if leaf.format.packed else None
    parts: tuple[Any, ...] = tuple(stored)
    if isinstance(stored.data, np.ndarray):  # as read; else typed and moved by `load`
        parts = tuple(None if a is None else jax.device_put(a) for a in _typed(leaf, stored))
    data, scale, tensor_scale, zero_point = parts
    return dtypes.Encoded(
        data,
        scale,
        leaf.format,
        leaf.scaling,
        last,
        tensor_scale=tensor_scale,
        zero_point=zero_point,
    )


def materialize(leaf: Leaf, stored: LeafArrays, as_arrays: bool) -> Any:
    """The value a leaf loads as: a Tensor, or logical arrays when `as_arrays`."""
    import jax

    if leaf.kind == "array":
        return _to_jax(stored.data)
    dtype = leaf.dtype
    if dtype.itemsize == 8 and not jax.config.read("jax_enable_x64"):
        raise CheckpointError(
            f"{leaf.name!r} is a float64 Tensor; enable 64-bit JAX "
            "(jax.config.update('jax_enable_x64', True)) before loading it"
        )
    enc = encoded(leaf, stored)
    if as_arrays:
        return enc.decode(dtype)
    return _tensor_type().from_encoded(enc, dtype=dtype)


# --------------------------------------------------------------------------
# public API


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off meanwhile (as it was, after).

    Describing, parsing and rebuilding a tree of many leaves allocates a few dozen
    containers a leaf, and the collector's passes over that growing heap cost a quarter
    of a 65,536-leaf load or save. What is built holds no reference cycles; any made
    meanwhile are collected once the collector runs again.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def save(path: str | os.PathLike[str], tree: Any, *, overwrite: bool = False) -> None:
    """Save a tree of Tensors and arrays to a safetensors file, atomically.

    Every leaf is stored exactly: a reduced Tensor as its container codes and
    scales in their scale format (float32, E8M0, e4m3, bfloat16 or float16),
    with NVFP4's tensor scale and asymmetric integers' zero points, and its
    format (code books with their table), scaling, logical dtype, shape and
    key path in the header's metadata, so that a plain safetensors reader
    can decode it (docs/cli.md, "File layout"); a plain array as it is. The
    file is written to a temporary file beside `path`, fsynced and renamed,
    so an error or a crash never leaves a partial file or damages an
    existing one.

    Args:
        path: destination file.
        tree: any pytree of `precision.Tensor`, `dtypes.Encoded` and arrays.
        overwrite: replace an existing file. Off by default, so a checkpoint
            (or the input of a conversion) is never replaced by accident.

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
        TypeError: a leaf is neither a Tensor nor an array of a storable dtype.
        ValueError: two leaves would be stored under the same name, or an
            encoding holds values no encoder writes (a NaN scale).
        OSError: the destination cannot be written.

    Examples:
        >>> import os, tempfile, numpy as np, precision
        >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        >>> w = precision.Tensor(np.array([[0.5, -1.25]], np.float32))
        >>> precision.save(path, {"w": w.to_reduced_precision("int4")})
        >>> precision.load(path)["w"].format.name
        'int4'
    """
    if isinstance(tree, str | os.PathLike) and not isinstance(path, str | os.PathLike):
        raise SaveTypeError(
            f"precision.save takes the path first: save(path, tree); got a "
            f"{type(path).__name__} as the path and {os.fspath(tree)!r} as the tree"
        )
    path = _path_argument("save", path)
    _check_flag("overwrite", overwrite, SaveTypeError)
    with _collector_paused():
        described = flatten(tree)
        leaves = [spec for spec, _ in described]
        pairs = (
            (name, arr)
            for spec, arrays in described
            for (name, _, _), arr in zip(spec.arrays(), arrays, strict=True)
        )
        write(path, leaves, pairs, overwrite=overwrite, checked=True)  # flatten checked names


def _refuse_beyond_memory(source: Source) -> None:
    """A loaded tree holds every tensor at once: refuse, before reading any, one whose
    tensors together need more memory than is available (the process was killed)."""
    need = sum(e.end - e.begin for r in source.readers for e in r.entries.values())
    have = available_memory()
    if have is not None and need > have:
        raise CheckpointError(
            f"{source.path}: its tensors need {need / 2**30:.1f} GiB in memory together and "
            f"{have / 2**30:.1f} GiB are available; load it on a larger machine, or convert it "
            "to a narrower format with `precision convert`, which streams one tensor at a time"
        )


def _materialized(
    reader: Reader, batch: list[tuple[Leaf, LeafArrays]], as_arrays: bool
) -> list[tuple[Any, Any]]:
    """(key path, value) of each leaf of `batch`, its arrays moved in one transfer."""
    out = []
    for (leaf, _), stored in zip(batch, _on_device(batch), strict=True):
        if leaf.kind == "array" and not isinstance(stored.data, np.ndarray):
            out.append((leaf.path, stored.data))  # moved: what `materialize` gives
            continue
        try:
            value = materialize(leaf, stored, as_arrays)
        except CheckpointError as exc:  # every message starts with the file's path
            raise reader.error(str(exc)) from None
        if reader.foreign and not as_arrays and leaf.kind != "array":
            # Another framework's F16/BF16 weights are its full-precision
            # values: widen them (exactly) to full-precision float32.
            value = value.to_full_precision()
        out.append((leaf.path, value))
    return out


def _tree(where: str, pairs: list[tuple[Leaf, LeafArrays]], as_arrays: bool) -> Any:
    """The tree of the leaves of another tool's layout (compressed-tensors, GGUF): an
    unscaled float leaf is that tool's full-precision values (widened, as in a foreign
    safetensors file), an encoded one a Tensor in its format."""
    items = []
    for (leaf, _), stored in zip(pairs, _on_device(pairs), strict=True):
        value = materialize(leaf, stored, as_arrays)
        if not as_arrays and leaf.kind == "tensor" and leaf.scaling is None:
            value = value.to_full_precision()
        items.append((leaf.path, value))
    try:
        return unflatten(items)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{where}: the tensor names do not form a tree ({exc})") from None


def _path_argument(verb: str, path: Any) -> str:
    """`path` as a str: a str, a bytes path or an `os.PathLike`; anything else refused."""
    if isinstance(path, str | bytes | os.PathLike):
        return os.fsdecode(os.fspath(path))
    raise PrecisionTypeError(
        f"precision.{verb} needs a file path (a str or pathlib.Path), got "
        f"{type(path).__name__} {path!r:.60}; pass e.g. 'model.safetensors'"
    )


def _check_flag(name: str, value: Any, error: type[TypeError] = PrecisionTypeError) -> None:
    if not isinstance(value, bool | np.bool_):
        hint = " (a non-empty string is truthy)" if isinstance(value, str) else ""
        raise error(
            f"{name} must be True or False, got {type(value).__name__} {value!r:.60}{hint}; "
            f"pass {name}=True or {name}=False"
        )


def load(path: str | os.PathLike[str], *, as_arrays: bool = False) -> Any:
    """Load a checkpoint written by `save`, any safetensors file, or the layouts
    `precision convert --layout` writes for other tools (compressed-tensors, GGUF).

    A file written by `save` comes back as the nested dicts and lists of its
    key paths (tuples and custom pytree nodes come back as lists and dicts)
    with each Tensor in its stored format, bit for bit. A foreign
    safetensors file comes back as a dict of name to full-precision float32
    Tensor (F16, BF16 and F8 values widened exactly); integer and bool
    tensors load as arrays. Convert with `to_reduced_precision` to store them
    narrow again. A compressed-tensors directory (its `config.json` names the
    quantization) and a GGUF file load the same way, their quantized weights
    as Tensors of the encoding their bytes hold (int8, int4, int2, e4m3, mxfp4
    with their scales; docs/cli.md, "Model directories and layouts for other tools").

    Args:
        path: the file (safetensors or GGUF); or a sharded checkpoint (as
            `precision convert` and model hubs write it): its directory, or its
            `*.safetensors.index.json`, whose shards load into one tree.
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
    _check_flag("as_arrays", as_arrays)
    path = _path_argument("load", path)
    if _gguf.is_gguf(path):
        with _collector_paused():
            return _tree(path, _gguf.read(path), as_arrays)
    with _collector_paused(), Source(path) as source:
        _refuse_beyond_memory(source)
        quantized = _compressed_tensors.config_of(source)
        if quantized is not None:
            return _tree(source.path, _compressed_tensors.read(source, quantized), as_arrays)
        items: list[tuple[Any, Any]] = []
        for reader in source.readers:
            batch: list[tuple[Leaf, LeafArrays]] = []
            size = 0
            for leaf in reader.leaves:
                stored = reader.read_leaf(leaf)
                batch.append((leaf, stored))
                size += sum(a.nbytes for a in stored if a is not None)
                if size >= _BATCH_BYTES or len(batch) >= _BATCH_LEAVES:
                    items += _materialized(reader, batch, as_arrays)
                    batch, size = [], 0
            items += _materialized(reader, batch, as_arrays)
        try:
            return unflatten(items)
        except (ValueError, RecursionError) as exc:
            raise CheckpointError(
                f"{source.path}: the key paths do not form a tree ({exc})"
            ) from None
