"""Independent numpy references for the storage formats, written from docs/design.md §2.

Nothing here imports `dtypes`: a format is described by plain numbers
(`Layout`), its grid is enumerated from the bit-field definition, rounding is
a neighbour search on that grid, and integer quantization and packing are
spelled out in numpy and pure Python. Tests compare `dtypes` against these.

All grid arithmetic is exact: every value of a layout with e <= 8, m <= 23 is
a float64, and so is the midpoint of two neighbours.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

__all__ = [
    "MODES",
    "Layout",
    "code_values",
    "float_scaled",
    "grid",
    "input_set",
    "int_quantize",
    "layout_of",
    "max_value",
    "neighbours",
    "pack",
    "round_float",
    "unpack",
]


class Layout(NamedTuple):
    """A float layout as the spec defines it (no code from `dtypes`).

    `finite`: no infinities, the top exponent holds numbers. `nan`: a finite
    layout keeps one NaN code (all ones). `saturate`: overflow clamps to ±max.
    """

    e: int
    m: int
    finite: bool = False
    nan: bool = True
    saturate: bool = False

    @property
    def bias(self) -> int:
        return 2 ** (self.e - 1) - 1

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def has_inf(self) -> bool:
        return not self.finite


def layout_of(fmt) -> Layout:
    """The `Layout` of a `dtypes.FloatFormat`, read from its public fields only."""
    return Layout(fmt.exponent_bits, fmt.mantissa_bits, fmt.finite, bool(fmt.nan), fmt.saturate)


@functools.cache
def _positive_grid(layout: Layout) -> np.ndarray:
    e, m = layout.e, layout.m
    exps = np.arange(2**e, dtype=np.int64)
    mants = np.arange(2**m, dtype=np.int64)
    E, M = np.meshgrid(exps, mants, indexing="ij")  # code = E * 2**m + M, row-major
    E, M = E.ravel(), M.ravel()
    sig = np.where(E == 0, M, M + 2**m).astype(np.float64)
    scale_exp = np.where(E == 0, layout.emin, E - layout.bias) - m
    values = np.ldexp(sig, scale_exp)
    keep = np.ones(values.shape, bool)
    top = E == 2**e - 1
    if not layout.finite:
        keep &= ~top  # inf and NaN codes
    elif layout.nan:
        keep &= ~(top & (M == 2**m - 1))  # the single all-ones NaN code
    out = values[keep]
    assert np.all(np.diff(out) > 0), "codes are monotone in value"
    out.setflags(write=False)
    return out


def grid(layout: Layout, *, signed: bool = False) -> np.ndarray:
    """Sorted finite values of `layout` as exact float64 (non-negative unless `signed`).

    Signed grids hold one zero (+0); test signed zeros separately.

    Examples:
        >>> grid(Layout(2, 1, finite=True, nan=False)).tolist()
        [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    """
    pos = _positive_grid(layout)
    if not signed:
        return pos
    return np.concatenate([-pos[:0:-1], pos])


def code_values(layout: Layout) -> np.ndarray:
    """Value of every bit code `0 .. 2**(1+e+m) - 1` of `layout`, as float64.

    Sign bit on top, then the exponent field, then the mantissa field; the
    all-ones exponent holds ±inf/NaN (IEEE layouts) or numbers, with the
    all-ones code NaN (finite layouts with a NaN).
    """
    e, m = layout.e, layout.m
    codes = np.arange(2 ** (1 + e + m), dtype=np.int64)
    sign = codes >> (e + m)
    E = (codes >> m) & (2**e - 1)
    M = codes & (2**m - 1)
    mag = np.ldexp(
        np.where(E == 0, M, M + 2**m).astype(np.float64),
        np.where(E == 0, layout.emin, E - layout.bias) - m,
    )
    top = E == 2**e - 1
    if not layout.finite:
        mag = np.where(top, np.where(M == 0, np.inf, np.nan), mag)
    elif layout.nan:
        mag = np.where(top & (M == 2**m - 1), np.nan, mag)
    return np.where(sign == 1, -mag, mag)


def max_value(layout: Layout) -> float:
    return float(_positive_grid(layout)[-1])


def _quantum(layout: Layout, v: np.ndarray) -> np.ndarray:
    """Spacing of the grid just above the non-negative grid value `v`."""
    with np.errstate(divide="ignore"):
        _, ex = np.frexp(v)  # v = f * 2**ex with f in [0.5, 1)
    binade = np.where(v > 0, ex - 1, layout.emin)
    return np.ldexp(1.0, np.maximum(binade, layout.emin) - layout.m)


MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down")


def round_float(x: np.ndarray, layout: Layout, mode: str) -> np.ndarray:
    """Round float32 `x` onto `layout`'s grid under `mode`; returns float64.

    Neighbours come from a search on the enumerated grid, extended above max
    by one virtual point `max + quantum(max)` (the next value with an
    unbounded exponent), so overflow is decided as IEEE-754 decides it:
    a result beyond max is ±inf for layouts with inf, NaN for finite layouts
    with a NaN code, ±max for saturating layouts and those with neither;
    `toward_zero` and the directed mode pointing toward zero give ±max.
    Ties to even: the neighbour whose significand, in units of the lower
    neighbour's quantum, is even. ±0 keep the sign of `x`; NaN stays NaN.
    """
    with np.errstate(invalid="ignore"):  # signaling NaN bit patterns among the inputs
        x = np.asarray(x, np.float32).astype(np.float64)
    pos = _positive_grid(layout)
    top = pos[-1]
    virtual = top + float(_quantum(layout, np.array(top)))
    ext = np.append(pos, virtual)
    neg = np.signbit(x)
    a = np.abs(x)
    finite = np.isfinite(a)
    a_f = np.where(finite, a, 0.0)
    idx = np.clip(np.searchsorted(ext, a_f, side="right") - 1, 0, len(ext) - 1)
    beyond = idx == len(ext) - 1  # at or past the virtual point: overflow in every mode
    idx = np.minimum(idx, len(ext) - 2)
    lo, hi = ext[idx], ext[idx + 1]
    exact = a_f == lo
    mid = (lo + hi) / 2
    lo_even = (lo / _quantum(layout, lo)) % 2 == 0
    if mode == "nearest_even":
        take_hi = (a_f > mid) | ((a_f == mid) & ~lo_even)
    elif mode == "nearest_away":
        take_hi = a_f >= mid
    elif mode == "toward_zero":
        take_hi = np.zeros_like(exact)
    elif mode == "up":
        take_hi = ~neg
    elif mode == "down":
        take_hi = neg
    else:
        raise ValueError(mode)
    mag = np.where(exact, lo, np.where(take_hi, hi, lo))
    overflow = (mag > top) | beyond
    # where the magnitude is rounded toward zero, overflow stops at max
    truncating = {"toward_zero": np.ones_like(neg), "up": neg, "down": ~neg}.get(
        mode, np.zeros_like(neg)
    )
    if layout.saturate or (layout.finite and not layout.nan):
        over = np.full(a.shape, top)
        inf_in = top
    elif layout.has_inf:
        over = np.where(truncating, top, np.inf)
        inf_in = np.inf
    else:
        over = np.where(truncating, top, np.nan)
        inf_in = np.nan
    mag = np.where(overflow, over, mag)
    mag = np.where(np.isinf(a), inf_in, mag)
    mag = np.where(np.isnan(a), np.nan, mag)
    return np.where(neg, -mag, mag)


def neighbours(x: np.ndarray, layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """(down, up) grid neighbours of finite in-range float32 `x` (equal when exact)."""
    return round_float(x, layout, "down"), round_float(x, layout, "up")


# -- input sets -----------------------------------------------------------


def _f32_exact(v: np.ndarray) -> np.ndarray:
    """The float32 values among float64 `v` that float32 holds exactly."""
    with np.errstate(over="ignore"):
        f = v.astype(np.float32)
    return f[f.astype(np.float64) == v]


def _both_sides(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float32)
    with np.errstate(over="ignore"):  # nextafter(float32 max, inf) is inf, which we want
        return np.concatenate(
            [v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(-np.inf))]
        )


def input_set(layout: Layout, *, n_random: int = 100_000, seed: int = 0) -> np.ndarray:
    """The float32 test inputs of a layout: every value, midpoint and their neighbours.

    Every representable value (both signs), every exact midpoint between
    neighbours, the float32 values just either side of each, the overflow
    and underflow edges, ±0, ±inf, NaN and `n_random` random bit patterns.
    """
    pos = _positive_grid(layout)
    top = pos[-1]
    q_top = float(_quantum(layout, np.array(top)))
    mids = (pos[:-1] + pos[1:]) / 2
    edges = np.array(
        [
            top,
            top + q_top / 2,  # the overflow threshold of nearest modes
            top + q_top,
            2 * top,
            float(np.finfo(np.float32).max),
            pos[1] / 2,  # underflow tie
            pos[1] / 4,
            pos[1],
            float(np.finfo(np.float32).smallest_subnormal),
            float(np.finfo(np.float32).tiny),
        ]
    )
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], np.float32)
    core = np.concatenate([_f32_exact(pos), _f32_exact(mids), _f32_exact(edges)])
    core = _both_sides(core)
    core = np.concatenate([core, -core])
    rng = np.random.default_rng(seed)
    rand = rng.integers(0, 2**32, n_random, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([special, core, rand])


# -- integer quantization ------------------------------------------------


def _groups(x: np.ndarray, kind: str, axis: int, size: int):
    """Yield index tuples of every scaling group of `x`."""
    if kind == "tensor":
        yield (slice(None),) * x.ndim
        return
    if kind == "axis":  # one group per index of `axis`, or of each axis of a tuple
        kept = sorted({a % x.ndim for a in (axis if isinstance(axis, tuple) else (axis,))})
        for index in np.ndindex(*[x.shape[a] for a in kept]):
            at = dict(zip(kept, index, strict=True))
            yield tuple(at.get(d, slice(None)) for d in range(x.ndim))
        return
    axis %= x.ndim
    other = [range(n) for d, n in enumerate(x.shape) if d != axis]
    for rest in np.ndindex(*[len(r) for r in other]):
        for start in range(0, x.shape[axis], size):
            it = iter(rest)
            yield tuple(
                slice(start, start + size) if d == axis else next(it) for d in range(x.ndim)
            )


def _floor_log2(a: float) -> int:
    return math.frexp(a)[1] - 1


TINY = np.float32(2.0**-126)  # float32's smallest normal


def flush(x: np.ndarray) -> np.ndarray:
    """Subnormal float32 values replaced by signed zero."""
    return np.where(np.abs(x) < TINY, x * np.float32(0), x)


def _scale_and_reciprocal(absmax: np.float32, top: np.float32, power_of_two: bool):
    """A group's (scale, reciprocal) in float32, computed in float64 where that is
    exact, with the scale kept at or above the smallest normal."""
    if power_of_two:
        k = max(_floor_log2(float(absmax)) - _floor_log2(float(top)), -126)
        return np.float32(2.0**k), np.float32(2.0**-k)  # 2**-127 exact in float32
    if np.float64(absmax) < np.float64(top) * np.float64(TINY):  # the quotient is subnormal
        return TINY, np.float32(2.0**126)
    # float64 quotients of float32 values, rounded once to float32: correctly rounded
    return (
        np.float32(np.float64(absmax) / np.float64(top)),
        np.float32(np.float64(top) / np.float64(absmax)),
    )


def int_quantize(
    x: np.ndarray,
    qmax: int,
    *,
    kind: str = "tensor",
    axis: int | tuple[int, ...] = 0,
    size: int = 32,
    power_of_two: bool = False,
    binary: bool = False,
    mode: str = "nearest_even",
) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scale-per-element) of the docs/design.md §2 integer formula, in numpy float32.

    Absmax: `scale = absmax / qmax` and `codes = clip(round(x * (qmax / absmax)),
    -qmax, qmax)`, the reciprocal computed once per group in float32; an
    all-zero group gets scale 1 and codes 0. Power of two (OCP MX):
    `scale = 2**(floor(log2 absmax) - floor(log2 qmax))`. Binary (int1):
    `scale = mean|x|`, codes `sign(x)` with 0 -> +1.
    `kind` is "tensor", "axis" (one group per index of `axis`, or per index
    combination of a tuple of axes) or "block"
    (`size` consecutive elements along `axis`, the last block may be partial).
    Subnormal inputs count as zero, and a scale below float32's smallest normal
    is raised to it (`smallest_normal_scale`).
    """
    x = flush(np.asarray(x, np.float32))
    codes = np.zeros(x.shape, np.float32)
    scale = np.zeros(x.shape, np.float32)
    rnd = {
        "nearest_even": np.rint,
        "toward_zero": np.trunc,
        "up": np.ceil,
        "down": np.floor,
        # |y| + 0.5 is exact in float64 (y is a float32)
        "nearest_away": lambda y: np.sign(y) * np.floor(np.abs(y.astype(np.float64)) + 0.5),
    }[mode]
    for g in _groups(x, kind, axis, size):
        xg = x[g]
        if binary:
            mean = np.float32(np.mean(np.abs(xg), dtype=np.float64))
            scale[g] = TINY if 0 < mean < TINY else mean
            codes[g] = np.where(xg >= 0, 1, -1)
            continue
        absmax = np.float32(np.max(np.abs(xg)))
        if absmax == 0:
            scale[g], codes[g] = 1, 0
            continue
        s, inv = _scale_and_reciprocal(absmax, np.float32(qmax), power_of_two)
        scale[g] = s
        codes[g] = np.clip(rnd(xg * inv), -qmax, qmax)
    return codes, scale


def float_scaled(
    x: np.ndarray,
    layout: Layout,
    *,
    kind: str = "tensor",
    axis: int | tuple[int, ...] = 0,
    size: int = 32,
    power_of_two: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(element values on the grid, scale-per-element) of a scaled float encoding.

    Absmax: `scale = absmax / max`, elements `x * (max / absmax)` rounded
    nearest-even with saturation. Power of two (OCP MX):
    `scale = 2**(floor(log2 absmax) - emax)`, elements `x / scale` rounded with
    saturation to ±max.
    """
    x = flush(np.asarray(x, np.float32))
    sat = layout._replace(saturate=True)
    top = np.float32(max_value(layout))
    elems = np.zeros(x.shape, np.float32)
    scale = np.zeros(x.shape, np.float32)
    for g in _groups(x, kind, axis, size):
        xg = x[g]
        absmax = np.float32(np.max(np.abs(xg)))
        if absmax == 0:
            scale[g], elems[g] = 1, 0
            continue
        s, inv = _scale_and_reciprocal(absmax, top, power_of_two)
        scale[g] = s
        elems[g] = round_float(xg * inv, sat, "nearest_even")
    return elems, scale


# -- packing ---------------------------------------------------------------


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack integer codes along the last axis, little end first, in pure Python.

    Any width: code i fills bits i*bits onward of one little-endian bit stream
    (bit k of the stream is bit k % 8 of byte k // 8). int4/int2 fields hold
    two's complement codes; int1 holds 1 for +1, 0 for -1.
    The last axis is padded with zero fields to whole bytes.

    Examples:
        >>> pack(np.array([1, -1, 7]), 4).tolist()
        [241, 7]
    """
    codes = np.asarray(codes)
    n = codes.shape[-1]
    nbytes = -(-n * bits // 8)
    flat = codes.reshape(-1, n)
    out = np.zeros((flat.shape[0], nbytes), np.uint8)
    for r in range(flat.shape[0]):
        for i in range(n):
            c = int(flat[r, i])
            field = (1 if c > 0 else 0) if bits == 1 else c & ((1 << bits) - 1)
            for k in range(bits):  # code i fills stream bits i*bits .. i*bits + bits - 1
                pos = i * bits + k
                out[r, pos // 8] |= ((field >> k) & 1) << (pos % 8)
    return out.reshape((*codes.shape[:-1], nbytes))


def unpack(data: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Inverse of `pack`: `n` codes per row, sign-extended (int1: ±1)."""
    data = np.asarray(data, np.uint8)
    flat = data.reshape(-1, data.shape[-1])
    out = np.zeros((flat.shape[0], n), np.int64)
    for r in range(flat.shape[0]):
        for i in range(n):
            field = 0
            for k in range(bits):
                pos = i * bits + k
                field |= ((int(flat[r, pos // 8]) >> (pos % 8)) & 1) << k
            if bits == 1:
                out[r, i] = 1 if field else -1
            else:
                out[r, i] = field - (1 << bits) if field >= 1 << (bits - 1) else field
    return out.reshape((*data.shape[:-1], n))
