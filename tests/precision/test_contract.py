"""Declared quantization at the contraction: W8A8 and fp8 (`apply(f, contract=...)`).

References are built independently of the rule under test: the operands'
rows are laid out with numpy, encoded with `dtypes` (the documented scale
rule: absmax per row / per tensor / per MX block of 32), and contracted with
numpy (int64 dots of the codes, float64 sums of decoded values).
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import dtypes
import precision
from precision import Contract, Tensor
from precision._compute._operand_layouts import layouts
from precision._compute._quantized import quantize

rng = np.random.default_rng(7)
MX = dtypes.PerBlock(32, axis=-1, power_of_two=True, scale_format="float8_e8m0fnu")
ROW_SCALING = {"tensorwise": dtypes.PerTensor(), "rowwise": dtypes.PerAxis(0), "mx": MX}


def normal(*shape, scale=1.0):
    return (rng.normal(size=shape) * scale).astype(np.float32)


def int8_rows(m: np.ndarray):
    """int64 codes and float32 per-row scales of a (rows, summed) matrix (dtypes' rule)."""
    enc = dtypes.int8.encode(m, scaling=dtypes.PerAxis(0))
    return np.asarray(enc.data).astype(np.int64), np.asarray(enc.scale, np.float32)


def decoded_rows(m: np.ndarray, fmt, scaling: str) -> np.ndarray:
    enc = dtypes.get(fmt).encode(m, scaling=ROW_SCALING[scaling])
    return np.asarray(enc.decode(np.float32), np.float64)


def run_both(f, *args):
    """The result eagerly and under jit (they must agree bit for bit)."""
    eager = np.asarray(f(*args))
    jitted = np.asarray(jax.jit(f)(*args))
    np.testing.assert_array_equal(eager, jitted)
    return eager


# -- W8A8: integer codes, int32 accumulation, one rescale ---------------------


def test_w8a8_dot_general_with_batch_dims_matches_int64_reference():
    a, b = normal(3, 5, 16, scale=2.0), normal(3, 16, 4)
    dims = (((2,), (1,)), ((0,), (0,)))
    f = precision.apply(lambda a, b: lax.dot_general(a, b, dims), contract="int8")
    out = run_both(f, a, b)
    # rows: (batch, token) of a, (batch, column) of b; summed: the contracted dim
    ca, sa = int8_rows(a.reshape(15, 16))
    cb, sb = int8_rows(b.transpose(0, 2, 1).reshape(12, 16))
    acc = np.einsum("bik,bjk->bij", ca.reshape(3, 5, 16), cb.reshape(3, 4, 16))
    ref = (acc.astype(np.float32) * sa.reshape(3, 5, 1)) * sb.reshape(3, 1, 4)
    np.testing.assert_array_equal(out, ref)


_BATCHED = precision.apply(
    lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))), contract="int8"
)


@given(
    values=st.lists(
        st.floats(-1.0, 1.0, width=32),
        min_size=3 * 5 * 16 + 3 * 16 * 4,
        max_size=3 * 5 * 16 + 3 * 16 * 4,
    ),
    exponents=st.lists(st.integers(-40, 40), min_size=15 + 12, max_size=15 + 12),
)
def test_w8a8_is_bit_exact_over_magnitudes(values, exponents):
    # rows of very different magnitudes, zeros and exact ties included
    v = np.asarray(values, np.float32)
    e = np.exp2(np.asarray(exponents, np.float64)).astype(np.float32)
    a = v[: 3 * 5 * 16].reshape(3, 5, 16) * e[:15].reshape(3, 5, 1)
    b = v[3 * 5 * 16 :].reshape(3, 16, 4) * e[15:].reshape(3, 1, 4)
    out = np.asarray(_BATCHED(a, b))
    ca, sa = int8_rows(a.reshape(15, 16))
    cb, sb = int8_rows(b.transpose(0, 2, 1).reshape(12, 16))
    acc = np.einsum("bik,bjk->bij", ca.reshape(3, 5, 16), cb.reshape(3, 4, 16))
    ref = (acc.astype(np.float32) * sa.reshape(3, 5, 1)) * sb.reshape(3, 1, 4)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("which", ["scores", "values"])
def test_w8a8_einsum_attention_matches_int64_reference(which):
    if which == "scores":  # q k^T: both operands are activations, both per token
        q, k = normal(2, 6, 8), normal(2, 7, 8, scale=3.0)
        f = precision.apply(lambda q, k: jnp.einsum("bqd,bkd->bqk", q, k), contract="int8")
        out = run_both(f, q, k)
        cq, sq = int8_rows(q.reshape(12, 8))
        ck, sk = int8_rows(k.reshape(14, 8))
        acc = np.einsum("bqd,bkd->bqk", cq.reshape(2, 6, 8), ck.reshape(2, 7, 8))
        ref = (acc.astype(np.float32) * sq.reshape(2, 6, 1)) * sk.reshape(2, 1, 7)
    else:  # p v: probabilities per query row, values per feature column
        p, v = np.abs(normal(2, 6, 7)), normal(2, 7, 8)
        f = precision.apply(lambda p, v: jnp.einsum("bqk,bkd->bqd", p, v), contract="int8")
        out = run_both(f, p, v)
        cp, sp = int8_rows(p.reshape(12, 7))
        cv, sv = int8_rows(v.transpose(0, 2, 1).reshape(16, 7))
        acc = np.einsum("bqk,bdk->bqd", cp.reshape(2, 6, 7), cv.reshape(2, 8, 7))
        ref = (acc.astype(np.float32) * sp.reshape(2, 6, 1)) * sv.reshape(2, 1, 8)
    np.testing.assert_array_equal(out, ref)


def conv_int64(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """NHWC x HWIO, stride 1, SAME padding, exact integer sums."""
    kh, kw = k.shape[:2]
    padded = np.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
    n, h, w, _ = x.shape
    out = np.zeros((n, h, w, k.shape[3]), np.int64)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nhwc,co->nhwo", padded[:, i : i + h, j : j + w], k[i, j])
    return out


def test_w8a8_convolution_matches_int64_reference():
    x, k = normal(2, 5, 5, 3), normal(3, 3, 3, 4)

    def conv(x, k):
        return lax.conv_general_dilated(
            x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    out = run_both(precision.apply(conv, contract="int8"), x, k)
    # rows: one per image of the input, one per output channel of the kernel
    cx, sx = int8_rows(x.reshape(2, -1))
    ck, sk = int8_rows(k.transpose(3, 0, 1, 2).reshape(4, -1))
    acc = conv_int64(cx.reshape(x.shape), ck.reshape(4, 3, 3, 3).transpose(1, 2, 3, 0))
    ref = (acc.astype(np.float32) * sx.reshape(2, 1, 1, 1)) * sk.reshape(1, 1, 1, 4)
    np.testing.assert_array_equal(out, ref)


def test_w8a8_uses_stored_int8_codes_of_a_weight():
    x, w = normal(4, 16), normal(16, 8)
    wt = Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(1))
    enc = wt.encoded
    f = precision.apply(lambda x, w: x @ w, contract="int8")
    out = run_both(f, x, wt)
    result = f(x, wt)
    assert isinstance(result, Tensor)
    assert result.format.name == "float32"
    cx, sx = int8_rows(x)
    acc = cx @ np.asarray(enc.data).astype(np.int64)  # the stored codes, not re-quantized
    ref = (acc.astype(np.float32) * sx.reshape(4, 1)) * np.asarray(enc.scale).reshape(1, 8)
    np.testing.assert_array_equal(out, ref)


def test_w8a8_rescales_once_into_the_declared_compute_format():
    x, w = normal(4, 16), normal(16, 8)
    xt = Tensor(x).to_reduced_precision("bfloat16")
    out = precision.apply(lambda x, w: x @ w, compute="bfloat16", contract="int8")(xt, w)
    assert out.format.name == "bfloat16"
    cx, sx = int8_rows(np.asarray(xt))
    cw, sw = int8_rows(dtypes.bfloat16.round(w).T)  # float32 weights enter as bfloat16
    ref = ((cx @ cw.T).astype(np.float32) * sx.reshape(4, 1)) * sw.reshape(1, 8)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(dtypes.bfloat16.round(ref)))


def hlo_types(text: str) -> dict[str, str]:
    """Instruction name -> element type, from compiled HLO text."""
    return dict(re.findall(r"%([\w.\-]+) = (\w+)\[", text))


@pytest.mark.parametrize("weights", ["float32", "int8 storage"])
def test_w8a8_mlp_compiles_to_s8_dots_with_s32_accumulation(weights):
    x, w1, w2 = normal(16, 32), normal(32, 64), normal(64, 8)
    if weights != "float32":
        w1 = Tensor(w1).to_reduced_precision("int8", scaling=dtypes.PerAxis(1))
        w2 = Tensor(w2).to_reduced_precision("int8", scaling=dtypes.PerAxis(1))

    def mlp(x, w1, w2):
        return jax.nn.relu(x @ w1) @ w2

    f = precision.apply(mlp, contract="int8")
    text = jax.jit(f).lower(x, w1, w2).compile().as_text()
    types = hlo_types(text)
    dots = re.findall(r"= (\w+)\[[^\]]*\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)", text)
    assert len(dots) == 2, text
    for out_type, lhs, rhs in dots:
        assert out_type == "s32"
        assert types[lhs] == "s8"
        assert types[rhs] == "s8"
    assert not re.search(r"= f32\[[^\]]*\]\S* dot\(", text)


@pytest.mark.parametrize("weights", ["float32", "int8 storage"])
def test_w8a8_quantizes_a_transposed_weight_where_it_lies(weights):
    """`x @ w.T` (a tied embedding's logits, an (out, in) weight) quantizes `w` by its
    own rows: XLA fused the transpose into the quantization, whose reductions and
    writes then ran strided (1.2 s of a 1.5 s GPT-2 logits projection on a CPU, the
    s8 dot 63 ms). No array of the transposed shape is handed to XLA, and an int8
    weight stored per output channel reaches the dot as its codes."""
    n, k = 80, 48
    x, w = normal(8, k), normal(n, k)
    if weights == "float32":
        cw, sw = int8_rows(w)
    else:
        w = Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(0))
        cw, sw = np.asarray(w.encoded.data, np.int64), np.asarray(w.encoded.scale, np.float32)
    f = precision.apply(lambda x, w: x @ w.T, contract="int8")
    lowered = jax.jit(f).lower(x, w)
    assert f"{k}x{n}x" not in lowered.as_text(), "a transposed copy of the weight"
    if jax.default_backend() == "cpu":  # (a GPU may lay out its GEMM's operands itself)
        compiled = lowered.compile().as_text()
        entry = compiled[compiled.index("\nENTRY ") :]
        assert f"[{k},{n}]" not in compiled, entry
        if weights != "float32":  # not decoded, not re-quantized: the codes as stored
            assert not re.search(rf"= (?!s8)\w+\[{n},{k}\]", entry), entry
    cx, sx = int8_rows(x)
    ref = ((cx @ cw.T).astype(np.float32) * sx.reshape(8, 1)) * sw.reshape(1, n)
    np.testing.assert_array_equal(run_both(f, x, w), ref)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's fusion decisions")
@pytest.mark.parametrize(
    "contract",
    ["int8", Contract("float8_e4m3fn", backward="float8_e5m2")],
    ids=["w8a8", "fp8-hybrid"],
)
def test_a_training_step_encodes_each_operand_once(contract):
    """Differentiated, the codes feed the forward dot and the backward pass's decode.
    XLA:CPU fused the whole encode a second time into that decode (and, for fp8, into
    the dot's widening convert), reading the float32 weight again: now no fusion of the
    compiled step turns the weight into float32 values of its shape (its absmax and its
    encode read it; the decode reads the codes)."""
    k, n = 256, 128
    x, w = normal(64, k), normal(k, n)
    f = precision.apply(lambda x, w: jnp.sum(jnp.tanh(x @ w)), contract=contract)
    compiled = jax.jit(jax.grad(f, argnums=(0, 1))).lower(x, w).compile().as_text()
    entry = compiled[compiled.index("\nENTRY ") :]
    (weight,) = re.findall(rf"(%\S+) = f32\[{k},{n}\]\{{1,0\}} parameter\(1\)", entry)
    again = [
        line.strip()
        for line in entry.splitlines()
        if " fusion(" in line
        and re.search(re.escape(weight) + r"[,)]", line)
        and re.search(rf"= f32\[{k},{n}\]", line)
    ]
    assert not again, again


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's fusion decisions")
@pytest.mark.parametrize("stored", [False, True], ids=["float32-weights", "int8-weights"])
@pytest.mark.parametrize(
    "contract",
    ["int8", Contract("float8_e4m3fn"), Contract("float8_e4m3fn", scaling="rowwise")],
    ids=["w8a8", "fp8", "fp8-rowwise"],
)
def test_a_forward_makes_a_computed_activation_once(contract, stored):
    """An activation computed in the program (the previous layer's rescale and ReLU)
    feeds its absmax and its encode. XLA:CPU made it in both, reading the dot's result
    twice: now exactly one fusion of the compiled forward makes it at full size (the
    conditional's operand; the predicate reads one element)."""
    m, k, n = 64, 256, 128
    ws = (normal(k, n), normal(n, 32))
    if stored:
        ws = precision.to_reduced_precision(ws, "int8", scaling=dtypes.PerAxis(-1))
    f = precision.apply(lambda x, w: jax.nn.relu(x @ w[0]) @ w[1], contract=contract)
    compiled = jax.jit(f).lower(normal(m, k), ws).compile().as_text()
    bodies: dict[str, list[str]] = {}
    name = ""
    for line in compiled.splitlines():
        if line and not line.startswith(" "):
            name = line.split(" ")[0]
        elif name:
            bodies.setdefault(name, []).append(line)
    relu = rf"= f32\[{m},{n}\]\{{1,0\}} maximum\("
    makers = {c for c, lines in bodies.items() if any(re.search(relu, x) for x in lines)}
    calls = re.findall(r"= \w+\[([\d,]*)\]\S* fusion\(.*calls=(%[\w.\-]+)", compiled)
    full = [(shape, c) for shape, c in calls if c in makers and shape]
    assert len(full) == 1, full


@pytest.mark.parametrize(
    "contract",
    [
        "int8",
        Contract("float8_e4m3fn", backward="float8_e5m2"),
        Contract("int8", backward_operands="original"),
    ],
    ids=["w8a8", "fp8-hybrid", "original"],
)
def test_an_empty_batch_trains(contract):
    # No element to read the CPU conditional's predicate from: quantized as it is.
    x, w = np.zeros((0, 16), np.float32), normal(16, 8)
    f = precision.apply(lambda x, w: x @ w, contract=contract)
    out, vjp = jax.vjp(f, x, w)
    dx, dw = vjp(jnp.zeros(out.shape))
    assert out.shape == (0, 8)
    assert dx.shape == (0, 16)
    np.testing.assert_array_equal(dw, np.zeros((16, 8), np.float32))


@pytest.mark.parametrize(
    ("perm", "dims"),
    [
        ((1, 0), (((1,), (0,)), ((), ()))),
        ((2, 0, 1), (((1,), (0,)), ((), ()))),  # free dims keep their order in `w`
        ((2, 1, 0), (((1,), (0,)), ((), ()))),  # ... or not: then `w` moves as given
        ((0, 2, 1), (((2,), (1,)), ((0,), (0,)))),  # batched
        ((1, 2, 0), (((2,), (1,)), ((0,), (0,)))),  # batch dim moved
    ],
    ids=str,
)
def test_w8a8_of_transposed_operands_matches_int64_reference(perm, dims):
    """A transposed operand, taken where it lies with its dims moved, is quantized by
    the same rows (a gradient too: the straight-through one of the transposed value)."""
    (_, rc), (_, rb) = dims
    b_shape = {(1, 0): (16, 6), (2, 0, 1): (16, 3, 2), (2, 1, 0): (16, 3, 2)}.get(perm, (2, 16, 3))
    w = normal(*(b_shape[perm.index(d)] for d in range(len(perm))))
    a = normal(2, 5, 16) if rb else normal(5, 16)

    def product(a, w):
        return lax.dot_general(a, jnp.transpose(w, perm), dims)

    f = precision.apply(product, contract="int8")
    out = run_both(f, a, w)
    b = np.transpose(w, perm)  # reference rows of the operand as the dot sees it
    kept = [d for d in range(b.ndim) if d not in rc]
    rows_b = np.transpose(b, (*kept, *rc)).reshape(-1, 16)
    cb, sb = int8_rows(rows_b)
    ca, sa = int8_rows(a.reshape(-1, 16))
    if rb:  # (batch, token) x (batch, column)
        acc = np.einsum("bik,bjk->bij", ca.reshape(2, 5, 16), cb.reshape(2, 3, 16))
        ref = (acc.astype(np.float32) * sa.reshape(2, 5, 1)) * sb.reshape(2, 1, 3)
    else:
        acc = ca @ cb.T
        ref = ((acc.astype(np.float32) * sa.reshape(5, 1)) * sb.reshape(1, -1)).reshape(out.shape)
    np.testing.assert_array_equal(out, ref)
    g = normal(*out.shape)
    dw = jax.jit(jax.grad(lambda w: jnp.sum(f(a, w) * g)))(w)
    # the same product of the transposed array, as given: its gradient moved back
    given = precision.apply(lambda a, b: lax.dot_general(a, b, dims), contract="int8")
    db = jax.jit(jax.grad(lambda b: jnp.sum(given(a, b) * g)))(jnp.asarray(b))
    np.testing.assert_allclose(
        np.asarray(dw), np.transpose(np.asarray(db), np.argsort(perm)), rtol=1e-6, atol=1e-7
    )


# -- fp8: operands are dtypes encodings, float32 accumulation -----------------


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise", "mx"])
def test_fp8_operands_equal_dtypes_encodings(scaling):
    a, b = normal(2, 3, 64, scale=5.0), normal(64, 6)
    eqn = jax.make_jaxpr(lambda a, b: a @ b)(a, b).jaxpr.eqns[-1]
    la, lb = layouts(eqn, a.shape, b.shape)
    fmt = dtypes.float8_e4m3fn
    # b's rows are its columns: it is encoded in place, its codes and scales transposed
    for x, rows, layout, flip in ((a, a.reshape(6, 64), la, False), (b, b.T, lb, True)):
        got = quantize(jnp.asarray(x), layout, fmt, scaling)
        ref = fmt.encode(rows, scaling=ROW_SCALING[scaling])
        assert got.data.dtype == jnp.float8_e4m3fn
        codes, scales = np.asarray(got.data), np.asarray(got.scale)
        if flip:
            codes, scales = codes.T, scales.T
        # a's rows are a reshape of a itself (encoded in place per tensor)
        codes, scales = codes.reshape(ref.data.shape), scales.reshape(ref.scale.shape)
        np.testing.assert_array_equal(codes.view(np.uint8), np.asarray(ref.data).view(np.uint8))
        np.testing.assert_array_equal(scales, np.asarray(ref.scale))


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_fp8_codes_equal_dtypes_on_wide_ranges_and_edges(fmt, scaling):
    # magnitudes over 2**-100 .. 2**100, all-zero and subnormal rows, fp8 subnormals
    x = normal(48, 96) * np.exp2(rng.integers(-100, 100, (48, 1))).astype(np.float32)
    x[3] = 0.0
    x[5] = 1e-40
    x[8, :4] = [1e-38, 2e-39, -3e-41, 1.0]
    x[9, :3] = [448.0, 2.0**-9, 2.0**-10 * 1.5]
    eqn = jax.make_jaxpr(lambda a, b: a @ b)(x, x.T).jaxpr.eqns[-1]
    layout, _ = layouts(eqn, x.shape, x.T.shape)
    got = quantize(jnp.asarray(x), layout, dtypes.get(fmt), scaling)
    ref = dtypes.get(fmt).encode(x, scaling=ROW_SCALING[scaling])
    np.testing.assert_array_equal(
        np.asarray(got.data).view(np.uint8), np.asarray(ref.data).view(np.uint8)
    )
    np.testing.assert_array_equal(np.asarray(got.scale), np.asarray(ref.scale))


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise", "mx"])
def test_fp8_contraction_is_the_product_of_the_encodings(scaling):
    a, b = normal(2, 3, 64, scale=5.0), normal(64, 6)
    contract = Contract("float8_e4m3fn", scaling=scaling)
    f = precision.apply(lambda a, b: a @ b, contract=contract)
    if scaling == "mx":  # emulated, and said so (see the fallback tests below)
        with pytest.warns(precision.PrecisionFallbackWarning, match="MX blocks"):
            out = run_both(f, a, b)
    else:
        out = run_both(f, a, b)
    qa = decoded_rows(a.reshape(6, 64), "float8_e4m3fn", scaling)
    qb = decoded_rows(b.T, "float8_e4m3fn", scaling)
    ref = (qa @ qb.T).reshape(2, 3, 6)
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-5)
    # and the quantization is visible: the float32 product is further away
    assert np.abs(out - a @ b).max() > 100 * np.abs(out - ref).max()


def _dot_operand_types(text: str) -> list[tuple[str, str]]:
    """Element types of the two operands of every `dot_general` in lowered StableHLO."""
    found = []
    for line in text.splitlines():
        if "stablehlo.dot_general" not in line:
            continue
        types = re.findall(r"tensor<(?:[0-9x]*x)?([a-zA-Z0-9]+)>", line.split(":")[-1])
        found.append((types[0], types[1]))
    return found


_NARROW = [
    ("int8", "i8"),
    (Contract("int8", scaling="tensorwise"), "i8"),
    (Contract("float8_e4m3fn"), "f8E4M3FN"),
    (Contract("float8_e4m3fn", scaling="rowwise"), "f8E4M3FN"),
    (Contract("float8_e5m2"), "f8E5M2"),
]


@pytest.mark.parametrize(("contract", "operand"), _NARROW, ids=lambda c: str(c)[:40])
def test_declared_contractions_hand_the_dot_narrow_operands(contract, operand):
    """The dot itself takes s8 / f8 operands (scales applied to its result): no
    quantize -> dequantize round trip feeds a float dot, since XLA:GPU deletes such
    round trips where excess precision is allowed and computes in float32."""
    x, w = normal(4, 8, 32), normal(32, 16)
    w_int8 = Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(1))
    f = precision.apply(lambda a, b: a @ b, contract=contract)
    for rhs in (w, w_int8) if operand == "i8" else (w,):
        dots = _dot_operand_types(jax.jit(f).lower(x, rhs).as_text())
        assert dots == [(operand, operand)], dots
    # and under differentiation the forward dot is still the narrow one
    text = jax.jit(jax.value_and_grad(lambda a, b: f(a, b).sum())).lower(x, w).as_text()
    assert (operand, operand) in _dot_operand_types(text)


def _dot_shapes(text: str) -> list[str]:
    """The operand types of every `dot_general` in lowered StableHLO, as written."""
    return [
        line.split(":")[-1].split("->")[0].strip()
        for line in text.splitlines()
        if "stablehlo.dot_general" in line
    ]


@pytest.mark.parametrize("k", [7, 30])
def test_integer_dots_sum_a_multiple_of_four_codes(k):
    """XLA:GPU's s8 GEMM returned twice the product for a contracted length that is
    not a multiple of 4 (an H100, jax 0.11.2): the codes reach the dot padded with
    zero codes to one, on every backend, and the result is still the exact sum."""
    x, w = normal(2, 6, k), normal(k, 8)
    f = precision.apply(lambda a, b: a @ b, contract="int8")
    padded = -k % 4 + k
    shapes = _dot_shapes(jax.jit(f).lower(x, w).as_text())
    assert shapes == [f"(tensor<2x6x{padded}xi8>, tensor<{padded}x8xi8>)"], shapes
    cx, sx = int8_rows(x.reshape(12, k))
    cw, sw = int8_rows(w.T)
    ref = (cx @ cw.T).astype(np.float32) * sx.reshape(12, 1) * sw.reshape(1, 8)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(x, w)).reshape(12, 8), ref)
    # int8 Tensors, per tensor: their codes meet in the dot the same way
    a = Tensor(x).to_reduced_precision("int8", scaling=dtypes.PerTensor())
    b = Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerTensor())
    mm = jax.jit(precision.apply(lambda p, q: p @ q))
    assert _dot_shapes(mm.lower(a, b).as_text()) == shapes
    ca, cb = (np.asarray(t.encoded.data, np.int64) for t in (a, b))
    scales = np.float32(a.encoded.scale) * np.float32(b.encoded.scale)
    want = (ca @ cb).astype(np.float32) * scales
    np.testing.assert_allclose(np.asarray(mm(a, b)), want, rtol=2e-7)


# -- gradients ----------------------------------------------------------------


@pytest.mark.parametrize("backward", [None, "float8_e5m2"])
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_fp8_backward_cotangents_are_encoded_when_declared(backward, scaling):
    x, w, g = normal(4, 3, 32), normal(32, 16), normal(4, 3, 16, scale=1e-3)
    contract = Contract("float8_e4m3fn", backward=backward, scaling=scaling)
    f = precision.apply(lambda x, w: x @ w, contract=contract)
    # float32 products in full (a GPU's default for float32 dots is TF32's 10 bits)
    with jax.default_matmul_precision("highest"):
        _, vjp = jax.vjp(f, x, w)
        dx, dw = (np.asarray(t) for t in vjp(g))
    qx = decoded_rows(x.reshape(12, 32), "float8_e4m3fn", scaling)
    qw = decoded_rows(w.T, "float8_e4m3fn", scaling)  # (16, 32)
    rows = g.reshape(12, 16)
    qg = rows.astype(np.float64) if backward is None else decoded_rows(rows, backward, scaling)
    # straight-through: the cotangent meets the quantized forward operands
    np.testing.assert_allclose(dx, (qg @ qw).reshape(x.shape), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(dw, qx.T @ qg, rtol=1e-5, atol=1e-9)
    if backward is not None:
        unquantized = (rows.astype(np.float64) @ qw).reshape(x.shape)
        assert np.abs(dx - unquantized).max() > 1e-3 * np.abs(unquantized).max()


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "dims"),
    [
        ((6, 32), (16, 32), (((1,), (1,)), ((), ()))),  # x @ w.T: w summed on its last dim
        ((32, 6), (32, 16), (((0,), (0,)), ((), ()))),  # x.T @ w
        ((3, 5, 16), (3, 16, 4), (((2,), (1,)), ((0,), (0,)))),  # batched
        ((4, 2, 8, 3), (8, 4, 6), (((2,), (0,)), ((0,), (1,)))),  # a batch dim not first
        ((8, 4, 3), (6, 4, 8), (((0,), (2,)), ((1,), (1,)))),  # results put back by 3-cycles
    ],
    ids=["xwT", "xTw", "batched", "batch-inside", "cycled"],
)
def test_fp8_gradient_dots_per_tensor_take_the_codes_exactly(a_shape, b_shape, dims):
    # Per tensor, the gradient dots take the fp8 codes (the cotangent's e5m2 with each
    # operand's e4m3) for any dimension numbers: the same numbers as the cotangent and
    # the operands decoded by `dtypes` and contracted here in float64.
    a, b = normal(*a_shape), normal(*b_shape)
    contract = Contract("float8_e4m3fn", backward="float8_e5m2", scaling="tensorwise")
    f = precision.apply(lambda a, b: lax.dot_general(a, b, dims), contract=contract)
    out, vjp = jax.vjp(f, a, b)
    g = normal(*out.shape, scale=1e-2)
    da, db = (np.asarray(t, np.float64) for t in jax.jit(vjp)(g))

    def decoded(x, fmt):
        enc = dtypes.get(fmt).encode(x, scaling=dtypes.PerTensor())
        return np.asarray(enc.decode(np.float32), np.float64)

    qa, qb, qg = decoded(a, "float8_e4m3fn"), decoded(b, "float8_e4m3fn"), decoded(g, "float8_e5m2")
    # the dot as an einsum (numpy, float64): out = a·b, so da = g·b and db = a·g
    (lc, rc), (lb, rb) = dims
    letters = iter("abcdefghijklmnop")
    sa, sb = [""] * a.ndim, [""] * b.ndim
    for i, j in [*zip(lb, rb, strict=True), *zip(lc, rc, strict=True)]:
        sa[i] = sb[j] = next(letters)
    a_free = [i for i in range(a.ndim) if not sa[i]]
    b_free = [j for j in range(b.ndim) if not sb[j]]
    for i in a_free:
        sa[i] = next(letters)
    for j in b_free:
        sb[j] = next(letters)
    so = "".join([sa[i] for i in lb] + [sa[i] for i in a_free] + [sb[j] for j in b_free])
    sa, sb = "".join(sa), "".join(sb)
    np.testing.assert_allclose(np.einsum(f"{sa},{sb}->{so}", qa, qb), out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(da, np.einsum(f"{so},{sb}->{sa}", qg, qb), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(db, np.einsum(f"{sa},{so}->{sb}", qa, qg), rtol=1e-5, atol=1e-7)


def test_w8a8_gradients_are_straight_through_under_jit():
    x, w, g = normal(5, 16), normal(16, 8), normal(5, 8)
    f = precision.apply(lambda x, w: x @ w, contract="int8")
    with jax.default_matmul_precision("highest"):  # not a GPU's TF32 default
        dx, dw = jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w) * g), argnums=(0, 1)))(x, w)
    cx, sx = int8_rows(x)
    cw, sw = int8_rows(w.T)
    qx, qw = cx * sx.astype(np.float64), cw * sw.astype(np.float64)
    np.testing.assert_allclose(np.asarray(dx), g @ qw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(dw), qx.T @ g, rtol=1e-5, atol=1e-6)


def test_the_default_rule_decodes_each_operand_at_its_gradient_dot():
    """The backward dots of `contract="int8"` take the operands as quantized, decoded to
    float32 (`codes x scale`). Made where their dot uses them (on a CPU, inside a
    conditional on the cotangent), one decoded weight is alive at a time: a training
    step of six residual blocks holds at most about one more weight's worth of
    temporaries than Qwix's rule, which keeps the float32 operands instead. Scheduled
    freely, XLA decoded them all before the first backward dot (2.5 weights more here;
    in the peers benchmark's blocks 37 MB against 24, past the 32 MB above which glibc
    maps every call's temporaries afresh: 9,500 page faults a step)."""
    d = 128
    keys = iter(jax.random.split(jax.random.key(0), 12))
    params = [
        (
            jax.random.normal(next(keys), (d, 4 * d)) / 11,
            jax.random.normal(next(keys), (4 * d, d)) / 23,
        )
        for _ in range(6)
    ]
    x = jax.random.normal(jax.random.key(1), (32, d))

    def blocks(params, x):
        for w1, w2 in params:
            x = x + jax.nn.gelu(x @ w1) @ w2
        return x

    def temporaries(contract):
        f = precision.apply(blocks, contract=contract)
        step = jax.jit(jax.grad(lambda p, x: jnp.sum(f(p, x) ** 2)))
        return step.lower(params, x).compile().memory_analysis().temp_size_in_bytes

    weight = d * 4 * d * 4  # one decoded weight, float32
    ours = temporaries("int8")
    theirs = temporaries(Contract("int8", backward_operands="original"))
    assert ours <= theirs + 1.5 * weight, (ours, theirs, weight)


def test_each_operand_is_traced_once_for_the_function_and_its_forward_pass(monkeypatch):
    """JAX traces a custom VJP's function and its forward pass apart, and their traces
    do not share its cache: the quantization of each operand, the costliest part of a
    trace, is traced for the first and replayed for the second (`_quantized`), so a
    model's first step takes about half the time to trace. Shapes no other test uses:
    an encode of a shape seen before is not traced again at all."""
    from dtypes import _int_codec

    traced: list[tuple[int, ...]] = []
    int_codes = _int_codec._int_codes

    def counted(fmt, x, *args, **kwargs):
        traced.append(tuple(x.shape))
        return int_codes(fmt, x, *args, **kwargs)

    monkeypatch.setattr(_int_codec, "_int_codes", counted)
    w = jnp.ones((37, 29), jnp.float32)
    x = jnp.ones((13, 37), jnp.float32)
    f = precision.apply(lambda w, x: jnp.tanh(x @ w), contract="int8")
    jax.jit(jax.grad(lambda w, x: jnp.sum(f(w, x)))).lower(w, x)
    assert sorted(traced) == [(13, 37), (37, 29)], traced


# -- the no-mixing rule, and declarations ------------------------------------


def test_contract_without_compute_keeps_the_no_mixing_rule():
    x = Tensor(normal(4, 16)).to_reduced_precision("bfloat16")
    w8 = Tensor(normal(16, 8)).to_reduced_precision("int8")
    f = precision.apply(lambda x, w: x @ w, contract="int8")
    with pytest.raises(precision.PrecisionMismatchError, match=r'compute="bfloat16"'):
        f(x, w8)
    with pytest.raises(precision.PrecisionMismatchError, match="bfloat16"):
        f(x, normal(16, 8))  # a raw float32 array meets a bfloat16 tensor
    declared = precision.apply(lambda x, w: x @ w, compute="bfloat16", contract="int8")
    assert declared(x, w8).format.name == "bfloat16"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"forward": "bfloat16"}, ValueError, "at most 8 bits"),
        ({"forward": "int1"}, ValueError, "symmetric integer"),
        ({"forward": "mxfp8"}, ValueError, "its own scaling"),
        ({"forward": "int8", "scaling": "blockwise"}, ValueError, "tensorwise, rowwise, mx"),
        ({"forward": "float8_e4m3fn", "backward": "float16"}, ValueError, "backward"),
        ({"forward": "nope"}, ValueError, "nope"),
        ({"forward": "int8", "backward_operands": "float"}, ValueError, "'quantized', 'original'"),
    ],
)
def test_contract_refuses_what_it_cannot_do(kwargs, error, match):
    with pytest.raises(error, match=match):
        Contract(**kwargs)


def test_apply_refuses_a_contract_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"precision\.Contract"):
        precision.apply(jnp.dot, contract=8)


def test_contract_shorthand_and_defaults():
    assert Contract("int8") == Contract(dtypes.int8, scaling="rowwise")
    assert Contract("e4m3").scaling == "tensorwise"
    assert Contract("e4m3", backward="e5m2").backward == dtypes.float8_e5m2
    assert Contract("int8").backward_operands == "quantized"
    assert Contract("int8", backward_operands="original").describe() == (
        "int8 forward, rowwise scales, original operands backward"
    )


@pytest.mark.parametrize(
    "contract",
    [
        Contract("int8", backward_operands="original"),
        Contract("float8_e4m3fn", scaling="rowwise", backward_operands="original"),
        Contract("float8_e4m3fn", backward="float8_e5m2", backward_operands="original"),
    ],
    ids=["int8", "fp8-rowwise", "fp8-e5m2-cotangent"],
)
def test_original_backward_operands_meet_the_cotangent_as_given(contract):
    # The forward is the declared contraction's, bit for bit; the backward contracts
    # the cotangent (quantized to `backward` when declared) with the operands as
    # given: under jit, plain JAX's gradient of the float product, bit for bit.
    x, w, g = normal(6, 32), normal(32, 16), normal(6, 16)
    default = dataclasses.replace(contract, backward_operands="quantized")
    f = precision.apply(lambda x, w: x @ w, contract=contract)
    np.testing.assert_array_equal(
        f(x, w), precision.apply(lambda x, w: x @ w, contract=default)(x, w)
    )
    if contract.backward is not None:
        enc = contract.backward.encode(g, scaling=dtypes.PerTensor())
        g_in = np.asarray(enc.decode(np.float32))  # the cotangent as the contraction sees it
    else:
        g_in = g
    ours = jax.jit(lambda x, w, g: jax.vjp(f, x, w)[1](g))(x, w, g)
    plain = jax.jit(lambda x, w, g: jax.vjp(jnp.matmul, x, w)[1](g))(x, w, g_in)
    for a, b in zip(ours, plain, strict=True):
        np.testing.assert_array_equal(a, b)
    f_q = precision.apply(lambda x, w: x @ w, contract=default)
    dq = jax.jit(lambda x, w, g: jax.vjp(f_q, x, w)[1](g))(x, w, g)
    assert not np.array_equal(dq[0], ours[0])  # the default is another rule


@pytest.mark.parametrize("name", ["int4", "int2"])
def test_narrower_integer_contractions_are_exact_sums_of_their_codes(name):
    # packed formats: their codes are unpacked for the dot (this crashed before)
    x, w = normal(5, 30, scale=3.0), normal(30, 8)
    out = run_both(precision.apply(lambda a, b: a @ b, contract=name), x, w)
    fmt = dtypes.get(name)
    rows = []
    for m in (x, w.T):
        enc = fmt.encode(m, scaling=dtypes.PerAxis(0))
        scale = np.asarray(enc.scale, np.float32)
        rows.append((np.rint(np.asarray(enc.decode()) / scale).astype(np.int64), scale))
    (cx, sx), (cw, sw) = rows
    assert np.abs(cx).max() <= fmt.qmax
    ref = ((cx @ cw.T).astype(np.float32) * sx.reshape(5, 1)) * sw.reshape(1, 8)
    np.testing.assert_array_equal(out, ref)


# -- no silent fallback --------------------------------------------------------


def _planted_fallback(x, w):
    return jnp.tanh(x @ w)  # the contraction the warning must point at


@pytest.mark.parametrize(
    ("contract", "reason"),
    [
        (Contract("float8_e4m3fn", scaling="mx"), "MX blocks"),
        (Contract("float4_e2m1fn"), "no dot for float4_e2m1fn"),
        (Contract("float8_e4m3fn", scaling="mx", backward="float8_e5m2"), "MX blocks"),
    ],
    ids=["mx", "fp4", "mx-backward"],
)
def test_a_declared_contraction_without_a_narrow_path_warns_once_with_its_line(contract, reason):
    x, w = normal(4, 64), normal(64, 8)
    f = precision.apply(_planted_fallback, contract=contract)
    line = _planted_fallback.__code__.co_firstlineno + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # as a user sees warnings: once per place
        for _ in range(3):
            f(x, w)
        jax.jit(f)(x, w)
        f(x[:2], w)  # a new shape: traced again, same call site
    fallbacks = [c for c in caught if c.category is precision.PrecisionFallbackWarning]
    assert len(fallbacks) == 1, [str(c.message) for c in caught]
    warning = fallbacks[0]
    assert warning.filename == __file__
    assert warning.lineno == line
    message = str(warning.message)
    assert reason in message
    assert "dot_general" in message
    assert contract.describe() in message
    # strict: the same contraction raises, naming the same place, before anything runs
    strict = precision.apply(_planted_fallback, contract=contract, strict=True)
    with pytest.raises(precision.PrecisionFallbackError, match=f"test_contract.py:{line}"):
        strict(x, w)


@pytest.mark.parametrize(
    "contract",
    ["int8", "int4", Contract("float8_e4m3fn"), Contract("float8_e5m2", scaling="rowwise")],
    ids=str,
)
def test_narrow_contractions_neither_warn_nor_raise_under_strict(contract):
    x, w = normal(4, 64), normal(64, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision.apply(_planted_fallback, contract=contract)(x, w)
        precision.apply(_planted_fallback, contract=contract, strict=True)(x, w)


def test_strict_must_be_a_bool():
    with pytest.raises(precision.PrecisionError, match="strict"):
        precision.apply(jnp.sin, strict="yes")
