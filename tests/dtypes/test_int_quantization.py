"""Integer formats against the numpy reference of docs/design.md §2, and packing bit by bit."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from checks import assert_covers, fid, params_of, registry
from reference import int_quantize, pack, unpack
from sampling import HUNT

import dtypes
from dtypes import Encoded, PerAxis, PerBlock, PerTensor


def plain_int(f) -> bool:
    """Symmetric integer elements under the scalings these tests name: an entry carrying a
    scaling of its own (mxint8, OCP MX) follows that rule in test_mx_nvfp4.py, and under
    another scaling it is its element format; zero-point ("uint") and code-book kinds
    have their own references (test_asymmetric.py, test_codebook.py)."""
    return f.kind == "int" and f.scaling is None


INTS = registry(plain_int)
MULTIBIT = [f for f in INTS if not f.binary]
PACKED = [f for f in INTS if f.packed]
DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down")


@functools.cache
def _jitted_encode(fmt, scaling, rounding):
    """One `jax.jit` of encode per (format, scaling, mode), shared by the tests below: a
    fresh `jax.jit(lambda ...)` compiles anew, and the codes, bit-exact scale, mode and
    error-bound tests encode many of the same combinations on the same (8, 100) data."""
    return jax.jit(lambda v: fmt.encode(v, scaling=scaling, rounding=rounding))


# `encode` runs one jitted kernel per (format, scaling, mode, shape) eagerly and inlines
# that kernel under an outer jit (dtypes/_int_codec.py): the sweeps below run every case
# under jit, and in CI eagerly for int4 (packed codes) and int1 (mean scales) only; every
# case both ways under the hunt profile.
_EAGER = ("int4", "int1")


def _both_ways(cases: list) -> list:
    """`("eager" | "jit", *case)` params for `cases` (format first), sampled as above."""
    out = []
    for how in ("eager", "jit"):
        for case in cases:
            values = case.values if hasattr(case, "values") else case
            if HUNT or how == "jit" or values[0].name in _EAGER:
                name = case.id if hasattr(case, "id") else "-".join(map(str, values))
                out.append(pytest.param(how, *values, id=f"{how}-{name}"))
    return out


def _runner(how: str):
    """What the suite's `eager_and_jit` fixture gives for `how`."""
    return jax.jit if how == "jit" else (lambda f: f)


def _encode(eager_and_jit, fmt, x, scaling, rounding="nearest_even"):
    """`fmt.encode` of `x` eagerly, or under the shared `jax.jit` (the `eager_and_jit`
    variant; its eager one returns its argument itself)."""
    if eager_and_jit(jax.jit) is jax.jit:
        return fmt.encode(x, scaling=scaling, rounding=rounding)
    return _jitted_encode(fmt, scaling, rounding)(x)


def _data(shape=(8, 100), seed=0) -> np.ndarray:
    """Normal float32 values with varied magnitudes, an all-zero row and exact ties."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-6, 6, (*shape[:-1], 1)).astype(np.float32)
    if shape[0] > 2:
        x[1] = 0.0  # an all-zero row (and all-zero blocks)
        # row 2: absmax 127 and 7 so that x * (qmax / absmax) hits exact .5 ties for int8
        x[2] = rng.integers(-126, 127, shape[-1]) + 0.5
        x[2, 0] = 127.0
    return x


SCALINGS = [
    ("tensor", PerTensor(), {}),
    ("axis0", PerAxis(0), {"kind": "axis", "axis": 0}),
    ("axis1", PerAxis(1), {"kind": "axis", "axis": 1}),
    ("axis-1", PerAxis(-1), {"kind": "axis", "axis": -1}),
    ("block32", PerBlock(32), {"kind": "block", "axis": -1, "size": 32}),  # 100 = 3*32 + 4
    ("block3-axis0", PerBlock(3, axis=0), {"kind": "block", "axis": 0, "size": 3}),  # 8 = 2*3+2
    ("pow2-tensor", PerTensor(power_of_two=True), {"power_of_two": True}),
    (
        "pow2-block32",
        PerBlock(32, power_of_two=True),
        {"kind": "block", "axis": -1, "size": 32, "power_of_two": True},
    ),
    (
        "pow2-axis0",
        PerAxis(0, power_of_two=True),
        {"kind": "axis", "axis": 0, "power_of_two": True},
    ),
]


def _codes_and_scale(enc: Encoded) -> tuple[np.ndarray, np.ndarray]:
    """Codes (decoded with scale 1) and the per-element scale of an int encoding."""
    fmt = enc.format
    ones = Encoded(
        enc.data, jnp.ones_like(enc.scale), fmt, enc.scaling, enc.shape[-1] if fmt.packed else None
    )
    codes = np.asarray(fmt.decode(ones))
    scale = np.asarray(enc.scaling.broadcast(enc.scale, enc.shape))
    return codes, scale


# int1 scales by mean|x|: power-of-two absmax scaling does not apply to it
INT_CASES = [
    pytest.param(fmt, *case, id=f"{fmt.name}-{case[0]}")
    for fmt in INTS
    for case in SCALINGS
    if not (fmt.binary and case[1].power_of_two)
]


@pytest.mark.parametrize(("how", "fmt", "name", "scaling", "ref_kw"), _both_ways(INT_CASES))
def test_codes_and_scales_match_numpy_reference(how, fmt, name, scaling, ref_kw):
    eager_and_jit = _runner(how)
    x = _data()
    enc = _encode(eager_and_jit, fmt, jnp.asarray(x), scaling)
    assert enc.scale.shape == scaling.scale_shape(x.shape)
    assert enc.scale.dtype == jnp.float32
    assert enc.shape == x.shape
    codes, scale = _codes_and_scale(enc)
    ref_codes, ref_scale = int_quantize(x, fmt.qmax, binary=fmt.binary, **ref_kw)
    np.testing.assert_array_equal(codes, ref_codes)
    # within an ulp here; bit-exactness of the scale is its own test below
    np.testing.assert_allclose(scale, ref_scale, rtol=4e-7 * np.log2(x.size), atol=0)


@pytest.mark.parametrize(("name", "scaling", "ref_kw"), SCALINGS, ids=[s[0] for s in SCALINGS])
@pytest.mark.parametrize("fmt", MULTIBIT, ids=fid)
def test_scales_are_bit_exact_absmax_over_qmax(fmt, name, scaling, ref_kw):
    """docs/design.md §2: the stored scale is `absmax / qmax` in float32 (correctly rounded)."""
    x = _data()
    enc = _jitted_encode(fmt, scaling, "nearest_even")(jnp.asarray(x))
    _, scale = _codes_and_scale(enc)
    _, ref_scale = int_quantize(x, fmt.qmax, **ref_kw)
    np.testing.assert_array_equal(scale, ref_scale)


SEVERAL_AXES = [
    pytest.param(fmt, scaling, id=f"{fid(fmt)}-{scaling}")
    for scaling in [
        PerAxis((0, -1)),
        PerAxis((2, 0), power_of_two=True),
        PerAxis((1, 2)),
        PerAxis((0, 1, 2)),
    ]
    for fmt in INTS
]


@pytest.mark.parametrize(("how", "fmt", "scaling"), _both_ways(SEVERAL_AXES))
def test_several_axes_match_numpy_reference(how, fmt, scaling):
    """One scale per index combination of the named axes (a scale per layer and channel)."""
    eager_and_jit = _runner(how)
    if fmt.binary and scaling.power_of_two:
        pytest.skip("int1 scales are means: no power-of-two variant")
    x = _data((4, 6, 50), seed=5)
    enc = eager_and_jit(lambda v: fmt.encode(v, scaling=scaling))(jnp.asarray(x))
    assert enc.scale.shape == tuple(n if d in scaling.kept(3) else 1 for d, n in enumerate(x.shape))
    codes, scale = _codes_and_scale(enc)
    ref_codes, ref_scale = int_quantize(
        x,
        fmt.qmax,
        kind="axis",
        axis=scaling.axes,
        power_of_two=scaling.power_of_two,
        binary=fmt.binary,
    )
    np.testing.assert_array_equal(codes, ref_codes)
    np.testing.assert_allclose(scale, ref_scale, rtol=4e-7 * np.log2(x.size), atol=0)


@pytest.mark.parametrize(
    ("axis", "message"),
    [((), "names 0 axis"), ((1,), "names 1 axis"), ((0, 0), "twice"), ((0, 1.0), "int")],
)
def test_several_axes_refuse_what_names_no_grouping(axis, message):
    with pytest.raises(dtypes.ScalingError, match=message):
        PerAxis(axis)
    with pytest.raises(dtypes.ScalingError, match="twice"):
        PerAxis((0, -3)).scale_shape((2, 3, 4))  # one axis of a 3-d tensor, named twice


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("fmt", MULTIBIT, ids=fid)
def test_every_deterministic_mode_matches_numpy_reference(fmt, mode, eager_and_jit):
    x = _data(seed=1)
    scaling = PerAxis(0)
    enc = _encode(eager_and_jit, fmt, jnp.asarray(x), scaling, mode)
    codes, _ = _codes_and_scale(enc)
    ref_codes, _ = int_quantize(x, fmt.qmax, kind="axis", axis=0, mode=mode)
    np.testing.assert_array_equal(codes, ref_codes)


@pytest.mark.parametrize("mode", ["nearest_even", "nearest_away"])
@pytest.mark.parametrize("scaling", [PerTensor(), PerAxis(0), PerBlock(32)], ids=str)
@pytest.mark.parametrize("fmt", MULTIBIT, ids=fid)
def test_nearest_error_is_at_most_half_a_scale(fmt, scaling, mode):
    x = _data(seed=2)
    enc = _jitted_encode(fmt, scaling, mode)(jnp.asarray(x))
    y = np.asarray(enc.decode(), np.float64)
    scale = _codes_and_scale(enc)[1]
    err = np.abs(y - x)
    # one float32 rounding in x * (qmax/absmax) and one in code * scale
    bound = scale / 2 * (1 + 2**-20) + np.abs(x) * 2**-23
    assert np.all(err <= bound), f"worst {np.max(err / bound)}"


@pytest.mark.parametrize("fmt", INTS, ids=fid)
def test_stochastic_codes_are_floor_or_ceil_and_unbiased(fmt, eager_and_jit):
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, 64).astype(np.float32)
    x[0] = 1.0  # absmax 1: y = x * qmax
    n = 2000
    keys = jax.random.split(jax.random.key(11), n)
    out = eager_and_jit(
        lambda ks, v: jax.vmap(lambda k: fmt.round(v, rounding="stochastic", key=k))(ks)
    )(keys, jnp.asarray(x))
    out = np.asarray(out, np.float64)
    if fmt.binary:
        # binary codes are sign(x): stochastic rounding has nothing to choose
        np.testing.assert_array_equal(out, np.broadcast_to(np.asarray(fmt.round(x)), out.shape))
        return
    y = x.astype(np.float64) * fmt.qmax  # exact codes before rounding (scale is 1/qmax)
    scale = 1.0 / fmt.qmax
    lo, hi = np.floor(y) * scale, np.ceil(y) * scale
    tol = 1e-6
    near_lo, near_hi = np.abs(out - lo) < tol, np.abs(out - hi) < tol
    assert np.all(near_lo | near_hi), "a stochastic code is neither floor nor ceil"
    p = y - np.floor(y)
    freq = near_hi.mean(axis=0)
    freq = np.where(p == 0, 1 - near_lo.mean(axis=0), freq)
    sigma = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(freq - p) <= 5 * sigma + 1e-12), (x, p, freq)
    # unbiased: the mean of the decoded values is x within 5 sigma
    mean_err = np.abs(out.mean(axis=0) - x)
    assert np.all(mean_err <= 5 * sigma * scale + 1e-6)


@pytest.mark.parametrize("fmt", INTS, ids=fid)
def test_stochastic_same_key_same_codes(fmt):
    x = jnp.asarray(_data(seed=4))
    a = fmt.encode(x, rounding="stochastic", key=jax.random.key(0))
    b = fmt.encode(x, rounding="stochastic", key=jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    if not fmt.binary:
        c = fmt.encode(x, rounding="stochastic", key=jax.random.key(1))
        assert np.any(np.asarray(a.data) != np.asarray(c.data))


def test_binary_codes_and_zero_maps_to_plus_one():
    fmt = dtypes.int1
    assert fmt.binary
    x = np.array([[0.0, -0.0, 2.0, -3.0, 1.0, -1.0, 0.5, 0.0]], np.float32)
    enc = fmt.encode(x)
    codes, scale = _codes_and_scale(enc)
    np.testing.assert_array_equal(codes, [[1, 1, 1, -1, 1, -1, 1, 1]])
    np.testing.assert_allclose(scale, np.mean(np.abs(x)), rtol=1e-7)
    assert fmt.qmax == 1


@pytest.mark.parametrize("fmt", MULTIBIT, ids=fid)  # int1 has no zero code
def test_all_zero_group_gets_scale_one_and_code_zero(fmt):
    x = np.zeros((3, 40), np.float32)
    x[0] = np.linspace(-1, 1, 40)
    enc = fmt.encode(x, scaling=PerAxis(0))
    expected = [np.float32(1) / np.float32(fmt.qmax), 1.0, 1.0]
    np.testing.assert_array_equal(np.asarray(enc.scale).ravel(), expected)
    codes, _ = _codes_and_scale(enc)
    np.testing.assert_array_equal(codes[1:], 0)


# -- packing ---------------------------------------------------------------


PACK_LENGTHS = [
    pytest.param(fmt, n, id=f"{fid(fmt)}-{n}") for n in [1, 3, 8, 9, 33] for fmt in PACKED
]


@pytest.mark.parametrize(("how", "fmt", "n"), _both_ways(PACK_LENGTHS))
def test_pack_matches_reference_for_every_code_and_odd_lengths(how, fmt, n):
    eager_and_jit = _runner(how)
    valid = np.array([-1, 1]) if fmt.binary else np.arange(-fmt.qmax, fmt.qmax + 1)
    rng = np.random.default_rng(n)
    codes = np.stack([np.resize(np.roll(valid, r), n) for r in range(len(valid))])
    codes = np.concatenate([codes, rng.choice(valid, (3, n))])
    codes[:, 0] = fmt.qmax  # absmax qmax: scale 1, so the codes are the values
    x = codes.astype(np.float32)
    enc = eager_and_jit(lambda v: fmt.encode(v))(jnp.asarray(x))
    assert enc.data.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(enc.data), pack(codes, fmt.bits))
    assert enc.shape == x.shape
    got, _ = _codes_and_scale(eager_and_jit(lambda e: e)(enc))
    np.testing.assert_array_equal(got, codes)


@pytest.mark.parametrize("fmt", PACKED, ids=fid)
def test_unpack_of_every_byte_matches_reference(fmt, eager_and_jit):
    """Every byte decodes as the reference unpacks it; eagerly, the one code symmetric
    encoders never write (int4's -8, int2's -2) is refused instead, as `save` refuses it."""
    data = np.arange(256, dtype=np.uint8).reshape(16, 16)
    per = 8 // fmt.bits
    low = -(2 ** (fmt.bits - 1))
    eager = eager_and_jit(jax.jit) is jax.jit  # (the eager variant returns f itself)
    for n in (16 * per, 16 * per - 1, 1):  # whole bytes, one padding field, a single field
        nb = -(-n // per)
        d = data[:, :nb]
        want = unpack(d, fmt.bits, n)
        enc = Encoded(jnp.asarray(d), jnp.ones((1, 1), jnp.float32), fmt, PerTensor(), n)
        assert enc.shape == (16, n)
        every_field = unpack(d, fmt.bits, nb * per)  # (padding fields are checked too)
        if eager and fmt.bits > 1 and np.any(every_field == low):
            with pytest.raises(dtypes.FormatError, match=f"code {low}"):
                enc.decode()
            continue
        got = np.asarray(eager_and_jit(lambda e: e.decode())(enc))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", INTS, ids=fid)
def test_scalar_round_trip(fmt):
    for v in (0.75, -2.5, 0.0):
        enc = fmt.encode(np.float32(v))
        assert enc.shape == ()
        # a scalar is its own absmax: code ±qmax (int1: sign, scale |v|), decoding to v
        assert float(enc.decode()) == pytest.approx(v, rel=1e-6)


# -- nbytes ---------------------------------------------------------------


def _held_bytes(enc: Encoded) -> int:
    return sum(np.asarray(a).nbytes for a in jax.tree_util.tree_leaves(enc))


# Every shape and scaling for a packed, a binary and an unpacked scaled format; the
# other formats share their arithmetic and take the 3-D shape in CI, every shape when
# hunting (tests/sampling.py).
_NBYTES_EVERY_SHAPE = ("int4", "int1", "float8_e4m3fn")
_NBYTES_CASES = [
    pytest.param(fmt, shape, id=f"{fmt.name}-{shape}")
    for fmt in [*INTS, dtypes.float16, dtypes.float8_e4m3fn]
    for shape in [(5,), (3, 17), (2, 3, 33)]
    if fmt.name in _NBYTES_EVERY_SHAPE or shape == (2, 3, 33) or HUNT
]


@pytest.mark.parametrize("scaling", [None, PerAxis(0), PerBlock(7), PerBlock(2, axis=0)], ids=str)
@pytest.mark.parametrize(("fmt", "shape"), _NBYTES_CASES)
def test_nbytes_equals_bytes_held(fmt, shape, scaling):
    if isinstance(scaling, PerBlock) and scaling.axis == 0 and len(shape) < 2:
        scaling = PerBlock(2)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    enc = fmt.encode(x, scaling=scaling)
    assert enc.nbytes == _held_bytes(enc) == fmt.nbytes(shape, scaling)


@pytest.mark.parametrize("fmt", INTS, ids=fid)
def test_megapixel_footprint(fmt):
    data_bytes = 1024 * 1024 * fmt.bits // 8  # packed densely
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1024, 1024), np.float32))
    enc = fmt.encode(x)
    assert enc.nbytes == data_bytes + 4  # one float32 scale
    assert _held_bytes(enc) == data_bytes + 4
    assert fmt.nbytes((1024, 1024)) == data_bytes + 4
    assert fmt.nbytes((1024, 1024), PerAxis(0)) == data_bytes + 4 * 1024


def test_empty_tensors_encode(fmt):  # every registry entry, by the plugin's `fmt`
    x = np.zeros((0, 5), np.float32)
    enc = fmt.encode(x)
    assert enc.shape == (0, 5)
    assert enc.decode().shape == (0, 5)
    assert enc.nbytes == _held_bytes(enc) == fmt.nbytes((0, 5))


@pytest.mark.parametrize("fmt", MULTIBIT, ids=fid)
def test_absmax_at_float32_max_decodes_finite(fmt):
    """code * scale of the group's absmax must not overflow: qmax * fl(absmax / qmax) <= max."""
    top = np.finfo(np.float32).max
    x = np.array([top, -top, 1.0, 0.0], np.float32)
    y = np.asarray(fmt.round(x))
    assert np.isfinite(y).all(), f"{fmt.name}.round({x}) = {y}"
    np.testing.assert_allclose(y[:2], x[:2], rtol=1e-6)


TINY = np.float32(2.0**-126)  # float32's smallest normal


@pytest.mark.parametrize("fmt", MULTIBIT, ids=fid)
@pytest.mark.parametrize("power_of_two", [False, True], ids=["absmax", "pow2"])
def test_tiny_groups_get_the_smallest_normal_scale(fmt, power_of_two, eager_and_jit):
    """A scale below 2**-126 would be flushed to zero by XLA on CPU (and every
    decoded value with it): such groups are scaled by 2**-126 exactly, so the
    codes are the values in units of 2**-126."""
    units = np.array([0, 1, -1, fmt.qmax - 1, -(fmt.qmax - 1), 1.5, -2.5], np.float32)
    units = units[np.abs(units) <= fmt.qmax]
    x = units * TINY  # all normal or zero: absmax < qmax * 2**-126
    scaling = PerTensor(power_of_two=power_of_two)
    enc = eager_and_jit(lambda v: fmt.encode(v, scaling=scaling))(jnp.asarray(x))
    codes, scale = _codes_and_scale(enc)
    np.testing.assert_array_equal(scale, TINY)
    np.testing.assert_array_equal(codes, np.rint(units))  # ties to even: 1.5 -> 2, -2.5 -> -2
    decoded = np.asarray(fmt.decode(enc))
    np.testing.assert_array_equal(decoded, np.rint(units) * TINY)
    np.testing.assert_array_equal(np.asarray(fmt.round(x, scaling=scaling)), decoded)


@pytest.mark.parametrize("fmt", INTS, ids=fid)
def test_subnormal_inputs_count_as_zero_on_every_backend(fmt, eager_and_jit):
    sub = np.float32(2.0**-140)
    x = np.array([sub, -sub, 3 * sub, 0.0], np.float32)
    enc = eager_and_jit(fmt.encode)(jnp.asarray(x))
    codes, scale = _codes_and_scale(enc)
    if fmt.binary:
        # every input reads as zero: mean 0, codes +1 (the sign of +0 and -0)
        np.testing.assert_array_equal(codes, 1)
        np.testing.assert_array_equal(scale, 0)
    else:
        # an all-zero group: scale 1, codes 0
        np.testing.assert_array_equal(codes, 0)
        np.testing.assert_array_equal(scale, 1)
    mixed = np.array([sub, 1.0, -sub, -0.5], np.float32)
    codes, _ = _codes_and_scale(eager_and_jit(fmt.encode)(jnp.asarray(mixed)))
    ref_codes, _ = int_quantize(mixed, fmt.qmax, binary=fmt.binary)
    np.testing.assert_array_equal(codes, ref_codes)
    assert ref_codes[0] == codes[0] == (1 if fmt.binary else 0)


def test_the_per_format_tests_run_over_every_registry_entry_their_rule_admits():
    for test in (
        test_codes_and_scales_match_numpy_reference,
        test_several_axes_match_numpy_reference,
        test_stochastic_codes_are_floor_or_ceil_and_unbiased,
        test_stochastic_same_key_same_codes,
        test_scalar_round_trip,
        test_megapixel_footprint,
        test_subnormal_inputs_count_as_zero_on_every_backend,
    ):
        assert_covers(test, plain_int)
    for test in (
        test_scales_are_bit_exact_absmax_over_qmax,
        test_every_deterministic_mode_matches_numpy_reference,
        test_nearest_error_is_at_most_half_a_scale,
        test_all_zero_group_gets_scale_one_and_code_zero,
        test_absmax_at_float32_max_decodes_finite,
        test_tiny_groups_get_the_smallest_normal_scale,
    ):
        assert_covers(test, lambda f: plain_int(f) and not f.binary)  # int1: a mean, no zero
    for test in (test_pack_matches_reference_for_every_code_and_odd_lengths,):
        assert_covers(test, lambda f: plain_int(f) and f.packed)
    assert not params_of(test_empty_tensors_encode)  # the plugin's every entry


def test_power_of_two_scale_at_the_top_of_float32():
    """int2 (qmax 1) with absmax >= 2**127 has scale 2**127, whose reciprocal
    2**-127 is subnormal: the codes are still exact (x is multiplied in two steps)."""
    x = np.array([3e38, 2.0**127, -(2.0**127), 1.0], np.float32)
    enc = dtypes.int2.encode(x, scaling=PerTensor(power_of_two=True))
    codes, scale = _codes_and_scale(enc)
    np.testing.assert_array_equal(scale, np.float32(2.0**127))
    # 3e38 / 2**127 = 1.76 rounds to 2, clipped to qmax = 1; 1.0 / 2**127 rounds to 0
    np.testing.assert_array_equal(codes, [1, 1, -1, 0])


def _huge_groups(width: int, seed: int = 3) -> np.ndarray:
    """Rows whose absmax lies between 2**90 and float32's top (past 2**100 an absmax
    scale's reciprocal is taken in two steps; past 2**126 it is a float32 subnormal, of
    fewer significant bits), each holding +-absmax/2 and its float32 neighbours (int2's
    ties) and values spread below."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(90, 128):
        top = np.float32(2.0**k * rng.uniform(1.0, 1.99))
        half = np.float32(top / np.float32(2))
        near = [np.nextafter(half, np.float32(np.inf)), np.nextafter(half, np.float32(0))]
        row = (rng.uniform(-1, 1, width) * top).astype(np.float32)
        row[:4] = [top, -half, near[0], -near[1]]
        rows.append(rng.permutation(row))
    return np.stack(rows)


@pytest.mark.parametrize("mode", ["nearest_even", "nearest_away", "toward_zero", "up", "down"])
@pytest.mark.parametrize(
    ("scaling", "ref_kw"),
    [
        (PerAxis(0), {"kind": "axis", "axis": 0}),
        (PerBlock(32), {"kind": "block", "axis": -1, "size": 32}),
        (PerBlock(32, axis=0), {"kind": "block", "axis": 0, "size": 32}),
    ],
    ids=["rows-of-256", "blocks-of-32", "blocks-across-rows"],
)
def test_int2_codes_of_groups_near_float32s_top_match_numpy(scaling, ref_kw, mode, eager_and_jit):
    """int2's reciprocal past 2**100 is prescaled, and its codes come from comparisons on
    a CPU: both must give the numpy reference's codes and values there (a prescale read
    wrongly for such groups makes nearly every code +-1)."""
    fmt = dtypes.int2
    x = _huge_groups(256)
    enc = _encode(eager_and_jit, fmt, jnp.asarray(x), scaling, mode)
    codes, scale = _codes_and_scale(enc)
    ref_codes, ref_scale = int_quantize(x, fmt.qmax, mode=mode, **ref_kw)
    np.testing.assert_array_equal(codes, ref_codes)
    np.testing.assert_array_equal(scale, ref_scale)
    rounded = eager_and_jit(lambda v: fmt.round(v, scaling=scaling, rounding=mode))(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(rounded), ref_codes * ref_scale)


def test_int2_keeps_the_top_of_a_group_past_2_to_the_126():
    """The reported case: past 2**126 the rule's reciprocal `1 / absmax` is a float32
    subnormal, and `absmax * (1 / absmax)` is then 1.0000001 in numpy: code 1 in every
    mode. A reciprocal with the bits a subnormal cannot hold gave 0.99999994, and the
    group's largest values were rounded to 0 toward zero."""
    a = np.float32(1.6841544e38)
    x = jnp.array([a, -a])
    for mode, want in [("toward_zero", [a, -a]), ("up", [a, -a]), ("down", [a, -a])]:
        np.testing.assert_array_equal(np.asarray(dtypes.int2.round(x, rounding=mode)), want)


@pytest.mark.parametrize(
    "scaling",
    [PerAxis(0, scale_format="bfloat16"), PerBlock(32, scale_format="bfloat16")],
    ids=["rows", "blocks"],
)
@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero", "up"])
def test_int2_with_bfloat16_scales_near_float32s_top(scaling, mode, eager_and_jit):
    """A bfloat16 scale past 2**126 has a subnormal reciprocal too: codes are `x * (1 /
    stored scale)` as numpy computes them, the stored scale the absmax rounded to
    bfloat16 (ml_dtypes), read back exactly."""
    fmt = dtypes.int2
    x = _huge_groups(64)
    enc = _encode(eager_and_jit, fmt, jnp.asarray(x), scaling, mode)
    codes, _ = _codes_and_scale(enc)
    groups = x.reshape(x.shape[0], -1, 32) if isinstance(scaling, PerBlock) else x[:, None, :]
    absmax = np.abs(groups).max(axis=-1, keepdims=True)
    stored = absmax.astype(ml_dtypes.bfloat16).astype(np.float32)
    with np.errstate(under="ignore"):
        inv = (np.float64(1) / stored.astype(np.float64)).astype(np.float32)
    rnd = {"nearest_even": np.rint, "toward_zero": np.trunc, "up": np.ceil}[mode]
    want = np.clip(rnd(groups * inv), -1, 1).reshape(x.shape)
    np.testing.assert_array_equal(codes.reshape(x.shape), want)
