"""What an accelerator run found that a CPU cannot show by itself, pinned on the CPU.

- `group_absmax` is one integer max over the magnitude bits, reduced in two forms:
  at once (GPUs, TPUs) and in materialized stages (XLA:CPU, which vectorises only
  short integer reductions), chosen by `lax.platform_dependent`. Both must give
  the same bits, or the backends would disagree: both are forced here on
  adversarial input large enough to be staged.
- A group holding NaN or inf gets a NaN scale; in a bfloat16 or float16 scale
  format an H100's conversion wrote 0x7FFF where the CPU writes ml_dtypes'
  quiet NaN (0x7FC0 / 0x7E00). The NaN is now written as bits; the bits are
  checked against ml_dtypes' conversion of float32's quiet NaN.
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from backend_bits import adversarial
from sampling import sample

import dtypes
from dtypes import _asymmetric_codec, _int_codec, _per_group, _scale_rules, _scale_storage

SCALINGS = [
    dtypes.PerTensor(),
    dtypes.PerAxis(0),
    dtypes.PerAxis(1),
    dtypes.PerBlock(32),
    dtypes.PerBlock(7, axis=0),
]


def _choose(form, monkeypatch):
    """Every `lax.platform_dependent` takes `form`'s branch until `monkeypatch.undo()`."""

    def chosen(*args, **branches):
        return branches[form](*args)

    monkeypatch.setattr(_scale_rules.lax, "platform_dependent", chosen)


@pytest.mark.parametrize("scaling", SCALINGS, ids=str)
def test_both_forms_of_the_group_absmax_give_the_same_bits(scaling, monkeypatch):
    x = adversarial(1 << 16).reshape(-1, 64)
    got = {}
    assert x.size > _per_group._SMALL  # the CPU's form stages it
    for form in ("cpu", "default"):
        _choose(form, monkeypatch)
        f = jax.jit(lambda v: _per_group.group_absmax(v, scaling))
        got[form] = np.asarray(f(x)).view(np.uint32)
    monkeypatch.undo()
    np.testing.assert_array_equal(got["cpu"], got["default"])
    # and they are right: max |x| of each group (subnormal maxima read as 0), NaN where
    # the group holds NaN or inf
    flushed = np.where(np.abs(x) < np.float32(2.0**-126), np.float32(0), np.abs(x))
    want = np.asarray(
        scaling.group_reduce(flushed, lambda a, axes: np.max(a, axis=axes, keepdims=True))
    )
    bad = np.asarray(
        scaling.group_reduce(~np.isfinite(x), lambda a, axes: np.any(a, axis=axes, keepdims=True))
    )
    values = got["cpu"].view(np.float32)
    assert np.array_equal(np.isnan(values), bad)
    np.testing.assert_array_equal(values[~bad], want[~bad])


@pytest.mark.parametrize(
    ("scaling", "dtype"),
    [
        (dtypes.PerAxis(0, scale_format="bfloat16"), ml_dtypes.bfloat16),
        (dtypes.PerBlock(32, scale_format="float16"), np.float16),
    ],
    ids=["bfloat16", "float16"],
)
@pytest.mark.parametrize("name", ["int8", "int4", "uint4", "uint8"])
def test_nan_group_scales_are_the_quiet_nan_in_a_narrow_scale_format(name, scaling, dtype):
    x = np.ones((4, 32), np.float32)
    x[1, 3], x[2, 0] = np.nan, -np.inf
    enc = jax.jit(lambda v: dtypes.get(name).encode(v, scaling=scaling))(x)
    bits = np.asarray(enc.scale).view(np.uint16).ravel()
    quiet = int(np.float32(np.nan).astype(dtype).view(np.uint16))
    assert bits[1] == bits[2] == quiet, [hex(b) for b in bits]
    assert np.isfinite(np.asarray(enc.scale, np.float32)[[0, 3]]).all()


# The integer encodes' elementwise pass, in the nearest modes, has a CPU form that
# leaves the flush of subnormals to XLA:CPU and zeroes a NaN group's codes as integers
# (`_int_codec._nearest_codes_cpu`). A GPU runs the exact form. Both are forced here
# and must give the same codes, scales, rounded values and gradient masks.
INT_SCALINGS = [
    *SCALINGS,
    dtypes.PerAxis(0, power_of_two=True),
    dtypes.PerBlock(32, scale_format="bfloat16"),
    dtypes.PerBlock(32, power_of_two=True, scale_format="float8_e8m0fnu"),
]
# each scaling once, spread over the formats (the paths: per tensor, per group, a
# narrow scale format, power-of-two's clipped codes; int2's prescaled reciprocal)
INT_FORMATS = ("int8", "int4", "int2")
INT_CASES = sample(
    [(n, s) for n in INT_FORMATS for s in INT_SCALINGS],
    lambda c: INT_SCALINGS.index(c[1]) % 3 == INT_FORMATS.index(c[0]),
)


def _forced(form, monkeypatch, fn, *args):
    """`jax.jit(fn)(*args)` with every `lax.platform_dependent` taking `form`'s branch,
    and the compiled program's text; the CPU form of the codes is seen traced in the
    "cpu" run only (so the test knows which form it compared)."""

    steps = []  # the CPU form's traces: some in "cpu", none in "default"

    def counted(*a, **k):
        steps.append(1)
        return _scale_rules.nearest_steps_cpu(*a, **k)

    jax.clear_caches()  # (the library's inner jits would reuse the other form's trace)
    _choose(form, monkeypatch)
    for codec in (_int_codec, _asymmetric_codec):
        monkeypatch.setattr(codec, "nearest_steps_cpu", counted)
    try:
        f = jax.jit(fn)
        text = f.lower(*args).compile().as_text()
        assert bool(steps) == (form == "cpu"), (form, len(steps))
        return jax.tree.map(lambda a: np.asarray(a), f(*args)), text
    finally:
        monkeypatch.undo()
        jax.clear_caches()


# and the zero-point codes (`_asymmetric_codec._nearest_codes_cpu`): minmax and absmax
# ranges, 8 bits and the prescaled 2 bits, and a float16 scale (clipped at 65504, so
# products of values near float32's top pass 2**31 before the zero point is added)
UINT_CASES = [
    (dtypes.get("uint8"), dtypes.PerTensor()),
    (dtypes.get("uint8"), dtypes.PerAxis(0, scale_format="float16")),
    (dtypes.get("uint4"), dtypes.PerBlock(32)),
    (dtypes.AsymmetricIntFormat(2, calibration="absmax"), dtypes.PerAxis(0)),
    (dtypes.AsymmetricIntFormat(3), dtypes.PerBlock(16, scale_format="bfloat16")),
]


def _unit_ties() -> np.ndarray:
    """Rows of 32 whose absmax is a power of two 2**k (so a reciprocal is exact and
    half of it a tie for int2's one step), holding +-2**(k-1) and their neighbours,
    for k from -120 to 127 (past 2**100 the reciprocal is prescaled)."""
    rows = []
    for k in range(-120, 128, 3):
        top, half = np.float32(2.0**k), np.float32(2.0 ** (k - 1))
        up, down = np.nextafter(half, np.float32(np.inf)), np.nextafter(half, np.float32(0))
        row = np.float32([top, half, -half, up, -up, down, -down, 0.0] * 4)
        rows.append(row)
    return np.stack(rows)


INT_CASES += [("int2", dtypes.PerBlock(32))]  # (groups of 32: products and comparisons)


@pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="the CPU form relies on XLA:CPU's flush of subnormals"
)
@pytest.mark.parametrize(("name", "scaling"), INT_CASES + UINT_CASES, ids=str)
def test_both_forms_of_the_integer_codes_give_the_same_bits(name, scaling, monkeypatch):
    # (int2's `round` takes the CPU form too, but under power-of-two scales, whose
    # gradient mask reads the rounded values; wider grids' `round` the exact form; the
    # zero-point formats' `round` decodes their encode)
    fmt = dtypes.get(name) if isinstance(name, str) else name
    xs = [adversarial(1 << 12).reshape(-1, 64)]  # groups with NaN or inf, and without
    if getattr(fmt, "qmax", None) == 1:  # int2: groups of 128 take the threshold form
        wide = adversarial(1 << 14).reshape(-1, 128)
        xs += [wide, np.ascontiguousarray(wide.T)]  # ties along either axis
        xs.append(_unit_ties())  # exact ties in blocks of 32, prescaled ones among them
    if isinstance(scaling, dtypes.PerTensor):  # (one NaN would make every code 0)
        xs = [np.where(np.isfinite(x), x, np.float32(1)) for x in xs]

    def run(v):
        out = {}
        for mode in ("nearest_even", "nearest_away"):
            enc = fmt.encode(v, scaling=scaling, rounding=mode)
            mask = jax.grad(
                lambda u, mode=mode: fmt.round(u, scaling=scaling, rounding=mode).sum()
            )(v)
            out[mode] = (enc.data, enc.scale, fmt.round(v, scaling=scaling, rounding=mode), mask)
        return out

    bits = lambda t: [a.view(np.uint8) for a in jax.tree.leaves(t)]
    for x in xs:
        cpu, cpu_text = _forced("cpu", monkeypatch, run, x)
        exact, exact_text = _forced("default", monkeypatch, run, x)
        assert cpu_text != exact_text  # the two forms were compiled
        for a, b in zip(bits(cpu), bits(exact), strict=True):
            np.testing.assert_array_equal(a, b)


def _both_forms(monkeypatch, fn, x):
    """`jax.jit(fn)(x)`'s leaves (numpy) and compiled text with every
    `lax.platform_dependent` forced to each branch in turn: ({form: leaves}, {form: text})."""
    got, texts = {}, {}
    for form in ("cpu", "default"):
        jax.clear_caches()  # (the library's inner jits would reuse the other form's trace)
        _choose(form, monkeypatch)
        try:
            f = jax.jit(fn)
            texts[form] = f.lower(x).compile().as_text()
            got[form] = [np.asarray(a) for a in jax.tree.leaves(f(x))]
        finally:
            monkeypatch.undo()
            jax.clear_caches()
    return got, texts


# The scaled fp8 encodes have a CPU form too (`_float_codec._byte_codes`): NaN and inf
# made +0 on the bits, subnormals left to XLA:CPU's flush, and no clip where float32
# absmax scales cannot overshoot. Both forms must give the same codes and scales.
FP8_CASES = [
    ("float8_e4m3fn", dtypes.PerTensor()),
    ("float8_e5m2", dtypes.PerTensor()),
    ("float8_e4m3fn", dtypes.PerAxis(0)),
    ("float8_e5m2", dtypes.PerAxis(1)),
    ("float8_e4m3fn", dtypes.PerBlock(32)),
    ("float8_e5m2", dtypes.PerBlock(7, axis=0)),
    ("float8_e4m3fn", dtypes.PerAxis(0, scale_format="float16")),  # (clipped at 65504)
    ("float8_e5m2", dtypes.PerBlock(32, scale_format="bfloat16")),
    ("float8_e4m3fn", dtypes.PerBlock(32, power_of_two=True, scale_format="float8_e8m0fnu")),
    ("float8_e5m2", dtypes.PerAxis(0, power_of_two=True)),
]


@pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="the CPU form relies on XLA:CPU's flush of subnormals"
)
@pytest.mark.parametrize(("name", "scaling"), FP8_CASES, ids=str)
def test_both_forms_of_the_fp8_codes_give_the_same_bits(name, scaling, monkeypatch):
    fmt = dtypes.get(name)
    x = adversarial(1 << 12).reshape(-1, 64)  # groups with NaN or inf, and without
    if isinstance(scaling, dtypes.PerTensor):  # (one NaN would make every code 0)
        x = np.where(np.isfinite(x), x, np.float32(1))
    got, texts = _both_forms(monkeypatch, lambda v: fmt.encode(v, scaling=scaling), x)
    assert texts["cpu"] != texts["default"]  # the two forms were compiled
    for a, b in zip(got["cpu"], got["default"], strict=True):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="the CPU form relies on XLA:CPU's flush of subnormals"
)
def test_both_forms_of_the_float16_rounding_give_the_same_bits(monkeypatch):
    # (`_float_codec._round_float16_cpu`: XLA's conversion there and back, NaN and the
    # overflow written on the bits)
    edges = np.array(
        [0x7F800001, 0xFFC00001, 0x7FFFFFFF, 0x7FA00000, 0x7F800000, 0xFF800000,
         0x477FEFFF, 0x477FF000, 0xC77FF000, 0x477FE000, 0x33000000, 0x33000001,
         0xB3000000, 0x33800000, 0x387FE000, 0x387FF000, 0x00000001, 0x80000001],
        np.uint32,
    ).view(np.float32)  # fmt: skip
    x = np.concatenate([adversarial(1 << 12).ravel(), edges])
    got, texts = _both_forms(monkeypatch, lambda v: dtypes.get("float16").round(v), x)
    assert texts["cpu"] != texts["default"]  # the two forms were compiled
    np.testing.assert_array_equal(got["cpu"][0].view(np.uint32), got["default"][0].view(np.uint32))


def test_both_forms_of_the_nvfp4_block_reciprocals_give_numpys_quotients(monkeypatch):
    """NVFP4's per-block reciprocal `g / s` (`_scale_storage._divided_by_e4m3`): on
    XLA:CPU one of eight quotients `g / (1 + k/8)` times `2**-e`, elsewhere a division
    per block. Both against numpy's float32 division, for every e4m3 value `s` and
    tensor scales `g` from float32's bottom to its top (quotients past float32 are inf,
    those below its smallest normal 0)."""
    s = np.arange(0, 0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    gs = np.float32([1, 3, 2688 / 7, 2.0**-100 * 1.7, 1.1754944e-38, 2.0**126, 2.0**119 * 1.3])
    rng = np.random.default_rng(7)
    gs = np.concatenate([gs, np.exp2(rng.uniform(-110, 120, 40)).astype(np.float32)])
    g, s = np.meshgrid(gs, s, indexing="ij")
    each_g = jax.vmap(_scale_storage._divided_by_e4m3)  # (g is one scalar per tensor)
    got, texts = _both_forms(monkeypatch, lambda a: each_g(a[0][:, 0], a[1]), np.stack([g, s]))
    assert texts["cpu"] != texts["default"]  # the two forms were compiled
    with np.errstate(divide="ignore", over="ignore"):
        want = np.where(s > 0, g / np.where(s > 0, s, np.float32(1)), np.float32(0))
    want = np.where(want < np.float32(2.0**-126), np.float32(0), want).astype(np.float32)
    for form in ("cpu", "default"):
        np.testing.assert_array_equal(got[form][0].view(np.uint32), want.view(np.uint32))
