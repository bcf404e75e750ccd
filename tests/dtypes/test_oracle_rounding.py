"""Every float format, every rounding mode, against the exact rational oracle.

The expected values come from `oracle.py` (fractions, from the IEEE-754
definitions; no code shared with `dtypes` or with `reference.py`). The inputs
are drawn by hypothesis from float32 at large and, mostly, from the places
where rounding is hard, computed from the oracle's own description of each
layout: exact ties and their float32 neighbours, the overflow threshold, ±max
and just beyond, the subnormal boundary, the smallest subnormal and half of
it, ±0, ±inf and NaN.

Stochastic rounding is checked for membership: the result is the oracle's
value toward zero or the one away from it, never anything else (its
statistics are tested in `test_stochastic_statistics.py`).

The formats are the registry's float layouts (and custom ones), and its OCP MX
encodings: a block's element is the exact quotient of a value by the block's
power-of-two scale, which the oracle rounds like any other number.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from checks import CUSTOM_FLOATS, assert_covers, examples, fid, registry
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import (
    NAN,
    Spec,
    largest,
    round_exact,
    same,
    smallest_subnormal,
    stochastic_choices,
)
from reference import Layout
from reference import round_float as reference_round

import dtypes
from dtypes import FloatFormat

F32_MAX = Fraction(float(np.finfo(np.float32).max))
MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down")
N = 48
# Each example checks N values in six modes against Fractions: a quarter of the
# profile's examples (dev 10, ci 25, hunt 250; for a named encoding a fifth of that, at
# least 10: `checks.examples`) keeps the file near a minute in CI.
EXAMPLES = settings(max_examples=max(10, settings.default.max_examples // 4))


def exact_layout(f) -> bool:
    """An unscaled float layout whose values are float64 values (e <= 8, float32 included):
    the oracle reads results as float64. float64's own grid is not; a scaled encoding
    takes `mx_scaled` below."""
    return f.kind == "float" and f.scaling is None and f.exponent_bits <= 8


def mx_scaled(f) -> bool:
    """A float element grid under power-of-two block scales (OCP MX): each element is the
    exact quotient of a value by its block's scale. NVFP4's scales are float32 products
    (a recipe test_mx_nvfp4.py follows), which no exact quotient describes."""
    if f.kind != "float":
        return False
    return isinstance(f.scaling, dtypes.PerBlock) and f.scaling.power_of_two


# every exact float layout of the registry, the custom ones of checks.py, and saturating
# IEEE layouts (saturation of ±inf on float32's own grid was once skipped)
LAYOUTS = registry(exact_layout)
FORMATS = [
    *LAYOUTS,
    *[
        f
        for f in [
            *CUSTOM_FLOATS,
            FloatFormat(8, 23, saturate=True),
            FloatFormat(8, 7, saturate=True),
            FloatFormat(5, 10, saturate=True),
            FloatFormat(2, 3, finite=True, nan=True),
            FloatFormat(4, 3, finite=True, nan=False),
            FloatFormat(2, 1, finite=True, saturate=True),
        ]
        if f not in LAYOUTS
    ],
]
MX = registry(mx_scaled)


def spec_of(fmt) -> Spec:
    return Spec(fmt.exponent_bits, fmt.mantissa_bits, fmt.finite, bool(fmt.nan), fmt.saturate)


def _f32_near(v: Fraction) -> list[float]:
    """float32 values at and around the real `v` (both float32 neighbours)."""
    with np.errstate(over="ignore"):
        f = np.float32(float(v))
    out = {f, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))}
    return [float(a) for a in out if np.isfinite(a)]


@functools.cache
def hard_cases(spec: Spec) -> tuple[float, ...]:
    """The inputs where rounding onto `spec` decides something, as float32 values."""
    top = largest(spec)
    tiny = smallest_subnormal(spec)
    q_top = Fraction(2) ** (_exp(top) - spec.m)
    min_normal = Fraction(2) ** spec.emin
    points = [
        top,
        top + q_top / 2,  # the overflow threshold of the nearest modes
        top + q_top,
        2 * top,
        tiny,
        tiny / 2,  # the underflow tie
        tiny * 3 / 2,
        tiny / 4,
        min_normal,
        min_normal - tiny / 2,
        Fraction(1),
        1 + Fraction(2) ** -spec.m / 2,  # a tie at 1
        1 + 3 * Fraction(2) ** -spec.m / 2,
    ]
    out = set()
    for p in points:
        if p < F32_MAX:
            out.update(_f32_near(p))
    out.update([0.0, float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)])
    return tuple(sorted(out))


def _exp(v: Fraction) -> int:
    k = v.numerator.bit_length() - v.denominator.bit_length()
    return k - 1 if v < Fraction(2) ** k else k


def _grid_point(spec: Spec):
    """A random grid value (or tie) of `spec`, nudged by a random number of float32 ulps."""

    @st.composite
    def draw(draw_):
        e = draw_(st.integers(spec.emin - 1, spec.bias + 1))
        mant = draw_(st.integers(0, 2 ** (spec.m + 1) - 1))  # one extra bit: ties too
        v = Fraction(2 ** (spec.m + 1) + mant, 2 ** (spec.m + 1)) * Fraction(2) ** e
        if e < spec.emin:  # the subnormal range
            v = Fraction(mant, 2 ** (spec.m + 1)) * Fraction(2) ** spec.emin
        f = np.float32(float(v)) if v < F32_MAX else np.float32(1)
        nudge = draw_(st.sampled_from([0, 0, 0, 1, -1, 2, -3]))
        for _ in range(abs(nudge)):
            f = np.nextafter(f, np.float32(np.inf if nudge > 0 else -np.inf))
        return float(f)

    return draw()


def values(fmt):
    spec = spec_of(fmt)
    element = st.one_of(
        st.sampled_from(hard_cases(spec)),
        _grid_point(spec),
        st.floats(width=32, allow_nan=False, allow_infinity=False),
        st.sampled_from([math.inf, math.nan, -0.0]),
    )
    signed = st.tuples(element, st.booleans()).map(lambda t: -t[0] if t[1] else t[0])
    return st.lists(signed, min_size=N, max_size=N).map(lambda v: np.array(v, np.float32))


@functools.cache
def rounder(fmt):
    def f(x, key):
        out = {m: fmt.round(x, rounding=m) for m in MODES}
        out["stochastic"] = fmt.round(x, rounding="stochastic", key=key)
        out["e:nearest_even"] = fmt.encode(x).decode()
        return out

    return jax.jit(f)


def _check(fmt, x, got: np.ndarray, mode: str):
    spec = spec_of(fmt)
    for v, a in zip(x.tolist(), got.tolist(), strict=True):
        want = round_exact(v, spec, mode)
        assert same(a, want), f"{fmt.name} {mode}({v!r}) = {a!r}, the oracle says {want}"


@pytest.mark.parametrize("fmt", FORMATS, ids=fid)
def test_every_mode_matches_the_exact_oracle(fmt):
    examples(fmt, share=4)(given(data=st.data())(_every_mode_matches_the_exact_oracle))(fmt)


def _every_mode_matches_the_exact_oracle(fmt, data):
    x = data.draw(values(fmt))
    seed = data.draw(st.integers(0, 2**32 - 1))
    out = {k: np.asarray(v, np.float32) for k, v in rounder(fmt)(x, jax.random.key(seed)).items()}
    for mode in MODES:
        _check(fmt, x, out[mode], mode)
    if fmt.nan:  # (a format without NaN cannot store one: its codes hold 0 there)
        _check(fmt, x, out["e:nearest_even"], "nearest_even")
    spec = spec_of(fmt)
    for v, a in zip(x.tolist(), out["stochastic"].tolist(), strict=True):
        low, high, p = stochastic_choices(v, spec)
        allowed = [low] if p == 0 else [low, high]
        assert any(same(a, w) for w in allowed), f"{fmt.name} stochastic({v!r}) = {a!r}"


@pytest.mark.parametrize("fmt", [dtypes.bfloat16, dtypes.float8_e4m3fn, FloatFormat(3, 2)], ids=fid)
@EXAMPLES
@given(data=st.data())
def test_eager_calls_match_the_exact_oracle(fmt, data):
    x = data.draw(values(fmt))
    for mode in MODES:
        _check(fmt, x, np.asarray(fmt.round(x, rounding=mode), np.float32), mode)


# -- OCP MX blocks: the oracle rounds each element's exact quotient by the block scale ----

F32_TINY = 2.0**-126  # float32's smallest normal


def mx_exact(block: list[float], fmt, mode: str) -> list:
    """The oracle's values of one block of a power-of-two block-scaled format, in `mode`
    (for "stochastic": each element's list of allowed values).

    docs/formats.md ("Scaling", "Scale formats", "Overflow and saturation"): float32
    subnormal inputs read as zero; a block holding NaN or inf gets a NaN scale (under
    jit); the scale is `X = 2**(floor(log2(amax)) - emax)` with `emax` the exponent of the
    element's largest value, an all-zero block's scale is 1, and no scale is below 2**-126;
    each element is `x / X` rounded onto the element grid, saturating at ±max; its value
    is that times X.
    """
    if any(math.isnan(v) or math.isinf(v) for v in block):
        return [[NAN] if mode == "stochastic" else NAN] * len(block)
    block = [math.copysign(0.0, v) if abs(v) < F32_TINY else v for v in block]
    spec = spec_of(fmt)._replace(saturate=True)  # scaled float encodings always saturate
    amax = max(Fraction(abs(v)) for v in block)
    k = 0 if amax == 0 else max(_exp(amax) - _exp(largest(spec)), -126)
    scale = Fraction(2) ** k

    def times_scale(r):
        return r if r == NAN or isinstance(r, tuple) else r * scale  # signed zeros stay

    out = []
    for v in block:
        q = v / 2.0**k  # exact: a power of two, far from float64's limits
        if mode == "stochastic":
            low, high, p = stochastic_choices(q, spec)
            out.append([times_scale(low)] if p == 0 else [times_scale(low), times_scale(high)])
        else:
            out.append(times_scale(round_exact(q, spec, mode)))
    return out


def mx_values(fmt):
    """Blocks of values near the element grid times a random power of two.

    The first element of a block lies in the element's top binade (so the block's scale is
    that power of two, where the grid's hard cases stay hard), the others are grid points,
    ties, the overflow threshold and beyond (which raise the scale), random floats and
    zeros; now and then a block holds NaN or inf.
    """
    spec = spec_of(fmt)
    size = fmt.scaling.size
    top = largest(spec)
    anchors = [float(top), float(Fraction(2) ** _exp(top)), float(top * 3 / 4)]
    element = st.one_of(
        st.sampled_from([v for v in hard_cases(spec) if v <= 2.0**20]),  # (not float32's max)
        _grid_point(spec),
        st.floats(-(2.0**20), 2.0**20, width=32),
        st.sampled_from([-0.0, 0.0]),
    )

    @st.composite
    def block(draw):
        k = draw(st.integers(-90, 90))
        rest = draw(st.lists(element, min_size=size - 1, max_size=size - 1))
        vals = [draw(st.sampled_from(anchors)), *rest]
        signs = draw(st.lists(st.booleans(), min_size=size, max_size=size))
        return [(-v if s else v) * 2.0**k for v, s in zip(vals, signs, strict=True)]

    @st.composite
    def blocks(draw):
        out = draw(st.lists(block(), min_size=2, max_size=2))
        if draw(st.integers(0, 9)) == 0:  # a non-finite value poisons its block only
            out[1][draw(st.integers(0, size - 1))] = draw(st.sampled_from([math.nan, math.inf]))
        return np.array([v for b in out for v in b], np.float32)

    return blocks()


@pytest.mark.parametrize("fmt", MX, ids=fid)
def test_mx_blocks_match_the_exact_oracle(fmt):
    examples(fmt, share=4)(given(data=st.data())(_mx_blocks_match_the_exact_oracle))(fmt)


def _mx_blocks_match_the_exact_oracle(fmt, data):
    x = data.draw(mx_values(fmt))
    seed = data.draw(st.integers(0, 2**32 - 1))
    out = {k: np.asarray(v, np.float32) for k, v in rounder(fmt)(x, jax.random.key(seed)).items()}
    size = fmt.scaling.size
    blocks = [x[i : i + size].tolist() for i in range(0, x.size, size)]
    for mode in (*MODES, "e:nearest_even", "stochastic"):
        want = [w for b in blocks for w in mx_exact(b, fmt, mode.removeprefix("e:"))]
        for v, a, w in zip(x.tolist(), out[mode].tolist(), want, strict=True):
            ok = any(same(a, c) for c in w) if mode == "stochastic" else same(a, w)
            assert ok, f"{fmt.name} {mode}({v!r}) = {a!r}, the oracle says {w} (block of {x})"


def test_the_per_format_tests_run_over_every_registry_entry_their_rule_admits():
    assert_covers(test_every_mode_matches_the_exact_oracle, exact_layout)
    assert_covers(test_mx_blocks_match_the_exact_oracle, mx_scaled)


# -- narrow input dtypes: no second rounding into the input's own type ------------

NARROW = [
    (np.dtype(ml_dtypes.bfloat16), dtypes.float16),
    (np.dtype(np.float16), dtypes.bfloat16),
    (np.dtype(ml_dtypes.bfloat16), FloatFormat(5, 7)),
    (np.dtype(np.float16), dtypes.float8_e4m3fn),
]


@pytest.mark.parametrize(("dtype", "fmt"), NARROW, ids=lambda v: getattr(v, "name", str(v)))
def test_narrow_input_every_value_every_mode(dtype, fmt):
    # all 65536 bit patterns of the input type: each result is the exact rounding
    # of the input's value, in a dtype that holds it (the input's own where it can)
    x = np.arange(2**16, dtype=np.uint16).view(dtype)
    wide = x.astype(np.float32)
    if not fmt.nan:
        x, wide = x[~np.isnan(wide)], wide[~np.isnan(wide)]
    layout = Layout(fmt.exponent_bits, fmt.mantissa_bits, fmt.finite, bool(fmt.nan), fmt.saturate)
    kernel = jax.jit(lambda v: {m: fmt.round(v, rounding=m) for m in MODES})
    out = kernel(jnp.asarray(x))
    for mode in MODES:
        got = out[mode]
        assert got.dtype == fmt.result_dtype(dtype)
        got = np.asarray(got, np.float32)
        want = reference_round(wide, layout, mode).astype(np.float32)
        bad = ~((got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want)))
        assert not bad.any(), (
            f"{fmt.name} {mode} of {dtype}: {int(bad.sum())} wrong, e.g. {wide[bad][:4]} -> "
            f"{got[bad][:4]}, expected {want[bad][:4]}"
        )


def test_narrow_input_examples_from_the_audit():
    x = jnp.array([65536.0], ml_dtypes.bfloat16)
    r = dtypes.float16.round(x, rounding="toward_zero")
    assert r.dtype == np.float32
    assert r.tolist() == [65504.0]
    r = dtypes.bfloat16.round(jnp.array([65504.0], np.float16))
    assert r.dtype == np.float32
    assert r.tolist() == [65536.0]  # not float16's inf
    # where the input type holds every result, it is kept
    assert dtypes.float8_e4m3fn.round(x).dtype == ml_dtypes.bfloat16
    assert dtypes.int8.round(jnp.ones(3, np.float16)).dtype == np.float32
    # the gradient keeps the input's dtype
    g = jax.grad(lambda v: dtypes.float16.round(v).sum())(jnp.ones(3, ml_dtypes.bfloat16))
    assert g.dtype == ml_dtypes.bfloat16
    assert g.tolist() == [1, 1, 1]


def test_saturating_float32_clamps_infinities():
    sat = FloatFormat(8, 23, saturate=True)
    top = float(np.finfo(np.float32).max)
    x = np.array([np.inf, -np.inf, 3.0, np.nan], np.float32)
    for mode in MODES:
        r = np.asarray(sat.round(x, rounding=mode))
        assert r[:3].tolist() == [top, -top, 3.0], mode
        assert np.isnan(r[3]), mode
        np.testing.assert_array_equal(np.asarray(jax.jit(sat.round)(x)), sat.round(x))


def test_saturating_float64_clamps_infinities_of_float64_input():
    # float64 needs 64-bit JAX, a process-wide switch: run in a child process
    import subprocess
    import sys

    code = (
        "import jax; jax.config.update('jax_enable_x64', True)\n"
        "import numpy as np, dtypes\n"
        "sat = dtypes.FloatFormat(11, 52, saturate=True)\n"
        "top = float(np.finfo(np.float64).max)\n"
        "for dt in (np.float64, np.float32):\n"
        "    r = sat.round(np.array([np.inf, -np.inf, 1.5], dt))\n"
        "    assert r.dtype == np.float64, r.dtype\n"
        "    assert r.tolist() == [top, -top, 1.5], r\n"
        "r = dtypes.float64.round(np.array([np.inf, 1.5], np.float32))\n"
        "assert r.dtype == np.float32 and r.tolist() == [np.inf, 1.5]\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
