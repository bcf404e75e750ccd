"""The conversion of `precision convert`: each planned tensor, streamed in blocks.

What each tensor becomes is decided by the command (`_convert._plan`); how
it is converted, its mode, by `_mode` here. The conversion itself never
holds more than one tensor's input, and usually only one block of it
(`_Engine`):

* **flat** — unscaled formats and per-block scaling along the last axis
  encode each value from itself or its block alone, so the tensor's values
  are encoded in fixed-size blocks of its flat order (the last one padded),
  one compiled program for every tensor;
* **two passes** — per-tensor scaling needs the absmax first: one pass reads
  it (exact: a maximum), the second encodes each block with that absmax
  appended as an extra value, which gives every value the scale of the
  whole tensor, so the codes are those of the whole-tensor encode;
* **two-level** — NVFP4's e4m3 block scales hang on the tensor's absmax:
  one pass reads it, the second encodes each block with one more scaling
  block holding it, which gives every block the whole tensor's float32
  tensor scale;
* **rows** — per-axis scaling along the first axis: blocks of whole rows;
* **columns** — per-axis scaling along another axis: one pass for every
  group's absmax, then row blocks encoded with one more row holding them;
* **cast** — unscaled nearest-even conversion into a format with an
  ml_dtypes type: a numpy cast in blocks, nothing compiled;
* **intcast** — int8 with one float32 scale for the tensor, nearest even:
  the absmax pass, then numpy blocks (`_numpy_int` says why the codes are
  the library's), nothing compiled; an absmax outside `_NUMPY_ABSMAX`
  takes the two passes above;
* **whole** — everything else (stochastic rounding, int1's mean scales,
  asymmetric integers' min/max scales over more than a block or a row,
  inputs stored in a precision format): the tensor is encoded at once, its
  statistics taken in row slices. `--dry-run` says which mode each tensor
  takes, and why when whole.

Every path gives the bytes the library's own `Format.encode` gives for the
whole tensor (tests/precision/test_cli.py checks each). The statistics (SQNR
per tensor) are computed in the same compiled program as the encode; in
float32 sums of values divided by the block's absmax, accumulated in
float64, so neither overflows.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import os
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import ml_dtypes
import numpy as np

import dtypes

from .._checkpoint._io import encoded
from .._checkpoint._layout import Leaf, two_level
from .._checkpoint._reader import Reader, aligned_empty
from ._interrupts import check_interrupt, deferring, import_jax
from ._output import _DataError

if TYPE_CHECKING:
    import jax

_BLOCK = 1 << 20  # values per block of a streamed conversion (4 MiB of float32)

# Input containers whose float32 value is their logical value (an exact cast).
_RAW_FLOATS = {np.dtype(t) for t in ("float32", "float16", "bfloat16")} | {
    np.dtype(dtypes.float8_e4m3fn.container),
    np.dtype(dtypes.float8_e5m2.container),
}


# --------------------------------------------------------------------------
# the plan of one tensor, and how it is converted


@dataclasses.dataclass
class _Plan:
    reader: Reader
    leaf: Leaf  # as stored in the input
    out: Leaf  # as written to the output
    reason: str | None  # why it is copied unchanged, or None when converted
    mode: str = "copy"  # copy, cast, flat, twopass, twolevel, rows, columns, whole
    note: str = ""  # why the tensor is encoded whole


def _raw(leaf: Leaf, foreign: bool) -> bool:
    """Whether the stored data of `leaf`, cast to float32, is its logical value."""
    if leaf.scale is not None or leaf.data_dtype not in _RAW_FLOATS:
        return False
    if leaf.kind == "array" or foreign:
        return True
    fmt = leaf.format
    return isinstance(fmt, dtypes.FloatFormat) and fmt.native_dtype == leaf.data_dtype


def _per_byte_ok(fmt: dtypes.Format, last: int) -> bool:
    """Whether rows of `last` values pack without padding (so flat order packs the same)."""
    return not fmt.packed or (last * fmt.code_bits) % 8 == 0


def _castable(fmt: dtypes.Format, scaling: dtypes.Scaling | None, rounding: str) -> bool:
    """Whether encoding is a plain numpy cast into the format's ml_dtypes type.

    The library encodes unscaled nearest-even values into a format with a
    native type as XLA's convert, which matches ml_dtypes bit for bit (the
    tests compare every path with `Format.encode`); numpy does it without
    compiling anything.
    """
    native = getattr(fmt, "native_dtype", None)
    return (
        scaling is None
        and rounding == "nearest_even"
        and native is not None
        and not getattr(fmt, "saturate", False)
        and np.dtype(native) == np.dtype(fmt.container)
    )


#: Per-tensor absmax range in which numpy gives an integer encode's codes:
#: inside it the library's scale rule takes none of its special paths
#: (flushed, subnormal, near-overflow or pre-divided scales; `dtypes` has
#: them), and a product `x * (qmax / absmax)` that numpy keeps subnormal
#: where XLA:CPU flushes it lies below 2**-19, which rounds to 0 either way.
_NUMPY_ABSMAX = (2.0**-100, 2.0**100)


def _numpy_int(fmt: dtypes.Format, scaling: dtypes.Scaling, rounding: str) -> bool:
    """Whether a per-tensor integer encode may run in numpy (`_Converter._int_blocks`).

    Its codes are `clip(rint(x * (qmax / absmax)), -qmax, qmax)` in float32,
    the scale `absmax / qmax`: correctly rounded IEEE operations, the same in
    numpy as in the library's compiled encode for an absmax in `_NUMPY_ABSMAX`
    and nearest-even rounding (tests/precision/test_cli_numpy_int.py compares them).
    """
    return (
        fmt.kind == "int"
        and not getattr(fmt, "binary", False)
        and np.dtype(fmt.container) == np.int8
        and not fmt.packed
        and not scaling.power_of_two
        and scaling.scale_format == "float32"
        and rounding == "nearest_even"
    )


def _int_codes(
    x: np.ndarray, absmax: np.float32, qmax: np.float32, out: np.ndarray | None = None
) -> np.ndarray:
    """Integer codes `clip(rint(x * (qmax / absmax)), -qmax, qmax)` of float32 `x`, whose
    tensor's absmax lies in `_NUMPY_ABSMAX`, as float32 (in `out` if given)."""
    y: np.ndarray = np.multiply(x, qmax / absmax, out=out)  # one reciprocal, as the library's
    np.rint(y, out=y)  # halves to even
    np.clip(y, -qmax, qmax, out=y)
    return y


def _mode(plan: _Plan, rounding: str) -> tuple[str, str]:
    """How a tensor is converted (a mode of the module docstring), and why when whole."""
    leaf, out = plan.leaf, plan.out
    fmt, scaling, shape = out.format, out.scaling, out.shape
    assert fmt is not None
    if not _raw(leaf, plan.reader.foreign):
        return "whole", "stored encoded: decoded whole"
    if rounding == "stochastic":
        return "whole", "stochastic rounding"
    if fmt.kind == "scale":
        return "whole", "a scale format: every value is checked first"
    if not shape:
        return "whole", "a scalar"
    if _castable(fmt, scaling, rounding):
        return "cast", ""
    if 0 in shape:
        return "whole", "empty"
    binary = getattr(fmt, "binary", False)
    last = shape[-1]
    packed_rows = "rows end inside a packed byte"
    if scaling is None:
        return ("flat", "") if _per_byte_ok(fmt, last) else ("whole", packed_rows)
    if binary:
        # int1's scale is a mean: its summation order must stay the library's
        return "whole", "int1 mean scales"
    # Asymmetric integers scale from each group's minimum and maximum, not its
    # absmax: only modes where every block holds whole groups apply.
    ranged = fmt.kind == "uint"
    ndim = len(shape)
    if isinstance(scaling, dtypes.PerTensor):
        if ranged:
            return "whole", "one min/max scale for the tensor"
        if _numpy_int(fmt, scaling, rounding):
            return "intcast", ""
        return ("twopass", "") if _per_byte_ok(fmt, last) else ("whole", packed_rows)
    if isinstance(scaling, dtypes.PerBlock) and scaling.axis % ndim == ndim - 1:
        size = int(scaling.size)
        if last % size == 0 and _per_byte_ok(fmt, size) and size <= _BLOCK:
            # two-level scales hang on the whole tensor's absmax: read first,
            # given to each block as one more group holding it
            return ("twolevel" if two_level(scaling) else "flat"), ""
        return "whole", "blocks do not tile the rows"
    if two_level(scaling):
        return "whole", "two-level scales across the tensor"
    if isinstance(scaling, dtypes.PerAxis) and len(scaling.axes) > 1:
        return "whole", "scales along several axes"
    if isinstance(scaling, dtypes.PerAxis) and scaling.kept(ndim) == (0,) and ndim >= 2:
        return "rows", ""
    if isinstance(scaling, dtypes.PerAxis) and ndim >= 2 and not ranged:
        return "columns", ""
    return "whole", "groups across rows"


#: What --dry-run says of each mode.
_HOW = {
    "cast": "streamed (numpy cast)",
    "flat": "streamed in blocks",
    "twopass": "absmax pass, then blocks",
    "intcast": "absmax pass, then numpy blocks",
    "twolevel": "absmax pass, then blocks",
    "rows": "streamed by rows",
    "columns": "group absmax pass, then rows",
    "whole": "whole tensor",
}


# --------------------------------------------------------------------------
# the engine: compiled encodes with their statistics


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    if signal == 0 or math.isinf(noise):
        return -math.inf
    return 10 * math.log10(signal / noise)


class _Stats:
    """Σx² and Σ(x - decoded)² over the finite values of one tensor, in float64."""

    def __init__(self) -> None:
        self.signal = 0.0
        self.noise = 0.0

    def add(self, m: Any, sig: Any, noi: Any) -> None:
        m2 = float(m) ** 2
        self.signal += float(sig) * m2
        self.noise += float(noi) * m2

    @property
    def sqnr(self) -> float:
        return _sqnr(self.signal, self.noise)


def _energy(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(max |x|, Σ(x/max)², Σ((x-y)/max)²) over the finite values of x (traced)."""
    import jax.numpy as jnp

    finite = jnp.isfinite(x)
    ax = jnp.where(finite, jnp.abs(x), jnp.float32(0))
    m = jnp.max(ax, initial=0.0)
    inv = jnp.where(m > 0, 1 / jnp.where(m > 0, m, 1), jnp.float32(1))
    xs = jnp.where(finite, x * inv, jnp.float32(0))
    d = jnp.where(finite, (x - y) * inv, jnp.float32(0))
    # a finite value the format cannot hold (NaN in E8M0, overflow to NaN in e4m3) is lost
    d = jnp.where(jnp.isnan(d), jnp.float32(jnp.inf), d)
    return m, jnp.sum(xs * xs), jnp.sum(d * d)


#: Float32 dot products are exact enough for a statistic in dB (relative error
#: about 1e-6 per block); below this or above float32's range their squares
#: underflow or overflow, and the block is summed again in float64.
_TINY_ENERGY = 2.0**-60


def _trusted(energy: float, v: np.ndarray) -> bool:
    """Whether a float32 Σv² is trustworthy: finite, and not made of underflowed squares."""
    if energy == 0:
        return not np.any(v)
    return _TINY_ENERGY < energy < math.inf


@functools.cache
def _widening_table(dtype: np.dtype[Any]) -> np.ndarray:
    """float32 value of every bit pattern of a 1- or 2-byte float type (numpy's own cast)."""
    codes = np.arange(1 << (8 * dtype.itemsize), dtype=f"u{dtype.itemsize}")
    with np.errstate(all="ignore"):
        table: np.ndarray = codes.view(dtype).astype(np.float32)
    return table


def _widened(y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`y` as float32 (into `out` if given): a table lookup for float16 and float8
    types (numpy's and ml_dtypes' element-by-element casts of these are 1.5-5x
    slower), a cast otherwise."""
    if _by_table(y.dtype):
        table = _widening_table(y.dtype)
        return np.take(table, y.view(f"u{y.dtype.itemsize}"), out=out, mode="clip")
    if out is None:
        return y.astype(np.float32)
    np.copyto(out, y, casting="unsafe")
    return out


_SCRATCH: list[np.ndarray] = [np.empty(0, np.float32), np.empty(0, np.float32)]


def _scratch(n: int, slot: int = 0) -> np.ndarray:
    """A float32 buffer of `n` values, reused from block to block (taken by the main
    thread, each worker given its own part); slot 0 is the statistics' own."""
    if _SCRATCH[slot].size < n:
        _SCRATCH[slot] = np.empty(n, np.float32)
    return _SCRATCH[slot][:n]


def _by_table(dtype: np.dtype[Any]) -> bool:
    return dtype.itemsize <= 2 and dtype != ml_dtypes.bfloat16  # (bfloat16's cast is a shift)


def _numpy_energy(x: np.ndarray, y: np.ndarray, d: np.ndarray) -> tuple[float, float]:
    """(Σx², Σ(x - y)²) over the finite values of one block (or part), `d` a float32
    scratch shaped like `x`.

    Float32 BLAS dot products (a quarter of the time of float64 sums), checked:
    a block whose sums are not finite or so small that squares may have
    underflowed is summed again in float64. A finite value that became inf or
    NaN (overflow in a format without inf) makes the noise infinite: it was lost.
    """
    with np.errstate(all="ignore"):
        # into a reused buffer: a fresh 4 MiB array per block costs its page faults
        if _by_table(y.dtype):
            np.subtract(x, _widened(y, out=d), out=d)
        else:
            np.subtract(x, y, out=d, dtype=np.float32)
        sig, noi = float(np.dot(x, x)), float(np.dot(d, d))
        if _trusted(sig, x) and _trusted(noi, d):
            return sig, noi
        sig = float(np.einsum("i,i->", x, x, dtype=np.float64))
        noi = float(np.einsum("i,i->", d, d, dtype=np.float64))
        if math.isfinite(sig) and math.isfinite(noi):
            return sig, noi
        finite = np.isfinite(x)
        xs = np.where(finite, x, 0)
        ds = np.where(finite, d, 0)
        ds = np.where(np.isnan(ds), np.inf, ds)
        sig = float(np.einsum("i,i->", xs, xs, dtype=np.float64))
        noi = float(np.einsum("i,i->", ds, ds, dtype=np.float64))
    return sig, noi


_WORKERS = max(1, min(4, os.cpu_count() or 1))
_PART = 1 << 16  # values a part holds at least: smaller blocks run in one
_POOL: list[concurrent.futures.ThreadPoolExecutor] = []
_T = TypeVar("_T")


def _in_parts(fn: Callable[[slice], _T], n: int) -> list[_T]:
    """`fn` over the `n` values of a block in up to `_WORKERS` parts, on worker threads.

    numpy releases the GIL in its casts, ufuncs and dot products, so the parts
    run at once (a float16 cast with its statistics: 1.4 instead of 2.6 ms per
    2**20 values on two cores). Each part sets its own floating-point error
    state (numpy's is per thread). A SIGINT waits until every part is done
    (`deferring`): no worker is left writing into the block's buffers, or
    half started.
    """
    parts = min(_WORKERS, max(1, n // _PART))
    if parts == 1:
        return [fn(slice(0, n))]
    step = -(-n // parts)
    with deferring():
        if not _POOL:
            _POOL.append(concurrent.futures.ThreadPoolExecutor(_WORKERS, "precision-convert"))
        return list(_POOL[0].map(fn, [slice(i, min(i + step, n)) for i in range(0, n, step)]))


#: A part of a numpy block conversion: (x, y, scratch buffers, stats, part) -> the
#: part's energies, or None without statistics.
_Part = Callable[
    [np.ndarray, np.ndarray, tuple[np.ndarray, ...], bool, slice], tuple[float, float] | None
]


def _cast_part(
    x: np.ndarray, y: np.ndarray, scratch: tuple[np.ndarray, ...], stats: bool, p: slice
) -> tuple[float, float] | None:
    """Part `p` of a block cast into `y` (unless it is `x`), and its energies if `stats`."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is the format's inf
        if y is not x:
            y[p] = x[p]
    return _numpy_energy(x[p], y[p], scratch[0][p]) if stats else None


def _int_part(
    top: tuple[np.float32, np.float32],
    x: np.ndarray,
    codes: np.ndarray,
    scratch: tuple[np.ndarray, ...],
    stats: bool,
    p: slice,
) -> tuple[float, float] | None:
    """Part `p` of a block's integer codes into `codes` (`top`: absmax, qmax), and its
    energies against the decoded codes if `stats`."""
    (absmax, qmax), (d, y) = top, scratch
    np.copyto(codes[p], _int_codes(x[p], absmax, qmax, y[p]), casting="unsafe")  # exact
    if not stats:
        return None
    decoded = np.multiply(codes[p], absmax / qmax, out=y[p], dtype=np.float32)
    return _numpy_energy(x[p], decoded, d[p])


class _Engine:
    """Compiled encodes of one (format, scaling, rounding), cached by input shape and dtype."""

    def __init__(
        self, fmt: dtypes.Format, scaling: dtypes.Scaling | None, rounding: str, stats: bool
    ):
        self.fmt, self.scaling, self.rounding, self.stats = fmt, scaling, rounding, stats
        self._cache: dict[tuple[Any, ...], Any] = {}

    def _jit(self, key: tuple[Any, ...], build: Callable[[], Callable[..., Any]]) -> Any:
        fn = self._cache.get(key)
        if fn is None:
            import jax

            fn = self._cache[key] = jax.jit(build())
        return fn

    def block(
        self,
        x: np.ndarray,
        scaling: dtypes.Scaling | None,
        absmax: Any = None,
        twolevel: bool = False,
    ) -> tuple[tuple[np.ndarray | None, ...], bool, Any]:
        """Encode one block: ((data, scale, tensor scale, zero points), all finite, stats or
        None), synchronously; absent arrays are None."""
        import jax.numpy as jnp

        fmt, rounding, stats = self.fmt, self.rounding, self.stats
        appended = absmax is not None
        slab = appended and (np.ndim(absmax) > 0 or twolevel)
        key = ("block", x.shape, x.dtype.name, scaling, appended, slab, twolevel)

        def build() -> Callable[..., Any]:
            def f(raw: jax.Array, top: jax.Array) -> tuple[tuple[Any, ...], jax.Array, Any]:
                xf = raw.astype(jnp.float32)
                finite = jnp.all(jnp.isfinite(xf))
                if slab:  # one more row: every group's absmax, or one group the tensor's
                    rows = xf.shape[0]
                    if twolevel:
                        top = jnp.zeros((1, xf.shape[1]), jnp.float32).at[0, 0].set(top)
                    enc = fmt.encode(jnp.concatenate([xf, top]), scaling=scaling, rounding=rounding)
                    data, scale = enc.data[:rows], enc.scale
                    if twolevel:
                        assert scale is not None  # two-level encodings are scaled
                        scale = scale[:rows]
                    y = enc.decode(jnp.float32)[:rows] if stats else None
                    flat = xf
                elif appended:
                    flat = xf.reshape(-1)
                    n = flat.shape[0]
                    enc = fmt.encode(
                        jnp.concatenate([flat, top.reshape(1)]), scaling=scaling, rounding=rounding
                    )
                    nbytes = n * fmt.code_bits // 8 if fmt.packed else n
                    data = enc.data[:nbytes]
                    y = enc.decode(jnp.float32)[:n] if stats else None
                    scale = enc.scale
                else:
                    enc = fmt.encode(xf, scaling=scaling, rounding=rounding)
                    data, scale = enc.data, enc.scale
                    y = enc.decode(jnp.float32).reshape(xf.shape) if stats else None
                    flat = xf
                energy = _energy(flat, y) if y is not None else None  # y: with stats
                return (data, scale, enc.tensor_scale, enc.zero_point), finite, energy

            return f

        fn = self._jit(key, build)
        top = np.float32(0) if absmax is None else np.asarray(absmax, np.float32)
        parts, finite, energy = fn(x, top)
        # np.asarray waits: the input buffer may be reused after this
        arrays = tuple(None if a is None else np.asarray(a) for a in parts)
        return arrays, bool(finite), energy

    def whole(self, x: Any, key: Any, scaling: dtypes.Scaling | None) -> tuple[Any, ...]:
        """Encode a whole tensor (raw floats, cast inside the program): (data, scale,
        tensor scale, zero points), absent arrays None."""
        import jax.numpy as jnp

        fmt, rounding = self.fmt, self.rounding
        ck = ("whole", x.shape, str(x.dtype), key is None, scaling)

        def build() -> Callable[..., Any]:
            def f(raw: jax.Array, k: jax.Array | None) -> tuple[jax.Array | None, ...]:
                enc = fmt.encode(raw.astype(jnp.float32), scaling=scaling, rounding=rounding, key=k)
                return enc.data, enc.scale, enc.tensor_scale, enc.zero_point

            return f

        parts: tuple[Any, ...] = self._jit(ck, build)(x, key)
        return parts

    def slice_energy(self, out: Leaf, x: Any, parts: tuple[Any, ...]) -> tuple[bool, _Stats]:
        """Statistics and finiteness of a whole-tensor encode, taken in row slices."""
        import jax
        import jax.numpy as jnp

        fmt, scaling = out.format, out.scaling
        assert fmt is not None
        data, scale, tensor_scale, zero_point = parts
        shape, scale_shape = out.shape, out.scale_shape
        last = (shape[-1] if shape else None) if fmt.packed else None
        stats = _Stats()
        finite = True
        rows = shape[0] if len(shape) >= 2 else 0
        sliceable = rows > 1 and (scale_shape is None or scale_shape[0] in (1, rows))
        row_values = math.prod(shape[1:]) if shape else 1
        step = max(1, _BLOCK // max(row_values, 1)) if sliceable else max(rows, 1)
        pieces: list[slice | None] = [None]
        if sliceable:
            pieces = [slice(r, min(r + step, rows)) for r in range(0, rows, step)]
        for piece in pieces:
            if piece is None:
                d, s, z, xc, sub = data, scale, zero_point, x, shape
            else:
                n = piece.stop - piece.start
                d, xc = data[piece], x[piece]
                s = scale if scale is None or scale.shape[0] == 1 else scale[piece]
                z = zero_point
                if z is not None and z.shape[0] != 1:
                    z = z[piece]
                sub = (n, *shape[1:])
            ck = ("energy", sub, str(xc.dtype), None if s is None else s.shape)

            def build(sub: tuple[int, ...] = sub) -> Callable[..., Any]:
                def f(
                    raw: jax.Array, dd: jax.Array, ss: Any, ts: Any, zz: Any
                ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
                    xf = raw.astype(jnp.float32)
                    enc = dtypes.Encoded(dd, ss, fmt, scaling, last, tensor_scale=ts, zero_point=zz)
                    y = enc.decode(jnp.float32)
                    return jnp.all(jnp.isfinite(xf)), _energy(xf, y.reshape(xf.shape))

                return f

            ok, energy = self._jit(ck, build)(xc, d, s, tensor_scale, z)
            finite = finite and bool(ok)
            stats.add(*jax.device_get(energy))
        return finite, stats


# --------------------------------------------------------------------------
# reading blocks


class _Blocks:
    """The raw values of one stored array, read in blocks into one reused buffer.

    The reader's CRC-32 (files written by `save`) is checked after the last
    block, so a caller writing what it computed must discard it then (the
    writer does, by raising through).
    """

    def __init__(self, reader: Reader, name: str):
        self.reader, self.name = reader, name
        self.entry = reader.entries[name]

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.blocks(_BLOCK)

    def blocks(self, values: int, pad: bool = False) -> Iterator[np.ndarray]:
        """Flat blocks of `values` values; the last one zero-padded to full size when `pad`."""
        entry, reader = self.entry, self.reader
        dtype = entry.dtype
        total = int(np.prod(entry.shape, dtype=np.int64))
        buf = aligned_empty((min(values, max(total, 1)) if not pad else values,), dtype)
        crc = 0
        with open(reader.path, "rb", buffering=0) as f:
            for start in range(0, total, values):
                n = min(values, total - start)
                view = buf[:n].view(np.uint8).data
                reader.fill(f, entry.begin + start * dtype.itemsize, view, self.name)
                if reader.crc is not None:
                    crc = zlib.crc32(view, crc)
                del view
                if pad and n < len(buf):
                    buf[n:] = 0
                    yield buf
                else:
                    yield buf[:n]
        reader.check_crc(self.name, crc)


# --------------------------------------------------------------------------
# one tensor


class _Converter:
    """Produces the output arrays of every plan, one tensor (and block) at a time."""

    def __init__(self, engine: _Engine, rounding: str, seed: int, progress: Any):
        self.engine, self.rounding, self.seed, self.progress = engine, rounding, seed, progress
        self.sqnr: dict[str, float] = {}
        self._key = None

    def _not_finite(self, plan: _Plan) -> _DataError:
        fmt = plan.out.format
        assert fmt is not None
        if plan.out.scaling is None:
            return _DataError(
                f"tensor {plan.leaf.name!r} holds NaN or inf, which {fmt.name} (neither inf nor "
                "NaN) cannot hold: it would become ±max or 0 silently; keep it (--exclude) or "
                "choose a format with inf and NaN"
            )
        return _DataError(
            f"tensor {plan.leaf.name!r} holds NaN or inf, which a scaled {fmt.name} encoding "
            "cannot hold; keep it (--exclude) or choose an unscaled float format"
        )

    def arrays(self, plans: list[_Plan]) -> Iterator[tuple[str, Any]]:
        for i, plan in enumerate(plans):
            check_interrupt()
            self.progress.set_postfix_str(plan.leaf.name, refresh=False)
            if plan.reason is not None:
                for name, _, _ in plan.leaf.arrays():
                    yield name, self._copy(plan.reader, name)
            elif plan.mode == "whole":
                yield from self._whole(plan, i)
            elif plan.mode == "cast":
                yield plan.out.name, self._cast(plan)
            else:
                # per-group arrays, filled while the codes are written
                extras: dict[str, list[np.ndarray]] = {r: [] for r in plan.out.roles()[1:]}
                yield plan.out.name, self._streamed(plan, extras)
                for (name, dtype, shape), role in zip(
                    plan.out.arrays()[1:], plan.out.roles()[1:], strict=True
                ):
                    array = np.concatenate([a.reshape(-1) for a in extras[role]])
                    yield name, array.reshape(shape).view(dtype)

    def _copy(self, reader: Reader, name: str) -> Iterator[np.ndarray]:
        """The stored bytes, checked against their encoding's invariants as `load` would:
        a copy never writes what `load` refuses."""
        shape = tuple(reader.entries[name].shape)
        row = math.prod(shape[1:]) if len(shape) > 1 else 1
        values = max(row, (_BLOCK * 4) // row * row)  # whole rows per block
        total, done = math.prod(shape), 0
        for block in _Blocks(reader, name).blocks(values):
            check_interrupt()
            done += block.size
            if len(shape) > 1:
                reader.check_values(name, block.reshape(-1, *shape[1:]))
            else:
                reader.check_values(name, block.reshape(shape), whole_rows=done == total)
            yield block
            self.progress.update(block.nbytes)

    def _cast(self, plan: _Plan) -> Iterator[np.ndarray]:
        """Blocks cast by numpy into the format's ml_dtypes type, with their statistics."""
        assert plan.out.format is not None
        target = np.dtype(plan.out.format.container)
        blocks = _Blocks(plan.reader, plan.leaf.name).blocks(_BLOCK)
        return self._numpy_blocks(plan, blocks, target, _cast_part, scratches=1)

    def _numpy_blocks(
        self,
        plan: _Plan,
        blocks: Iterator[np.ndarray],
        target: np.dtype[Any],
        part: _Part,
        scratches: int,
    ) -> Iterator[np.ndarray]:
        """Each block as float32 `x` into a `target` array `y` (`x` itself for float32) by
        `part(x, y, scratch, stats, p)` over parts `p` on worker threads (`scratch`: that
        many float32 buffers like `x`, slot 0 the statistics'); their energies added up,
        the tensor's SQNR kept."""
        stats = _Stats()
        for block in blocks:
            check_interrupt()
            x = block if block.dtype == np.float32 else block.astype(np.float32)
            y = x if target == np.float32 else np.empty(x.shape, target)
            scratch = tuple(_scratch(x.size, slot) for slot in range(scratches))
            run = functools.partial(part, x, y, scratch, self.engine.stats)
            for energy in _in_parts(run, x.size):
                if energy is not None:
                    stats.add(1.0, *energy)
            yield y.view(plan.out.data_dtype)
            self.progress.update(block.nbytes)
        if self.engine.stats:
            self.sqnr[plan.leaf.name] = stats.sqnr

    def _streamed(self, plan: _Plan, extras: dict[str, list[np.ndarray]]) -> Iterator[np.ndarray]:
        out, engine = plan.out, self.engine
        scaling = out.scaling
        total = math.prod(out.shape)
        g = _granule(plan)
        per_block = _block_values(total, g)
        if plan.mode in ("rows", "columns"):
            shape: tuple[int, ...] = (per_block // math.prod(out.shape[1:]), *out.shape[1:])
        elif isinstance(scaling, dtypes.PerBlock):
            size = int(scaling.size)
            shape = (per_block // size, size)
        else:
            shape = (per_block,)
        blocks = _Blocks(plan.reader, plan.leaf.name)
        absmax: np.floating | np.ndarray | None = None
        if plan.mode in ("twopass", "twolevel", "intcast"):  # the absmax first (a maximum)
            absmax = np.float32(0)
            for block in blocks.blocks(per_block):
                # two reductions, no |x| array
                m = np.float32(np.maximum(np.max(block), -np.min(block)))  # NaN kept
                if not np.isfinite(m):
                    raise self._not_finite(plan)
                absmax = max(absmax, m)
        elif plan.mode == "columns":  # every group's absmax first, as a slab of one row
            absmax = self._slab(plan, blocks, per_block)
        if plan.mode == "intcast":
            assert absmax is not None
            low, high = _NUMPY_ABSMAX
            if low <= float(absmax) <= high:
                yield from self._int_blocks(plan, blocks, np.float32(absmax), extras)
                return
            import_jax()  # the library's special scales: its compiled encode
        stats = _Stats()
        done = 0
        # per-group arrays of each block, or (a per-tensor or per-axis scale
        # computed from the absmax given) one copy shared by every block
        shared = plan.mode in ("twopass", "intcast", "columns")
        for block in blocks.blocks(per_block, pad=True):
            check_interrupt()
            n = min(per_block, total - done)
            parts, finite, energy = engine.block(
                block.reshape(shape), scaling, absmax, twolevel=plan.mode == "twolevel"
            )
            if (scaling is not None or _no_specials(plan)) and not finite:  # padding: zeros
                raise self._not_finite(plan)
            if energy is not None:
                stats.add(*energy)
            data = parts[0]
            assert data is not None  # every encoding has codes
            # Padding is proportional in every mode: whole rows, whole scale
            # groups, or (packed) a multiple of a byte's worth of values.
            yield data.reshape(-1)[: data.size * n // per_block].view(out.data_dtype)
            for role, array in zip(("scale", "tensor_scale", "zero_point"), parts[1:], strict=True):
                if array is None:
                    continue
                kept = extras[role]
                if role == "tensor_scale" or shared:
                    kept[:] = [array.reshape(-1)]  # the same in every block
                else:
                    kept.append(array.reshape(-1)[: array.size * n // per_block])
            done += n
            self.progress.update(n * plan.leaf.data_dtype.itemsize)
        if engine.stats:
            self.sqnr[plan.leaf.name] = stats.sqnr

    def _int_blocks(
        self, plan: _Plan, blocks: _Blocks, absmax: np.float32, extras: dict[str, list[np.ndarray]]
    ) -> Iterator[np.ndarray]:
        """Integer codes of one scale for the whole tensor, block by block in numpy."""
        assert plan.out.format is not None
        qmax = np.float32(plan.out.format.max)  # the largest code
        extras["scale"][:] = [np.array([absmax / qmax], np.float32)]
        encode = functools.partial(_int_part, (absmax, qmax))
        int8 = np.dtype(np.int8)
        yield from self._numpy_blocks(plan, blocks.blocks(_BLOCK), int8, encode, scratches=2)

    def _slab(self, plan: _Plan, blocks: _Blocks, per_block: int) -> np.ndarray:
        """One row, shaped like the tensor's rows, holding each per-axis group's absmax."""
        out = plan.out
        scaling = out.scaling
        assert isinstance(scaling, dtypes.PerAxis)
        ndim = len(out.shape)
        (axis,) = scaling.kept(ndim)  # one axis: several are converted whole
        others = tuple(i for i in range(ndim) if i != axis)
        top = np.zeros(out.shape[axis], np.float32)
        for block in blocks.blocks(per_block):
            part = np.abs(block.reshape(-1, *out.shape[1:]))
            m = np.max(part, axis=others) if part.size else top
            if not np.all(np.isfinite(m)):
                raise self._not_finite(plan)
            np.maximum(top, m, out=top)
        along = [1] * ndim
        along[axis] = out.shape[axis]
        return np.ascontiguousarray(np.broadcast_to(top.reshape(along), (1, *out.shape[1:])))

    def _whole(self, plan: _Plan, i: int) -> Iterator[tuple[str, Any]]:
        import jax

        out, engine = plan.out, self.engine
        stored = plan.reader.read_leaf(plan.leaf)
        if _raw(plan.leaf, plan.reader.foreign):
            x = jax.device_put(stored.data)
        else:
            x = encoded(plan.leaf, stored).decode(np.float32)
        del stored
        if out.format is not None and out.format.kind == "scale":
            # a scale format as the values' format (E8M0): refuse what it would turn to NaN
            try:
                out.format.check(x)
            except dtypes.PrecisionError as err:
                raise _DataError(f"tensor {plan.leaf.name!r}: {err}") from None
        key = None
        if self.rounding == "stochastic":
            key = jax.random.fold_in(jax.random.key(self.seed), i)
        parts = engine.whole(x, key, plan.out.scaling)
        if out.scaling is not None or engine.stats or _no_specials(plan):
            finite, stats = engine.slice_energy(out, x, parts)
            if (out.scaling is not None or _no_specials(plan)) and not finite:
                raise self._not_finite(plan)
            if engine.stats:
                self.sqnr[plan.leaf.name] = stats.sqnr
        del x
        self.progress.update(plan.leaf.data_dtype.itemsize * max(math.prod(out.shape), 1))
        present = [p for p in parts if p is not None]
        del parts
        for name, dtype, shape in out.arrays():
            array = present.pop(0)  # not held once written
            yield name, np.asarray(array).reshape(shape).view(dtype)
            del array


def _granule(plan: _Plan) -> int:
    """Values a block holds a multiple of (packing, block groups, rows)."""
    out = plan.out
    fmt = out.format
    assert fmt is not None
    g = 8 if fmt.packed else 1
    if isinstance(out.scaling, dtypes.PerBlock):
        g = math.lcm(g, int(out.scaling.size))
    if plan.mode in ("rows", "columns"):
        g = math.prod(out.shape[1:])
    return g


def _block_values(total: int, g: int) -> int:
    """Values per block for a tensor of `total` values: one of a few fixed sizes.

    Few sizes mean few compiled programs (compiling costs more than encoding
    a small tensor padded to 4096 values); each is a multiple of `g`.
    """
    for size in (_BLOCK >> 8, _BLOCK >> 4, _BLOCK):
        size = max(g, size // g * g)
        if size >= total:
            return size
    return max(g, _BLOCK // g * g)


def _no_specials(plan: _Plan) -> bool:
    """Whether the output format has neither inf nor NaN (e2m1, e3m2, e2m3) and does not
    saturate: NaN and inf would be written as ±max or 0, so they are refused."""
    fmt = plan.out.format
    return (
        isinstance(fmt, dtypes.FloatFormat)
        and fmt.finite
        and not fmt.nan
        and not fmt.saturate
        and plan.out.scaling is None
    )
