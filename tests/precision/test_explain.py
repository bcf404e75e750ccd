"""`precision.explain`: each contraction's path, checked against the compiled program.

The compiled HLO is read here independently of `explain`'s own parser: the
number of `s8 x s8 -> s32` dots (or float dots, convolutions) in the
optimized text must equal the rows that claim them.
"""

from __future__ import annotations

import functools
import json
import re
import warnings

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dtypes
import precision
from precision import PrecisionFallbackWarning, Tensor
from precision._compute import _explain_notes


class Block(nn.Module):
    """A small transformer block: attention einsums, dense layers, norms, dropout."""

    d: int = 32

    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm()(x)
        q, k, v = (nn.Dense(self.d, name=n)(h) for n in "qkv")
        att = jax.nn.softmax(jnp.einsum("btd,bsd->bts", q, k) / 8.0, axis=-1)
        x = x + nn.Dense(self.d, name="o")(jnp.einsum("bts,bsd->btd", att, v))
        h = nn.Dropout(0.1, deterministic=True)(nn.LayerNorm()(x))
        return x + nn.Dense(self.d, name="down")(nn.gelu(nn.Dense(4 * self.d, name="up")(h)))


X = jnp.asarray(np.random.default_rng(0).standard_normal((2, 8, 32)).astype(np.float32))


@functools.cache
def _params():
    """Block's parameters, made on first use: not at import, which every xdist worker
    pays while collecting (an eager flax init, seconds)."""
    return Block().init(jax.random.key(0), X)


def _compiled_dots(f, *args):
    """(operand dtypes, result dtype) of every dot in the optimized HLO, read plainly."""
    text = jax.jit(f).lower(*args).compile().as_text()
    types = dict(re.findall(r"%?([\w.\-]+) = ([a-z0-9]+)\[", text))
    dots = []
    for _name, result, operands in re.findall(
        r"%?([\w.\-]+) = ([a-z0-9]+)\[[^ ]* dot\(([^)]*)\)", text
    ):
        dots.append((tuple(types[o.lstrip("%")] for o in operands.split(", ")), result))
    return dots


def test_every_dense_layer_and_attention_product_contracts_int8_codes():
    params = precision.to_reduced_precision(_params(), "int8", where="kernel")
    report = precision.explain(Block().apply, params, X, contract="int8")
    assert len(report.rows) == 8  # q, k, v, two attention products, o, up, down
    for row in report.rows:
        assert row.op == "dot_general"
        assert row.compiled, row
        assert all(re.fullmatch(r"s8\[.*\] x s8\[.*\] -> s32\[.*\]", c) for c in row.compiled)
        assert row.fallback is None
    # the compiled program, read independently, has exactly these integer dots
    run = precision.apply(Block().apply, contract="int8")
    dots = _compiled_dots(run, params, X)
    assert sum(d == (("s8", "s8"), "s32") for d in dots) == 8
    assert sum(len(r.compiled) for r in report.rows) == 8
    # the weights are stored int8: their bytes are counted as held
    dense = [r for r in report.rows if "storage" in r.operands[1]]
    assert len(dense) == 6
    assert all(r.stored_bytes[1] > 0 for r in dense)


def test_int4_storage_under_bfloat16_compute_is_decoded_at_each_dense_layer():
    params = precision.to_reduced_precision(_params(), "int4", where="kernel")
    report = precision.explain(Block().apply, params, X, compute="bfloat16")
    dense = [r for r in report.rows if "int4 storage" in r.operands[1]]
    assert len(dense) == 6
    for row in dense:
        assert "int4 decoded at use into bfloat16" in row.path
        assert row.fallback is None
    text = str(report)
    assert text.count("int4 decoded at use into bfloat16") == 6
    assert f"{report.held_bytes:,} B held" in text


def test_convolutions_and_equinox_layers_get_rows():
    conv = nn.Conv(8, (3, 3))
    images = jnp.ones((2, 8, 8, 3))
    cparams = precision.to_reduced_precision(conv.init(jax.random.key(1), images), "int8")
    report = precision.explain(conv.apply, cparams, images)
    assert [r.op for r in report.rows] == ["conv_general_dilated"]
    assert report.rows[0].flops == 2 * 2 * 8 * 8 * 8 * (3 * 3 * 3)
    assert "int8 decoded at use into float32" in report.rows[0].path
    assert len(report.rows[0].compiled) == 1
    assert "f32[3,3,3,8]" in report.rows[0].compiled[0]

    mlp = eqx.nn.MLP(16, 4, 32, depth=3, key=jax.random.key(2))
    qmlp = precision.to_reduced_precision(mlp, "int8", where=lambda path, leaf: leaf.ndim == 2)
    report = precision.explain(lambda m, x: m(x), qmlp, jnp.ones(16))
    assert len(report.rows) == 4  # depth 3: four linear layers
    assert all("int8 storage" in r.operands[0] for r in report.rows)


def test_a_declared_path_that_cannot_happen_is_a_fallback_row_and_a_warning():
    w = Tensor(np.ones((64, 8), np.float32))
    contract = precision.Contract("float8_e4m3fn", scaling="mx")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        report = precision.explain(lambda x, w: x @ w, jnp.ones((4, 64)), w, contract=contract)
    assert report.fallbacks == report.rows
    assert "MX blocks" in report.rows[0].fallback
    assert "FALLBACK" in str(report)
    assert any(issubclass(s.category, PrecisionFallbackWarning) for s in seen)
    # no dot was given fp8 operands: the compiled one is float32
    assert report.rows[0].compiled == ("f32[4,64] x f32[64,8] -> f32[4,8]",)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's widening of f8 dots")
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_an_fp8_dot_the_cpu_widens_is_said_apart_from_a_fallback(scaling):
    """The library emits f8 x f8; XLA:CPU compiles it with float32 operands. The numbers
    are as declared, so it is no fallback (no warning, `strict` accepts it), but the row
    says the narrow kernel does not run here."""
    contract = precision.Contract("float8_e4m3fn", scaling=scaling)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionFallbackWarning)
        report = precision.explain(lambda x, w: x @ w, jnp.ones((4, 64)), jnp.ones((64, 8)),
                                   contract=contract)  # fmt: skip
        precision.apply(lambda x, w: x @ w, contract=contract, strict=True)(
            jnp.ones((4, 64)), jnp.ones((64, 8))
        )
    (row,) = report.rows
    assert row.fallback is None
    assert row.compiled == ("f32[4,64] x f32[64,8] -> f32[4,8]",)
    assert "float8_e4m3fn x float8_e4m3fn dot with float32 operands" in row.widened
    assert "WIDENED" in str(report)
    # an int8 dot runs as emitted on the CPU: nothing to say
    (int8,) = precision.explain(
        lambda x, w: x @ w, jnp.ones((4, 64)), jnp.ones((64, 8)), contract="int8"
    ).rows
    assert int8.widened is None
    # nor when the library itself chose float32 operands (a bfloat16 Tensor @ Tensor on CPU)
    a = Tensor(np.ones((4, 64), np.float32)).to_reduced_precision("bfloat16")
    (bf16,) = precision.explain(lambda a, b: a @ b, a, a.T).rows
    assert bf16.widened is None


@pytest.mark.parametrize("name", ["float8_e4m3fn", "int8"])
def test_a_weight_a_gpu_would_transpose_before_its_gemm_is_named(name):
    """A stored weight contracted along its first dim (`x @ w`, w stored (in, out)) runs
    behind a transpose on a GPU: the row says so and how to store it; stored (out, in)
    and contracted as `x @ w.T`, nothing to say. fp8 without fast accumulation is named."""
    x = jnp.ones((4, 64))
    w_in_out = Tensor(np.ones((64, 8), np.float32)).to_reduced_precision(
        name, scaling=dtypes.PerAxis(1)
    )
    w_out_in = Tensor(np.ones((8, 64), np.float32)).to_reduced_precision(
        name, scaling=dtypes.PerAxis(0)
    )
    contract = precision.Contract(name, scaling="rowwise")
    (row,) = precision.explain(lambda x, w: x @ w, x, w_in_out, contract=contract).rows
    assert "operand b (64, 8) is stored with its summed dim(s) [0] not last" in row.gpu
    assert "x @ w.T" in row.gpu
    (row,) = precision.explain(lambda x, w: x @ w.T, x, w_out_in, contract=contract).rows
    assert row.gpu is None
    assert row.operands[1] == f"{name} storage, per-axis 0, transposed [1, 0]"
    if name != "int8":
        off = precision.Contract(name, scaling="rowwise", fast_accumulation=False)
        (row,) = precision.explain(lambda x, w: x @ w.T, x, w_out_in, contract=off).rows
        assert row.gpu == "fast accumulation is off (`Contract(fast_accumulation=False)`)"
        assert "GPU       fast accumulation is off" in str(
            precision.explain(lambda x, w: x @ w.T, x, w_out_in, contract=off)
        )


def test_the_report_is_json_and_nothing_records_outside_explain():
    w = Tensor(np.ones((16, 8), np.float32)).to_reduced_precision("int8")
    report = precision.explain(lambda x, w: x @ w, jnp.ones((4, 16)), w, contract="int8")
    data = json.loads(report.to_json())
    assert data["backend"] == jax.default_backend()
    assert data["rows"][0]["compiled"] == ["s8[4,16] x s8[16,8] -> s32[4,8]"]
    assert (
        data["rows"][0]["where"].startswith(__file__.rsplit("/", 1)[-1])
        or __file__ in (data["rows"][0]["where"])
    )
    assert _explain_notes._NOTES.get() is None
    plain = jax.jit(precision.apply(lambda x, w: x @ w, contract="int8"))
    text = plain.lower(jnp.ones((4, 16)), w).compile().as_text()
    assert _explain_notes.SCOPE not in text  # no name scopes outside explain


@pytest.mark.parametrize("order", ["explain first", "run first"])
def test_explain_and_running_do_not_disturb_each_other(order):
    w = Tensor(np.ones((16, 8), np.float32)).to_reduced_precision("int8")
    f = precision.apply(lambda x, w: x @ w, contract="int8")
    x = jnp.ones((4, 16))
    if order == "run first":
        first = f(x, w)
    report = precision.explain(lambda x, w: x @ w, x, w, contract="int8")
    out = f(x, w)
    assert len(report.rows) == 1
    if order == "run first":
        np.testing.assert_array_equal(np.asarray(first), np.asarray(out))


def _sqnr(ref, approx):
    """SQNR in dB computed here, in float64, from the definition."""
    ref, approx = np.asarray(ref, np.float64), np.asarray(approx, np.float64)
    return 10 * np.log10(np.sum(ref**2) / np.sum((ref - approx) ** 2))


def test_measured_error_is_each_contractions_sqnr_against_the_float32_model():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    w1 = (rng.standard_normal((64, 48)) / 8).astype(np.float32)
    w2 = (rng.standard_normal((48, 16)) / 7).astype(np.float32)
    q1, q2 = (Tensor(w).to_reduced_precision("int4") for w in (w1, w2))

    def mlp(x, a, b):
        return jax.nn.relu(x @ a) @ b

    report = precision.explain(mlp, x, q1, q2, contract="int8", measure_error=(x, w1, w2))
    run = precision.apply(mlp, contract="int8")
    hidden = precision.apply(lambda x, a: x @ a, contract="int8")(x, q1)
    out = run(x, q1, q2)
    # references: numpy on the original float weights
    ref_hidden = x.astype(np.float64) @ w1
    ref_out = np.maximum(ref_hidden, 0) @ w2
    assert report.rows[0].sqnr_db == pytest.approx(_sqnr(ref_hidden, hidden), abs=0.05)
    assert report.rows[1].sqnr_db == pytest.approx(_sqnr(ref_out, out), abs=0.05)
    assert report.output_sqnr_db == pytest.approx(_sqnr(ref_out, out), abs=0.05)
    assert report.rows[1].relative_error == pytest.approx(
        np.linalg.norm(np.asarray(out) - ref_out) / np.linalg.norm(ref_out), rel=0.01
    )
    assert 10 < report.output_sqnr_db < 40  # int4 weights, int8 activations: visible error
    assert "error     SQNR" in str(report)
    assert "outputs: SQNR" in str(report)


def test_measured_error_against_the_decoded_weights_is_the_compute_paths_alone():
    w = Tensor(np.random.default_rng(4).standard_normal((64, 32)).astype(np.float32))
    x = jnp.asarray(np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32))
    q = w.to_reduced_precision("int4")
    exact = precision.explain(lambda x, w: x @ w, x, q, measure_error=True)
    assert exact.rows[0].sqnr_db == np.inf
    assert exact.rows[0].relative_error == 0.0
    rounded = precision.explain(lambda x, w: x @ w, x, q, compute="bfloat16", measure_error=True)
    assert 30 < rounded.rows[0].sqnr_db < 80  # bfloat16 rounding of the activations


def test_a_contraction_in_scan_is_measured_over_every_step():
    w = Tensor(np.eye(8, dtype=np.float32) * 0.5).to_reduced_precision("int8")

    def loop(x, w):
        return jax.lax.scan(lambda h, _: (h @ w, None), x, None, length=5)[0]

    with _explain_notes.recording(capture=True) as notes:
        jax.block_until_ready(jax.jit(precision.apply(loop))(jnp.ones((2, 8)), w))
    jax.effects_barrier()
    assert len(notes) == 1
    assert len(notes[0].outputs) == 5
    np.testing.assert_array_equal(notes[0].outputs[-1], np.full((2, 8), 0.5**5, np.float32))
    report = precision.explain(loop, jnp.ones((2, 8)), w, measure_error=True)
    assert report.rows[0].sqnr_db == np.inf


def test_a_reference_of_another_structure_and_bad_flags_are_refused():
    w = Tensor(np.ones((16, 8), np.float32)).to_reduced_precision("int8")
    x = jnp.ones((4, 16))
    with pytest.raises(precision.ExplainError, match="1 float32 argument"):
        precision.explain(lambda x, w: x @ w, x, w, measure_error=(jnp.ones((4, 16)),))
    other = (jnp.ones((4, 16)), jnp.ones((16, 3)))  # another output shape
    with pytest.raises(precision.ExplainError, match="contraction"):
        precision.explain(lambda x, w: x @ w, x, w, measure_error=other)
    with pytest.raises(precision.ExplainError, match="measure_error"):
        precision.explain(lambda x, w: x @ w, x, w, measure_error="yes")
    with pytest.raises(precision.ExplainError, match="measure="):
        precision.explain(lambda x, w: x @ w, x, w, measure=1)


def test_a_batched_integer_dot_whose_metadata_xla_dropped_is_still_found():
    # XLA:CPU rewrites this batched s8 dot and drops its op_name: matched by its FLOPs
    q = jnp.ones((1, 64, 4, 16))
    f = lambda q, k: jnp.einsum("bqhd,bkhd->bhqk", q, k)
    report = precision.explain(f, q, q, contract="int8")
    assert report.rows[0].compiled == ("s8[4,64,16] x s8[4,64,16] -> s32[4,64,64]",)
    assert (
        sum(
            d == (("s8", "s8"), "s32")
            for d in _compiled_dots(precision.apply(f, contract="int8"), q, q)
        )
        == 1
    )


def test_a_contraction_in_scan_counts_once_per_iteration():
    """8 stacked layers under `lax.scan` do the FLOPs of the same 8 layers unrolled."""
    ws, x = jnp.ones((8, 256, 256)), jnp.ones((512, 256))

    def scanned(ws, x):
        return jax.lax.scan(lambda h, w: (h @ w, None), x, ws)[0]

    def unrolled(ws, x):
        for i in range(8):
            x = x @ ws[i]
        return x

    want = 8 * 2 * 512 * 256 * 256
    for f in (scanned, unrolled):
        report = precision.explain(f, ws, x)
        assert sum(r.flops for r in report.rows) == want, f.__name__
        assert sum(report.flops_by_type.values()) == want, f.__name__


def test_nested_loops_multiply_their_trip_counts():
    def f(ws, x):
        def outer(h, w):
            inner = jax.lax.fori_loop(0, 3, lambda _, h: h @ w, h)
            return inner, None

        return jax.lax.scan(outer, x, ws)[0]

    ws, x = jnp.ones((4, 64, 64)), jnp.ones((32, 64))
    report = precision.explain(f, ws, x)
    assert sum(report.flops_by_type.values()) == 4 * 3 * 2 * 32 * 64 * 64
