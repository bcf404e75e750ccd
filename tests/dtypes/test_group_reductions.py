"""Per-group reductions against numpy: the absmax every scale starts from, and the
integer extremes the zero-point formats use, at shapes that exercise every stage.

XLA:CPU reduces the groups in stages (at most 32 consecutive elements of the last
axis at a time, or 8 rows across a kept last axis, zero-padded where a length does
not divide); the result must be numpy's whatever the shape, the axis or the block,
with NaN and ±inf anywhere and subnormals read as zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dtypes
from dtypes import _per_group

SHAPES_AND_SCALINGS = [
    ((7,), dtypes.PerTensor()),
    ((4096,), dtypes.PerTensor()),
    ((3, 1000), dtypes.PerTensor()),
    ((33, 65), dtypes.PerTensor()),
    ((64, 1024), dtypes.PerAxis(0)),
    ((64, 1000), dtypes.PerAxis(0)),
    ((100, 48), dtypes.PerAxis(1)),
    ((37, 70), dtypes.PerAxis(-1)),
    ((5, 33, 96), dtypes.PerAxis(0)),
    ((5, 33, 96), dtypes.PerAxis(1)),
    ((5, 33, 96), dtypes.PerAxis((0, 2))),
    ((6, 100), dtypes.PerBlock(32)),
    ((6, 1024), dtypes.PerBlock(128)),
    ((6, 1000), dtypes.PerBlock(256)),
    ((96, 20), dtypes.PerBlock(16, axis=0)),
    ((4, 9, 40), dtypes.PerBlock(32, axis=1)),
    ((2, 5000), dtypes.PerBlock(4096)),
]

_IDS = [f"{shape}-{scaling}" for shape, scaling in SHAPES_AND_SCALINGS]


def _values(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    x = (rng.standard_normal(n) * np.exp2(rng.uniform(-126, 126, n))).astype(np.float32)
    special = np.float32([np.nan, -np.nan, np.inf, -np.inf, 1e-40, -1e-40, 0.0, -0.0, 3.4e38])
    for _ in range(seed % 4):  # none, or a few of them in random places
        x[rng.integers(0, n)] = rng.choice(special)
    if seed % 5 == 4:
        x[:] = rng.choice(np.float32([1e-40, -3e-39, 0.0, -0.0]), n)  # all subnormal or zero
    if seed >= 5:  # increasing in memory order: each group's largest is its last element
        x = np.arange(1, n + 1, dtype=np.float32) * np.float32(-1 if seed % 2 else 1)
    if seed == 7:  # and a NaN at the very end, where a stage pads
        x[-1] = np.nan
    return x.reshape(shape)


def _groups(x: np.ndarray, scaling: dtypes.Scaling) -> np.ndarray:
    """`x` as (groups..., members) in numpy, groups in the scale array's order."""
    shape = x.shape
    scale_shape = scaling.scale_shape(shape)
    if isinstance(scaling, dtypes.PerBlock):
        a = scaling.axis % x.ndim
        size = min(scaling.size, shape[a])
        nblocks = scale_shape[a]
        pad = nblocks * size - shape[a]
        widths = [(0, 0)] * x.ndim
        widths[a] = (0, pad)
        xp = np.pad(x, widths)  # zero padding: changes no absmax, and 0 is among the extremes
        xp = xp.reshape((*shape[:a], nblocks, size, *shape[a + 1 :]))
        return np.moveaxis(xp, a + 1, -1).reshape((*scale_shape, size))
    kept = list(scaling.kept(x.ndim)) if isinstance(scaling, dtypes.PerAxis) else []
    summed = [d for d in range(x.ndim) if d not in kept]
    moved = np.transpose(x, kept + summed)
    flat = moved.reshape([shape[d] for d in kept] + [-1])
    out_shape = [scale_shape[d] for d in range(x.ndim)]
    return flat.reshape((*out_shape, flat.shape[-1]))


def _absmax_reference(x: np.ndarray, scaling: dtypes.Scaling) -> np.ndarray:
    g = _groups(x, scaling).astype(np.float64)
    bad = ~np.isfinite(g).all(axis=-1)
    mag = np.abs(np.where(np.isfinite(g), g, 0))
    mag = np.where(mag < 2.0**-126, 0, mag)  # subnormals read as zero
    top = mag.max(axis=-1, initial=0.0)
    return np.where(bad, np.nan, top).astype(np.float32)


@pytest.mark.parametrize(("shape", "scaling"), SHAPES_AND_SCALINGS, ids=_IDS)
def test_group_absmax_is_numpys(shape, scaling):
    f = jax.jit(lambda x: _per_group.group_absmax(x, scaling))
    for seed in range(8):
        x = _values(shape, seed)
        got = np.asarray(f(jnp.asarray(x)))
        want = _absmax_reference(x, scaling)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}")


@pytest.mark.parametrize(("shape", "scaling"), SHAPES_AND_SCALINGS, ids=_IDS)
def test_group_extremes_are_numpys(shape, scaling):
    """Signed integer keys, min and max with 0 among them, in both forms: the staged
    one XLA:CPU runs and the single reduction other platforms run."""
    rng = np.random.default_rng(3)
    keys = rng.integers(-(2**31) + 1, 2**31 - 1, shape, dtype=np.int64).astype(np.int32)
    g = _groups(keys, scaling)
    for reduce, ref in ((jnp.max, np.max), (jnp.min, np.min)):
        want = ref(g, axis=-1, initial=0)
        got = jax.jit(lambda k, r=reduce: _per_group.group_extreme(k, scaling, r))(keys)
        np.testing.assert_array_equal(np.asarray(got), want)
        direct = jax.jit(
            lambda k, r=reduce: scaling.group_reduce(
                k, lambda a, axes: r(a, axis=axes, keepdims=True, initial=jnp.int32(0))
            )
        )(keys)
        np.testing.assert_array_equal(np.asarray(direct), want)


def test_an_empty_group_has_absmax_zero():
    x = jnp.zeros((3, 0), jnp.float32)
    got = jax.jit(lambda x: _per_group.group_absmax(x, dtypes.PerAxis(0)))(x)
    np.testing.assert_array_equal(np.asarray(got), np.zeros((3, 1), np.float32))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's fusion decisions")
@pytest.mark.parametrize(
    ("name", "scaling"),
    [
        ("int8", dtypes.PerAxis(0)),
        ("int8", dtypes.PerBlock(32)),
        ("int4", dtypes.PerBlock(32)),
        ("int2", dtypes.PerBlock(32)),
        ("uint4", dtypes.PerBlock(32)),
        ("float8_e4m3fn", dtypes.PerAxis(0)),
        ("mxfp8_e4m3", None),
        ("nvfp4", None),
        ("int8", dtypes.PerAxis(0, scale_format="bfloat16")),
    ],
    ids=str,
)
@pytest.mark.parametrize("op", ["encode", "round"])
def test_the_elementwise_pass_reads_per_group_values_made_once(name, scaling, op):
    """A group's scale and reciprocal (a correctly rounded division each) are made once
    per group, inside a conditional no kernel fuses into (`dtypes.computed_once`):
    every kernel of the compiled program that reads the input besides its absmax
    reads its per-group values from a conditional's result, not from a fusion that
    XLA:CPU would have folded into the pass and repeated for every element."""
    x = jnp.ones((256, 1024), jnp.float32)
    fmt = dtypes.get(name)
    kw = {} if scaling is None else {"scaling": scaling}
    text = jax.jit(lambda v: getattr(fmt, op)(v, **kw)).lower(x).compile().as_text()
    entry = text[text.index("\nENTRY ") :].splitlines()[1:]
    made = {}
    for line in entry:
        if " = " in line:
            lhs, rhs = line.strip().split(" = ", 1)
            made[lhs.removeprefix("ROOT ")] = rhs
    (param,) = [n for n, rhs in made.items() if " parameter(0)" in rhs]
    readers = [rhs for rhs in made.values() if " fusion(" in rhs and f"{param}," in rhs + ","]

    def from_conditional(operand: str) -> bool:
        rhs = made.get(operand, "")
        if " conditional(" in rhs or " parameter(" in rhs or " constant(" in rhs:
            return True
        inner = rhs.split("get-tuple-element(", 1)
        return len(inner) == 2 and " conditional(" in made.get(inner[1].split(")")[0], "")

    for rhs in readers:
        operands = rhs.split(" fusion(", 1)[1].split(")", 1)[0].split(", ")
        if operands == [param]:
            continue  # the absmax reduction, or a pass of the input alone
        loose = [o for o in operands if o != param and not from_conditional(o)]
        assert not loose, (rhs[:200], [made[o][:120] for o in loose])


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's fusion decisions")
@pytest.mark.parametrize(
    ("name", "scaling"),
    [
        ("int8", dtypes.PerAxis(0)),
        ("int4", dtypes.PerAxis(0)),
        ("int8", dtypes.PerAxis(1)),
        ("float8_e4m3fn", dtypes.PerAxis(0)),
    ],
    ids=str,
)
def test_the_stages_read_an_activation_once_and_the_scales_their_result(name, scaling):
    """Where a group's absmax is reduced in stages (`absmax_made_once`), the stages run in
    a conditional whose operand is the array itself: an activation computed just before
    (here ReLU(a * s) from int32 `a`) is written out once, by the fusion that computes
    it, and no reduction computes it again from `a` element by element. The last
    stage's result is the operand of the conditional that finishes the reduction and
    makes the scale, reciprocal and mask, instead of its copy through a reduce-window
    (the materialization of `_staged`) followed by the rest of the reduction and a
    conditional for each of the two calls that made values."""
    a = jnp.ones((256, 1024), jnp.int32)
    s = jnp.ones(dtypes.PerAxis(0 if scaling.axis else 1).scale_shape(a.shape), jnp.float32)
    fmt = dtypes.get(name)

    def activation_encoded(a, s):
        return fmt.encode(jnp.maximum(a.astype(jnp.float32) * s, 0), scaling=scaling)

    text = jax.jit(activation_encoded).lower(a, s).compile().as_text()
    entry = text[text.index("\nENTRY ") :].split("\n}\n", 1)[0]
    made = {}
    for line in entry.splitlines()[1:]:
        if " = " in line:
            lhs, rhs = line.strip().removeprefix("ROOT ").split(" = ", 1)
            made[lhs] = rhs
    (param,) = [
        lhs for lhs, rhs in made.items() if "s32[256,1024]" in rhs and "parameter(0)" in rhs
    ]
    conds = [lhs for lhs, rhs in made.items() if " conditional(" in rhs]
    assert len(conds) == 2, conds

    def taken_operand(cond):  # (the operand of the branch that runs: `computed_once`)
        return made[cond].split(" conditional(", 1)[1].split(")", 1)[0].split(", ")[2]

    stages, scales = conds if taken_operand(conds[1]) == conds[0] else conds[::-1]
    assert taken_operand(scales) == stages, made[scales]
    (activation,) = made[taken_operand(stages)].split(" tuple(", 1)[1].split(")", 1)[0].split(", ")
    assert " fusion(" in made[activation], made[activation]
    assert param in made[activation], made[activation]
    assert "reduce" not in activation, (activation, made[activation])
    # (an absmax stage gives magnitude bits: no kernel making them reads `a`)
    bits = [lhs for lhs, rhs in made.items() if rhs.startswith("u32[") and param in rhs]
    assert not bits, [made[b] for b in bits]
    assert not [lhs for lhs in made if "reduce-window" in lhs], sorted(made)


@pytest.mark.parametrize(
    "shape", [(256, 1024), (784, 1024), (2000, 1024), (3, 4099), (40, 33), (1, 70000)], ids=str
)
@pytest.mark.parametrize("axis", [0, 1])
def test_the_absmax_finished_in_the_conditional_gives_the_same_scales(shape, axis):
    """The scales made with the absmax's last stage inside the conditional are the
    numpy reference's: absmax / 127 per row or column, NaN for a group with NaN or inf,
    1 for a group of zeros and subnormals."""
    rng = np.random.default_rng(len(shape) + shape[0] + axis)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-60, 60, shape))).astype(np.float32)
    x.flat[rng.integers(0, x.size, 3)] = [np.nan, np.inf, -np.inf]
    if shape[0] > 2:
        x[1, :] = 0.0
        x[2, :] = 1e-40
    enc = jax.jit(lambda v: dtypes.get("int8").encode(v, scaling=dtypes.PerAxis(axis)))(
        jnp.asarray(x)
    )
    with np.errstate(invalid="ignore"):
        flushed = np.where(np.abs(x) < np.float32(2.0**-126), np.float32(0), x)
        amax = np.max(np.abs(flushed), axis=1 - axis, keepdims=True)
        bad = ~np.isfinite(flushed).all(axis=1 - axis, keepdims=True)
    want = np.where(bad, np.nan, np.where(amax == 0, np.float32(1), amax / np.float32(127)))
    np.testing.assert_array_equal(np.asarray(enc.scale), want.astype(np.float32))


@pytest.mark.parametrize(
    "scaling",
    [dtypes.PerTensor(), dtypes.PerAxis(0), dtypes.PerBlock(32)],
    ids=["tensor", "row", "block"],
)
def test_per_group_values_are_traced_once(scaling):
    """`absmax_made_once` asks its per-group function for its shapes, then `per_group`
    does, then `computed_once` traces it in the CPU's conditional and again for every
    other platform (`lax.platform_dependent` traces each branch): one Python trace
    serves them all (`traced_once`), so a model's first trace does not pay a correctly
    rounded division four times per quantized operand."""
    calls: list[tuple[int, ...]] = []

    def made(absmax: jax.Array) -> tuple[jax.Array, jax.Array]:
        calls.append(absmax.shape)
        return absmax * 2, absmax + 1

    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 128)), jnp.float32)
    jax.jit(lambda v: _per_group.absmax_made_once(v, scaling, made)).lower(x)
    assert len(calls) == 1, calls
    calls.clear()  # (shapes not seen above: a trace of the same function is reused)
    jax.jit(lambda v: _per_group.per_group(made, v)).lower(x[:3, :7])
    jax.jit(lambda v: dtypes.computed_once(made, v)).lower(x[:5, :9])
    assert calls == [(3, 7), (5, 9)], calls


def test_an_encode_traces_its_division_once_per_quantized_operand(monkeypatch):
    """The whole chain as an encode uses it: the scales' correctly rounded division is
    traced once per encode of a new shape (it was four times)."""
    from dtypes import _ieee, _scale_rules

    traced = []
    divide = _ieee.divide

    def counted(a, b):
        traced.append(1)
        return divide(a, b)

    monkeypatch.setattr(_scale_rules, "divide", counted)
    x = jnp.ones((48, 96), jnp.float32)
    jax.jit(lambda v: dtypes.get("int8").encode(v, scaling=dtypes.PerAxis(0))).lower(x)
    # (int8: one division for the scale, one for the reciprocal)
    assert len(traced) == 2, traced
