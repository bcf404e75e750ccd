"""Nothing observable depends on an array's size: NaN and inf at every size and position.

XLA:CPU vectorises reductions from a few thousand elements on, and its
vectorised max drops NaN under `jit`: a scale computed with it turned a
4096-vector holding one NaN into finite codes. Every encode/decode/round path
is run here on sizes that straddle the vectorisation and tiling widths (1, 7,
4095, 4096, 4097, 65537 and a 2-D shape with an odd last axis), with NaN, +inf
or -inf at the first, middle and last position, eagerly and under `jit` (and,
at the sizes that straddle the vectorisation width, under `jit` of `vmap` over a
batch of such arrays: a batched reduction is vectorised its own way).

Expected values do not come from `dtypes`: a scaled group holding NaN/inf must
get a NaN scale under tracing and be refused eagerly (docs/design.md §2); the other
groups and the other elements must be exactly what the same call gives for the
clean array; and an unscaled element is what the exact oracle says for that
special value.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
import pytest
from oracle import Spec, round_exact, to_float

import dtypes
from dtypes import FloatFormat, PerAxis, PerBlock, PerTensor

SHAPES = [(1,), (7,), (4095,), (4096,), (4097,), (65537,), (5, 1031)]
# where a `vmap`-batched call is compared too (one more compile per case and size)
BATCHED = [(4095,), (4096,), (4097,)]
SPECIALS = [np.nan, np.inf, -np.inf]

SCALED = {
    "int8": (dtypes.int8, PerTensor()),
    "int4-axis0": (dtypes.int4, PerAxis(0)),
    "int1": (dtypes.int1, PerTensor()),
    "int1-block64": (dtypes.int1, PerBlock(64)),
    "e4m3fn": (dtypes.float8_e4m3fn, PerTensor()),
    "mxfp4": (FloatFormat(2, 1, finite=True), PerBlock(32, power_of_two=True)),
}

# (each case compiles once per shape: the list is kept to one representative
# of each reduction path and each overflow rule, to keep CI time down)
UNSCALED = {
    "bfloat16": dtypes.bfloat16,
    "e5m2": dtypes.float8_e5m2,
    "e4m3fn": dtypes.float8_e4m3fn,
    "e4m3fn_sat": FloatFormat(4, 3, finite=True, saturate=True),
}


def _positions(shape):
    n = math.prod(shape)
    return sorted({0, n // 2, n - 1})


def _clean(shape):
    rng = np.random.default_rng(sum(shape))
    return rng.standard_normal(shape).astype(np.float32) * 3


def _batch(shape):
    """(clean x, a batch of x with one special value planted, the flat positions, the values)."""
    x = _clean(shape)
    xs, where, what = [], [], []
    for pos in _positions(shape):
        for v in SPECIALS:
            y = x.copy().reshape(-1)
            y[pos] = v
            xs.append(y.reshape(shape))
            where.append(pos)
            what.append(v)
    xs.append(np.full(shape, np.nan, np.float32))  # an all-NaN array
    where.append(None)
    what.append(np.nan)
    return x, np.stack(xs), where, what


def _group_of(scaling, shape, pos):
    """Boolean mask of the elements that share a scaling group with flat index `pos`."""
    idx = np.unravel_index(pos, shape)
    mask = np.zeros(shape, bool)
    if isinstance(scaling, PerTensor):
        mask[...] = True
    elif isinstance(scaling, PerAxis):
        a = scaling.axis % len(shape)
        sl = [slice(None)] * len(shape)
        sl[a] = idx[a]
        mask[tuple(sl)] = True
    else:
        a = scaling.axis % len(shape)
        sl = list(idx)
        start = idx[a] // scaling.size * scaling.size
        sl[a] = slice(start, start + scaling.size)
        mask[tuple(sl)] = True
    return mask


@functools.cache
def _scaled_kernel(fmt, scaling):
    def one(x):
        enc = fmt.encode(x, scaling=scaling)
        return enc.scale, enc.decode(), fmt.round(x, scaling=scaling)

    return jax.jit(jax.vmap(one)), jax.jit(one)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", list(SCALED), ids=str)
def test_scaled_encodings_propagate_nan_at_every_size(case, shape):
    fmt, scaling = SCALED[case]
    batched, single = _scaled_kernel(fmt, scaling)
    x, xs, where, _ = _batch(shape)
    _, clean_dec, clean_round = (np.asarray(a) for a in single(x))
    runs = [[np.stack(a) for a in zip(*(single(y) for y in xs), strict=True)]]  # plain jit
    if shape in BATCHED:
        runs.append([np.asarray(a) for a in batched(xs)])
    for scales, decs, rounds in runs:
        for i, pos in enumerate(where):
            bad = np.ones(shape, bool) if pos is None else _group_of(scaling, shape, pos)
            dec, rnd = decs[i], rounds[i]
            assert np.isnan(dec[bad]).all(), f"{case} {shape}: a finite value in a poisoned group"
            assert np.isnan(rnd[bad]).all(), f"{case} {shape}: round kept a finite value"
            np.testing.assert_array_equal(dec[~bad], clean_dec[~bad])
            np.testing.assert_array_equal(rnd[~bad], clean_round[~bad])
            # every group with a NaN/inf gets a NaN scale, and only those groups
            n_nan_scales = int(np.isnan(scales[i]).sum())
            assert n_nan_scales == (scales[i].size if pos is None else 1)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", ["int8", "int1", "e4m3fn", "int4-axis0"], ids=str)
def test_scaled_encodings_refuse_non_finite_input_eagerly(case, shape):
    fmt, scaling = SCALED[case]
    _, xs, where, what = _batch(shape)
    for x, pos, v in zip(xs, where, what, strict=True):
        first = 0 if pos is None else pos
        index = tuple(int(i) for i in np.unravel_index(first, shape))
        for call in (fmt.encode, fmt.round):
            with pytest.raises(dtypes.NonFiniteError, match=rf"first is {v} at index \({index[0]}"):
                call(x, scaling=scaling)


@functools.cache
def _unscaled_kernel(fmt):
    def one(x):
        return fmt.encode(x).decode(), fmt.round(x)

    return jax.jit(jax.vmap(one)), jax.jit(one)


def _special_expected(fmt, v):
    spec = Spec(fmt.exponent_bits, fmt.mantissa_bits, fmt.finite, bool(fmt.nan), fmt.saturate)
    return to_float(round_exact(float(v), spec, "nearest_even"))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", list(UNSCALED), ids=str)
def test_unscaled_formats_keep_specials_in_their_elements(case, shape):
    fmt = UNSCALED[case]
    batched, single = _unscaled_kernel(fmt)
    x, xs, where, what = _batch(shape)
    clean_dec, clean_round = (np.asarray(a, np.float32) for a in single(x))
    runs = [[np.stack(a).astype(np.float32) for a in zip(*map(single, xs), strict=True)]]
    if shape in BATCHED:
        runs.append([np.asarray(a, np.float32) for a in batched(xs)])
    for decs, rounds in runs:
        for i, (pos, v) in enumerate(zip(where, what, strict=True)):
            special = (
                np.ones(shape, bool) if pos is None else np.arange(x.size).reshape(shape) == pos
            )
            want = _special_expected(fmt, v)
            for got, clean in ((decs[i], clean_dec), (rounds[i], clean_round)):
                if math.isnan(want):
                    assert np.isnan(got[special]).all()
                else:
                    assert (got[special] == want).all(), (v, got[special][:3], want)
                np.testing.assert_array_equal(got[~special], clean[~special])
    # eagerly, outside any jit, the same
    eager = np.asarray(fmt.round(xs[3]), np.float32)
    np.testing.assert_array_equal(eager, runs[0][1][3])
