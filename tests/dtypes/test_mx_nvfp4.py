"""OCP MX, NVFP4, ml_dtypes' layouts and scale formats, against independent references.

- ml_dtypes for every layout it implements: `float4_e2m1fn`, both fp6,
  `float8_e4m3`, `float8_e3m4` and the E8M0 scale bytes of `float8_e8m0fnu`.
- OCP Microscaling Formats (MX) v1.0, section 6.3: per block of 32, the
  shared scale is `X = 2**(floor(log2(amax)) - emax_elem)` stored as the E8M0
  byte `floor(log2(amax)) - emax_elem + 127`; each element is `V / X`
  rounded to nearest-even in the element format, saturating at ±max; a
  block holding NaN gets the NaN scale 0xFF. MXINT8 elements are 8-bit two's
  complement with an implicit scale of 2**-6 (emax_elem = 0).
- NVFP4 as NVIDIA describes it: e2m1 elements in blocks of 16, an e4m3 scale
  per block and one float32 scale per tensor; the tensor encoding scale is
  `448 * 6 / amax(tensor)`, each block's e4m3 scale is the block's decoding
  scale `amax(block) / 6` times that, rounded to e4m3, and elements are `x`
  times the tensor encoding scale over the block's e4m3 scale, rounded to
  e2m1 (saturating).

The references are written in numpy from those rules (exact float64
arithmetic where the rule is exact, float32 where the rule says float32) and
use ml_dtypes for the element casts.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from checks import assert_covers, params_of, reduced_float, registry, same_named_type
from hypothesis import given
from hypothesis import strategies as st
from sampling import HUNT, sample

import dtypes
from dtypes import PerBlock
from dtypes._packing import unpack

ENC = dtypes.ENCODINGS

# -- the registry's entries, by rule -------------------------------------------


def byte_ml_layout(f) -> bool:
    """A reduced float of at most 8 bits that ml_dtypes implements under its name (one code
    a byte here; the 16-bit types are compared code by code in test_float_rounding.py)."""
    return reduced_float(f) and f.bits <= 8 and same_named_type(f) is not None


def scale_format(f) -> bool:
    """A scale format stored on its own (E8M0): exponent-only bytes."""
    return f.kind == "scale"


def mx(f) -> bool:
    """An OCP MX encoding: elements under power-of-two E8M0 scales per block."""
    s = getattr(f, "scaling", None)
    return s is not None and s.power_of_two and s.scale_format == "float8_e8m0fnu"


def mx_float(f) -> bool:
    """An MX encoding of float elements (MXINT8's integer elements: `mx_int`)."""
    return mx(f) and f.kind == "float"


def mx_int(f) -> bool:
    """An MX encoding of integer elements (two's complement, an implicit 2**-(bits-2))."""
    return mx(f) and f.kind == "int"


def two_level(f) -> bool:
    """NVIDIA's two-level recipe: e4m3 block scales under one float32 tensor scale."""
    s = getattr(f, "scaling", None)
    return s is not None and s.scale_format == "float8_e4m3fn"


def element_type(fmt):
    """ml_dtypes' type of a scaled encoding's element layout, by the OCP names
    (`float{bits}_e{e}m{m}`, `fn` when finite: MX's e4m3 is the finite e4m3fn)."""
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    return getattr(ml_dtypes, f"float{fmt.bits}_e{e}m{m}{'fn' if fmt.finite else ''}")


def emax_of(native) -> int:
    """The exponent of the element type's largest value (OCP's emax_elem), from ml_dtypes."""
    return math.frexp(float(ml_dtypes.finfo(native).max))[1] - 1


# -- ml_dtypes layouts --------------------------------------------------------

ML_LAYOUTS = [(f.name, same_named_type(f)) for f in registry(byte_ml_layout)]


def _grid(native) -> np.ndarray:
    bits = ml_dtypes.finfo(native).bits
    values = np.arange(2**bits, dtype=np.uint8).view(native).astype(np.float64)
    return np.unique(values[np.isfinite(values)])


def _input_classes(native) -> np.ndarray:
    """Grid values, midpoints and their float32 neighbours, overflow, zeros, inf/NaN."""
    grid = _grid(native)
    mids = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    top = float(ml_dtypes.finfo(native).max)
    parts = [
        grid,
        mids,
        np.nextafter(mids, np.float32(np.inf)),
        np.nextafter(mids, np.float32(-np.inf)),
        [top * 1.01, top * 4, -top * 4, 1e30, -1e30, 0.0, -0.0, 1e-30, -1e-30],
    ]
    return np.concatenate([np.asarray(p, np.float64) for p in parts]).astype(np.float32)


@pytest.mark.parametrize(("name", "native"), ML_LAYOUTS, ids=[n for n, _ in ML_LAYOUTS])
def test_named_layouts_cast_like_ml_dtypes(name, native, eager_and_jit):
    fmt = dtypes.get(name)
    assert fmt.name == name
    assert fmt.bits == ml_dtypes.finfo(native).bits
    x = _input_classes(native)
    if ml_dtypes.finfo(native).bits >= 8:  # formats with inf and NaN codes
        x = np.concatenate([x, np.array([np.inf, -np.inf, np.nan], np.float32)])
    expected = x.astype(native).astype(np.float32)
    got = np.asarray(eager_and_jit(lambda v: fmt.encode(v).decode())(x))
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))
    rounded = np.asarray(eager_and_jit(fmt.round)(x))
    np.testing.assert_array_equal(rounded, expected)


@pytest.mark.parametrize(("name", "native"), ML_LAYOUTS, ids=[n for n, _ in ML_LAYOUTS])
def test_named_layouts_decode_every_code_like_ml_dtypes(name, native, eager_and_jit):
    fmt = dtypes.get(name)
    bits = ml_dtypes.finfo(native).bits
    codes = np.arange(2**bits, dtype=np.uint8)
    expected = codes.view(native).astype(np.float32)
    if fmt.packed:
        enc = dtypes.Encoded(jnp.asarray(_pack_ref(codes, bits)), None, fmt, None, codes.size)
    else:
        enc = dtypes.Encoded(jnp.asarray(codes.view(native)), None, fmt, None)
    got = np.asarray(eager_and_jit(lambda e: e.decode())(enc))
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], expected.view(np.uint32)[~nan])


def _pack_ref(codes: np.ndarray, bits: int) -> np.ndarray:
    """Little-endian bit-stream packing, written with numpy's packbits."""
    stream = np.unpackbits(codes.astype(np.uint8)[:, None], axis=1, bitorder="little")[:, :bits]
    return np.packbits(stream.reshape(-1), bitorder="little")


@pytest.mark.parametrize("fmt", registry(scale_format), ids=lambda f: f.name)
def test_e8m0_matches_ml_dtypes(fmt, eager_and_jit):
    assert dtypes.get("e8m0") is dtypes.get("float8_e8m0fnu")
    k = np.arange(-126, 128, dtype=np.float64)
    p = 2.0**k
    x = np.concatenate(
        [p, p * 1.5, p * 1.25, p * 1.75, np.nextafter(p * 1.5, 0), [0.0, -1.0, np.nan, np.inf]]
    ).astype(np.float32)
    x = x[np.isfinite(x.astype(np.float64)) | np.isnan(x) | np.isinf(x)]
    if eager_and_jit is not jax.jit:  # eagerly, values without a code are refused
        x = x[(x > 0) & (x < 1.5 * 2.0**127) | np.isnan(x)]
    native = same_named_type(fmt)
    expected = x.astype(native)
    enc = eager_and_jit(fmt.encode)(x)
    assert enc.data.dtype == native
    np.testing.assert_array_equal(np.asarray(enc.data).view(np.uint8), expected.view(np.uint8))
    # every byte decodes to its power of two (2**-127 needs float64 to be kept)
    codes = np.arange(256, dtype=np.uint8).view(native)
    got = np.asarray(fmt.decode(dtypes.Encoded(jnp.asarray(codes), None, fmt, None)))
    want = codes.astype(np.float32)
    np.testing.assert_array_equal(got[1:255], want[1:255])
    assert np.isnan(got[255])
    assert fmt.nbytes((3, 5)) == 15


# -- OCP MX -------------------------------------------------------------------

MX_FLOATS = registry(mx_float)


def mx_reference(x: np.ndarray, native, emax_elem: int) -> tuple[np.ndarray, np.ndarray]:
    """(element codes, E8M0 bytes) of float32 `x` (rows a multiple of 32) by OCP MX v1.0."""
    blocks = x.astype(np.float64).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1)
    nan = np.isnan(blocks).any(axis=-1)
    # floor(log2(amax)) exactly: frexp gives amax = f * 2**e with f in [0.5, 1)
    e = np.frexp(np.where(amax > 0, amax, 1.0))[1] - 1
    shared = np.where(amax > 0, e - emax_elem, 0)  # an all-zero block: scale 1 (byte 127)
    scale_bytes = np.where(nan, 0xFF, shared + 127).astype(np.uint8)
    v = blocks / np.ldexp(1.0, shared)[..., None]
    top = float(ml_dtypes.finfo(native).max)
    v = np.clip(np.nan_to_num(v), -top, top)  # saturate
    bits = ml_dtypes.finfo(native).bits
    codes = v.astype(native).view(np.uint8) & ((1 << bits) - 1)
    return codes.reshape(x.shape), scale_bytes


def _mx_data(seed: int, rows: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 96)) * np.exp2(rng.integers(-30, 30, (rows, 3, 1))).repeat(
        32, axis=-1
    ).reshape(rows, 96)
    x[0, :32] = 0.0  # an all-zero block
    x[1, :32] = 2.0 ** np.arange(-15, 17)  # amax an exact power of two
    x[1, 32:64] = -3.0  # a constant block
    x[2, 64:96] = np.linspace(-1, 1, 32) * 1e-20  # a tiny block beside normal ones
    return x.astype(np.float32)


def _codes(enc) -> np.ndarray:
    fmt = enc.format
    if fmt.packed:
        return np.asarray(unpack(enc.data, fmt.code_bits, enc.shape[-1], signed=False))
    return np.asarray(enc.data).view(np.uint8)


@pytest.mark.parametrize("fmt", MX_FLOATS, ids=lambda f: f.name)
def test_mx_codes_and_e8m0_bytes_follow_the_ocp_rules(fmt, eager_and_jit):
    native = element_type(fmt)
    emax_elem = emax_of(native)
    assert fmt.emax == emax_elem
    assert fmt.scaling.size == 32
    x = _mx_data(len(fmt.name))
    enc = eager_and_jit(fmt.encode)(x)
    assert enc.scale.dtype == ml_dtypes.float8_e8m0fnu
    codes, scale_bytes = mx_reference(x, native, emax_elem)
    np.testing.assert_array_equal(np.asarray(enc.scale).view(np.uint8), scale_bytes)
    np.testing.assert_array_equal(_codes(enc), codes)
    # decode: element value times 2**(byte - 127)
    elems = _element_values(codes, native)
    want = elems * np.ldexp(1.0, scale_bytes.astype(np.int64) - 127).repeat(32, axis=-1)
    np.testing.assert_array_equal(np.asarray(enc.decode()), want.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(eager_and_jit(fmt.round)(x)), want.astype(np.float32))


def _element_values(codes: np.ndarray, native) -> np.ndarray:
    return codes.astype(np.uint8).view(native).astype(np.float64)


@pytest.mark.parametrize("fmt", registry(mx), ids=lambda f: f.name)
def test_mx_block_with_nan_gets_scale_0xff(fmt):
    x = _mx_data(3)
    x[4, 40] = np.nan
    enc = jax.jit(fmt.encode)(x)  # eagerly, NaN is refused (NonFiniteError)
    scale_bytes = np.asarray(enc.scale).view(np.uint8)
    assert scale_bytes[4, 1] == 0xFF
    assert (np.delete(scale_bytes.ravel(), 4 * 3 + 1) != 0xFF).all()
    out = np.asarray(enc.decode())
    assert np.isnan(out[4, 32:64]).all()
    assert not np.isnan(np.delete(out, np.s_[32:64], axis=1)).any()
    with pytest.raises(dtypes.NonFiniteError):
        fmt.encode(x)


@pytest.mark.parametrize("fmt", registry(mx_int), ids=lambda f: f.name)
def test_mxint8_follows_the_ocp_rules(fmt, eager_and_jit):
    frac = fmt.bits - 2  # MXINT8: code / 2**6
    top = 2 ** (fmt.bits - 1) - 1  # symmetric: ±127
    x = _mx_data(11)
    enc = eager_and_jit(fmt.encode)(x)
    blocks = x.astype(np.float64).reshape(6, 3, 32)
    amax = np.abs(blocks).max(-1)
    e = np.frexp(np.where(amax > 0, amax, 1.0))[1] - 1
    # emax_elem = 0 for INT8; an all-zero block keeps code scale 1 (X = 2**6, byte 133)
    shared = np.where(amax > 0, e, frac)
    np.testing.assert_array_equal(np.asarray(enc.scale).view(np.uint8), shared + 127)
    # elements: V / X on the 2**-6 grid, nearest-even, within ±127/64 (symmetric)
    q = np.clip(np.round(blocks / np.ldexp(1.0, shared)[..., None] * 2**frac), -top, top)
    np.testing.assert_array_equal(np.asarray(enc.data), q.reshape(x.shape).astype(np.int8))
    want = q * np.ldexp(1.0, shared - frac)[..., None]
    np.testing.assert_array_equal(
        np.asarray(enc.decode()), want.reshape(x.shape).astype(np.float32)
    )


# -- NVFP4 --------------------------------------------------------------------


def nvfp4_reference(x: np.ndarray, fmt):
    """(element codes, e4m3 scales, float32 tensor scale, decoded values) of float32 `x`.

    NVFP4's numbers come from the element type (`top`: 6 for e2m1) and e4m3 (448), both
    read from ml_dtypes, and the block size of `fmt`'s scaling (16).
    """
    f32 = np.float32
    native = element_type(fmt)
    top = f32(ml_dtypes.finfo(native).max)
    s_max = f32(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
    size = fmt.scaling.size
    # scaled encodings read float32 subnormal inputs as (signed) zero (docs/formats.md)
    x = np.where(np.abs(x) < f32(2.0**-126), x * f32(0), x).astype(f32)
    amax_t = f32(np.abs(x).max())
    with np.errstate(over="ignore"):
        g = f32(1) if amax_t == 0 else f32(f32(s_max * top) / amax_t)  # tensor encoding scale
    g = min(g, f32(2.0**126))  # refinement: the tensor scale 1/g is a normal float32
    blocks = x.reshape(*x.shape[:-1], -1, size)
    amax_b = np.abs(blocks).max(-1).astype(f32)
    # the block's decoding scale, to 24 significant bits even below 2**-126 (refinement),
    # times g rounded once (an exact float64 product)
    shift = np.where(amax_b < top * f32(2.0**-126), f32(2.0**24), f32(1))
    dec_b = ((amax_b * shift) / top).astype(f32)
    q = (dec_b.astype(np.float64) * np.float64(g) / shift).astype(f32)
    s8 = np.minimum(q, s_max).astype(ml_dtypes.float8_e4m3fn)
    s32 = s8.astype(f32)
    # refinement: a nonzero block scale times the tensor scale is at least 2**-126 (the
    # smallest e4m3 value that keeps it so, found on the enumerated e4m3 grid)
    lo = f32(2.0**-126) * g
    grid = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    grid = grid[np.isfinite(grid.astype(f32)) & (grid.astype(f32) >= lo)]
    floor = grid[np.argmin(grid.astype(f32))]
    s8 = np.where((s32 > 0) & (s32 < lo), floor, s8).astype(ml_dtypes.float8_e4m3fn)
    s32 = s8.astype(f32)
    with np.errstate(divide="ignore"):
        enc_b = np.where(s32 > 0, (g / np.where(s32 > 0, s32, f32(1))).astype(f32), f32(0))
    y = (blocks * enc_b[..., None]).astype(f32)
    y = np.clip(y, -top, top)
    codes = y.astype(native)
    tensor_scale = f32(f32(1) / g)
    per_block = (s32 * tensor_scale).astype(f32)
    values = (codes.astype(f32) * per_block[..., None]).astype(f32)
    return (
        (codes.view(np.uint8) & ((1 << fmt.bits) - 1)).reshape(x.shape),
        s8,
        tensor_scale,
        values.reshape(x.shape),
    )


TWO_LEVEL = registry(two_level)


@functools.cache
def _shared_jit(f):
    """One `jax.jit` per function: a format's bound `encode`/`round` is equal from call to
    call, so the seeds and magnitudes below (one shape) reuse one compiled program, where
    a fresh `jax.jit` per case compiled the same program again."""
    return jax.jit(f)


def _run(eager_and_jit, f):
    return _shared_jit(f) if eager_and_jit is jax.jit else f


@pytest.mark.parametrize("fmt", TWO_LEVEL, ids=lambda f: f.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nvfp4_follows_the_published_recipe(fmt, seed, eager_and_jit):
    size = fmt.scaling.size
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 64 // size, size)) * np.exp2(
        rng.integers(-6, 6, (4, 64 // size, 1))
    )
    x = x.reshape(4, 64)
    x[0, :size] = 0.0
    x = x.astype(np.float32)
    enc = _run(eager_and_jit, fmt.encode)(x)
    codes, s8, tensor_scale, values = nvfp4_reference(x, fmt)
    assert enc.scale.dtype == ml_dtypes.float8_e4m3fn
    assert enc.tensor_scale.dtype == np.float32
    assert enc.tensor_scale.shape == ()
    np.testing.assert_array_equal(np.asarray(enc.scale).view(np.uint8), s8.view(np.uint8))
    assert np.float32(enc.tensor_scale) == tensor_scale
    np.testing.assert_array_equal(_codes(enc), codes)
    np.testing.assert_array_equal(np.asarray(enc.decode()), values)
    np.testing.assert_array_equal(np.asarray(_run(eager_and_jit, fmt.round)(x)), values)


@pytest.mark.parametrize("fmt", TWO_LEVEL, ids=lambda f: f.name)
@pytest.mark.parametrize("magnitude", [1e-36, 1e-37, 3e-35, 1e-33, 1e-30, 1e30])
def test_nvfp4_tiny_and_huge_tensors_keep_normal_scales(fmt, magnitude, eager_and_jit):
    """A tensor whose absmax is near the bottom of float32 keeps its values (its scales are
    normal float32 numbers, as everywhere in dtypes), bit for bit as the reference."""
    size = fmt.scaling.size
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 64)) * magnitude).astype(np.float32)
    x[1, size : 2 * size] *= np.float32(2.0**-10)  # a block far below the others
    enc = _run(eager_and_jit, fmt.encode)(x)
    codes, s8, tensor_scale, values = nvfp4_reference(x, fmt)
    assert np.float32(enc.tensor_scale) == tensor_scale >= np.float32(2.0**-126)
    np.testing.assert_array_equal(np.asarray(enc.scale).view(np.uint8), s8.view(np.uint8))
    np.testing.assert_array_equal(_codes(enc), codes)
    np.testing.assert_array_equal(np.asarray(enc.decode()), values)
    # the values survive: NVFP4's relative error per block, not zeros
    assert np.count_nonzero(values) > 0.8 * x.size
    big = np.abs(x) > np.abs(x).max() / 4
    assert np.all(np.abs(values[big] - x[big]) <= 0.5 * np.abs(x[big]))


@pytest.mark.parametrize("fmt", TWO_LEVEL, ids=lambda f: f.name)
def test_nvfp4_block_scales_reach_every_e4m3_code_and_midpoint(fmt, eager_and_jit):
    """Every positive e4m3 value as a block scale, subnormals included, and every midpoint
    between two of them (a tie, settled to the even code), with the float32 values on
    either side of each midpoint: with a block whose absmax is 448 * top the tensor
    encoding scale is 1, so a block whose absmax is `top * t` asks for the e4m3 scale of
    `t` itself. Bit for bit the reference's scales, codes and values."""
    f32 = np.float32
    top = f32(ml_dtypes.finfo(element_type(fmt)).max)
    size = fmt.scaling.size
    grid = np.arange(1, 0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(f32)
    mids = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(f32)
    with np.errstate(over="ignore"):
        near = np.concatenate([np.nextafter(mids, f32(0)), np.nextafter(mids, f32(np.inf))])
    targets = np.concatenate([grid, mids, near, [f32(2.0**-10), f32(3 * 2.0**-11)]])
    amax = (targets * top).astype(f32)
    assert np.all(amax / top == targets)  # exact: `top * t / top` is `t`
    rng = np.random.default_rng(5)
    blocks = rng.uniform(-1, 1, (len(amax) + 1, size)).astype(f32)
    blocks[:-1] *= amax[:, None]
    blocks[:-1, 0] = amax  # the block's absmax, exactly
    blocks[-1] = 0
    blocks[-1, 0] = f32(448) * top  # the tensor's absmax: g = 1
    blocks = np.concatenate([blocks, np.zeros((-len(blocks) % 4, size), f32)])
    x = blocks.reshape(-1, 4 * size)
    enc = _run(eager_and_jit, fmt.encode)(x)
    codes, s8, tensor_scale, values = nvfp4_reference(x, fmt)
    assert tensor_scale == 1
    np.testing.assert_array_equal(np.asarray(enc.scale).view(np.uint8), s8.view(np.uint8))
    assert np.float32(enc.tensor_scale) == tensor_scale
    np.testing.assert_array_equal(_codes(enc), codes)
    np.testing.assert_array_equal(np.asarray(enc.decode()), values)


@pytest.mark.parametrize("fmt", TWO_LEVEL, ids=lambda f: f.name)
def test_nvfp4_all_zero_tensor(fmt):
    enc = fmt.encode(np.zeros((2, fmt.scaling.size), np.float32))
    assert float(enc.tensor_scale) == 1.0
    np.testing.assert_array_equal(np.asarray(enc.decode()), 0.0)


# -- bytes per value ----------------------------------------------------------

SHAPE = (64, 1024)
N = math.prod(SHAPE)


@pytest.mark.parametrize(
    ("fmt", "scaling", "bits_per_value", "extra_bytes"),
    [
        (ENC["mxfp4"], None, 4.25, 0),
        (ENC["mxfp8_e4m3"], None, 8.25, 0),
        (ENC["mxfp8_e5m2"], None, 8.25, 0),
        (ENC["mxfp6_e3m2"], None, 6.25, 0),
        (ENC["mxfp6_e2m3"], None, 6.25, 0),
        (ENC["mxint8"], None, 8.25, 0),
        (ENC["nvfp4"], None, 4.5, 4),
        (ENC["nf4"], None, 4.5, 0),  # a float32 absmax per 64
        (dtypes.int4, PerBlock(128, scale_format="bfloat16"), 4.125, 0),
        (dtypes.int4, PerBlock(128, scale_format="float16"), 4.125, 0),
        (dtypes.int4, PerBlock(128), 4.25, 0),
        (ENC["float6_e3m2fn"], None, 6.0, 0),
    ],
    ids=lambda v: getattr(v, "name", None),
)
def test_bytes_per_value(fmt, scaling, bits_per_value, extra_bytes):
    # (the table is the published footprints; test_bytes_of_every_composition_are_listed
    # keeps a row for every registry entry carrying a scaling)
    assert fmt.nbytes(SHAPE, scaling) == N * bits_per_value / 8 + extra_bytes
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    assert fmt.encode(x, scaling=scaling).nbytes == fmt.nbytes(SHAPE, scaling)


def test_bytes_of_every_composition_are_listed():
    listed = {f.name for f in params_of(test_bytes_per_value)}
    owned = [f.name for f in dtypes.REGISTRY.values() if getattr(f, "scaling", None)]
    assert [n for n in owned if n not in listed] == []


# -- scale formats ------------------------------------------------------------


def multibit_int(f) -> bool:
    """Integer elements scaled by absmax/qmax (int1's mean has no such scale; an encoding
    with a scaling of its own has its rule above)."""
    return f.kind == "int" and f.scaling is None and not f.binary


# Under jit every integer takes both scale formats. An eager encode runs the same kernel
# (a jitted one, which an outer jit inlines), its scale rounding included: in CI int4
# (packed codes) runs it eagerly for each scale format, every integer under hunt. The
# eager `round` below runs for every integer in both variants.
_NARROW_SCALE_RUNS = sample(
    [
        (how, fmt, scale_format)
        for fmt in registry(multibit_int)
        for scale_format in ("bfloat16", "float16")
        for how in ("eager", "jit")
    ],
    lambda run: run[0] == "jit" or run[1].name == "int4",
)


@pytest.mark.parametrize(
    ("how", "fmt", "scale_format"),
    _NARROW_SCALE_RUNS,
    ids=[f"{h}-{f.name}-{s}" for h, f, s in _NARROW_SCALE_RUNS],
)
def test_narrow_scales_are_rounded_then_used(how, fmt, scale_format):
    eager_and_jit = jax.jit if how == "jit" else (lambda f: f)
    native = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[scale_format]
    x = np.random.default_rng(5).standard_normal((3, 256)).astype(np.float32)
    scaling = PerBlock(128, scale_format=scale_format)
    enc = eager_and_jit(lambda v: fmt.encode(v, scaling=scaling))(x)
    assert enc.scale.dtype == native
    # reference: float32 absmax / qmax, rounded nearest-even into the scale format
    amax = np.abs(x.reshape(3, 2, 128)).max(-1)
    s = (amax / np.float32(fmt.qmax)).astype(np.float32).astype(native)
    np.testing.assert_array_equal(np.asarray(enc.scale).view(np.uint16), s.view(np.uint16))
    inv = (np.float32(1) / s.astype(np.float32)).astype(np.float32)
    y = (x.reshape(3, 2, 128) * inv[..., None]).astype(np.float32)
    q = np.clip(np.round(y), -fmt.qmax, fmt.qmax)
    want = (q * s.astype(np.float32)[..., None]).reshape(x.shape).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(enc.decode()), want)
    np.testing.assert_array_equal(np.asarray(fmt.round(x, scaling=scaling)), want)


def takes_power_of_two_blocks(f) -> bool:
    """An unscaled entry that takes power-of-two block scales: floats below float32's
    exponent range and multi-bit integers (int1's mean, code books and zero points have
    no power-of-two rule; E8M0 takes no scaling)."""
    if f.kind == "float":
        return f.scaling is None and f.exponent_bits < 8
    return multibit_int(f)


def _e8m0_scaled() -> list:
    """`takes_power_of_two_blocks` entries; outside the hunt profile the narrowest of each
    element kind and packing (the E8M0 byte sees the scale, never the element grid)."""
    chosen = registry(takes_power_of_two_blocks)
    if HUNT:
        return chosen
    first: dict = {}
    for f in sorted(chosen, key=lambda f: f.bits):
        first.setdefault((f.kind, f.packed), f)
    return [f for f in chosen if f in first.values()]


def test_e8m0_scales_change_bytes_not_values():
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    for fmt in _e8m0_scaled():
        wide = fmt.encode(x, scaling=PerBlock(32, power_of_two=True))
        narrow = fmt.encode(x, scaling=PerBlock(32, power_of_two=True, scale_format="e8m0"))
        np.testing.assert_array_equal(np.asarray(wide.decode()), np.asarray(narrow.decode()))
        assert wide.nbytes - narrow.nbytes == 3 * 4 * 2


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"scale_format": "float8_e8m0fnu"}, "power_of_two=True"),
        ({"scale_format": "float8_e4m3fn", "power_of_two": True}, "two-level"),
        ({"scale_format": "int8"}, "choose one of"),
    ],
)
def test_bad_scale_formats_are_refused(kwargs, says):
    with pytest.raises(dtypes.ScalingError, match=says):
        PerBlock(32, **kwargs)


def test_compositions_are_formats_with_their_scaling():
    mxfp4, nvfp4 = dtypes.get("mxfp4"), dtypes.get("nvfp4")
    e2m1 = dtypes.get("float4_e2m1fn")
    assert mxfp4 != e2m1
    assert nvfp4 != mxfp4
    assert mxfp4.default_scaling() == PerBlock(32, power_of_two=True, scale_format="float8_e8m0fnu")
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    a = e2m1.encode(x, scaling=mxfp4.scaling)
    b = mxfp4.encode(x)
    np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    np.testing.assert_array_equal(np.asarray(a.decode()), np.asarray(b.decode()))


# -- hypothesis strategies of precision.testing --------------------------------


@given(data=st.data())
def test_strategies_draw_the_named_formats_and_scale_formats(data):
    from precision.testing import formats, scalings

    fmt = data.draw(formats(kinds=("float", "int"), include_named=True, max_bits=16))
    scaling = data.draw(scalings(fmt, ndim=2, scale_formats=dtypes.SCALE_FORMATS))
    if scaling is None:
        return
    assert scaling.scale_format in dtypes.SCALE_FORMATS
    if scaling.scale_format == "float8_e8m0fnu":
        assert scaling.power_of_two
    # nbytes: the packed codes plus the scales at their width (+4 for two levels)
    shape = (3, 64)
    count = math.prod(scaling.scale_shape(shape))
    width = np.dtype(
        {
            "float32": np.float32,
            "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
            "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
            "bfloat16": ml_dtypes.bfloat16,
            "float16": np.float16,
        }[scaling.scale_format]
    ).itemsize
    data_bytes = 3 * -(-64 * fmt.code_bits // 8)
    extra = 4 if scaling.scale_format == "float8_e4m3fn" else 0
    assert fmt.nbytes(shape, scaling) == data_bytes + count * width + extra


def test_named_formats_are_drawn():
    from precision.testing import formats

    seen: set[str] = set()

    @given(formats(include_named=True, max_bits=8))
    def collect(fmt):
        seen.add(fmt.name)

    collect()
    assert seen & set(dtypes.ENCODINGS)


def test_the_per_format_tests_run_over_every_registry_entry_their_rule_admits():
    assert [dtypes.get(n) for n, _ in ML_LAYOUTS] == registry(byte_ml_layout)
    assert_covers(test_e8m0_matches_ml_dtypes, scale_format)
    assert_covers(test_mx_codes_and_e8m0_bytes_follow_the_ocp_rules, mx_float)
    assert_covers(test_mx_block_with_nan_gets_scale_0xff, mx)
    assert_covers(test_mxint8_follows_the_ocp_rules, mx_int)
    for test in (
        test_nvfp4_follows_the_published_recipe,
        test_nvfp4_tiny_and_huge_tensors_keep_normal_scales,
        test_nvfp4_all_zero_tensor,
    ):
        assert_covers(test, two_level)
    assert_covers(test_narrow_scales_are_rounded_then_used, multibit_int)
    # every scaled encoding of the registry is an MX or a two-level one, or a code book
    # (test_codebook.py), or carries no scaling of its own
    for f in dtypes.REGISTRY.values():
        if getattr(f, "scaling", None) is not None:
            assert mx(f) or two_level(f) or f.kind == "codebook", f.name
