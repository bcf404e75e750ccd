"""The statistics of `precision convert`: SQNR per tensor, and numpy blocks in parts.

The compiled encodes compute their energies in the same program
(`_convert_engine`); the numpy paths (casts, int8 per tensor or per row) compute them
here, as float32 dot products per part of a block on worker threads,
summed again in float64 where float32 would underflow or overflow.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import ml_dtypes
import numpy as np

import dtypes

from ._interrupts import deferring

if TYPE_CHECKING:
    import jax


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    if signal == 0 or math.isinf(noise):
        return -math.inf
    return 10 * math.log10(signal / noise)


class _SignalNoise:
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
    """(m, Σ(x/m)², Σ((x-y)/m)²) over the finite values of x (traced), m their max |x|
    but at most 2**126: 1/m stays normal (a subnormal one, flushed to 0 on XLA:CPU,
    dropped a block whose absmax is above 2**126 from the statistics)."""
    import jax.numpy as jnp

    finite = jnp.isfinite(x)
    ax = jnp.where(finite, jnp.abs(x), jnp.float32(0))
    m = jnp.minimum(jnp.max(ax, initial=0.0), jnp.float32(2.0**126))
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


def _float32_energy_trusted(energy: float, v: np.ndarray) -> bool:
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
        if _float32_energy_trusted(sig, x) and _float32_energy_trusted(noi, d):
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


def _in_parts(fn: Callable[[slice], _T], n: int, unit: int = 1) -> list[_T]:
    """`fn` over the `n` values of a block in up to `_WORKERS` parts, on worker threads,
    each part a multiple of `unit` values (whole rows).

    numpy releases the GIL in its casts, ufuncs and dot products, so the parts
    run at once, on as many cores as there are workers. Each part sets its own floating-point error
    state (numpy's is per thread). A SIGINT waits until every part is done
    (`deferring`): no worker is left writing into the block's buffers, or
    half started.
    """
    parts = min(_WORKERS, max(1, n // _PART))
    if parts == 1:
        return [fn(slice(0, n))]
    step = -(-n // parts // unit) * unit
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
    top: tuple[dtypes.IntFormat, np.ndarray, int],
    x: np.ndarray,
    codes: np.ndarray,
    scratch: tuple[np.ndarray, ...],
    stats: bool,
    p: slice,
) -> tuple[float, float] | None:
    """Part `p` (whole rows) of a block's integer codes into `codes` (`top`: the format,
    the absmax of the tensor or a row of each column's, values per row), and its
    energies against the decoded codes if `stats`."""
    (fmt, absmax, row), (d, y) = top, scratch
    xr, yr, cr = x[p].reshape(-1, row), y[p].reshape(-1, row), codes[p].reshape(-1, row)
    np.copyto(cr, fmt.host_codes(xr, absmax, yr), casting="unsafe")  # exact
    if not stats:
        return None
    decoded = np.multiply(cr, fmt.host_scales(absmax), out=yr, dtype=np.float32)
    return _numpy_energy(x[p], decoded.reshape(-1), d[p])


def _int_rows_part(
    top: tuple[dtypes.IntFormat, np.ndarray, int],
    x: np.ndarray,
    codes: np.ndarray,
    scratch: tuple[np.ndarray, ...],
    stats: bool,
    p: slice,
) -> tuple[float, float] | None:
    """Part `p` (whole rows) of a block's integer codes into `codes`, one scale per row
    (`top`: the format, each row's absmax, written here for the block's rows, values
    per row), and its energies against the decoded codes if `stats`.

    A part holding a row whose absmax the host rule does not take
    (`IntFormat.host_absmax`: NaN and inf included) writes only the absmaxes: the
    caller refuses the block or encodes it compiled.
    """
    (fmt, absmax, row), (d, y) = top, scratch
    xr = x[p].reshape(-1, row)
    m = absmax[p.start // row : p.stop // row]
    np.maximum(np.max(xr, axis=1), -np.min(xr, axis=1), out=m)  # two reductions, NaN kept
    if not fmt.host_absmax(m):
        return None
    m = m.reshape(-1, 1)
    yr = y[p].reshape(-1, row)
    np.copyto(codes[p].reshape(-1, row), fmt.host_codes(xr, m, yr), casting="unsafe")  # exact
    if not stats:
        return None
    np.multiply(codes[p].reshape(-1, row), fmt.host_scales(m), out=yr, dtype=np.float32)
    return _numpy_energy(x[p], y[p], d[p])
