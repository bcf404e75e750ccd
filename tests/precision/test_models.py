"""Real models on quantized weights: storage decoded at use, compute declared at the call.

Acceptance tests of docs/design.md §4 ("Storage and compute", "The rule: no silent
mixing", "Op semantics") on four small models with random weights: a Flax
linen GPT-2-style decoder (causal mask, LayerNorm, dropout with a typed key,
tied embedding), a ResNet-style CNN with BatchNorm (train and eval), a Flax
NNX module with `nnx.Rngs`, and an Equinox attention model vmapped over a
batch. Each runs with weights stored in three recipes (int8 per output
channel, int4 in blocks of 32, float8_e4m3fn per tensor), norms, biases and
batch statistics kept float32.

Every expected value comes from plain JAX or numpy on the decoded weights
(and the decoded weights themselves are checked against a numpy
quantization written from docs/design.md §2), never from `precision` itself.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import dtypes
import precision
from precision import Tensor

nn = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")
eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")

# Norm parameters, biases and BatchNorm statistics stay float32 (the usual
# weight-only deployment); everything else is stored in the recipe's format.
EXCLUDE = "bias|norm|scale|ln|LayerNorm|BatchNorm|mean|var"

# (format, scaling factory of the output-channel axis): the three recipes.
RECIPES = {
    "int8-per-axis": ("int8", lambda out_axis: dtypes.PerAxis(out_axis)),
    "int4-per-block32": ("int4", lambda out_axis: dtypes.PerBlock(32)),
    "fp8-per-tensor": ("float8_e4m3fn", lambda out_axis: dtypes.PerTensor()),
}
QAT_RECIPES = ["int8-per-axis", "fp8-per-tensor"]


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def _np(tree: Any) -> Any:
    """Logical values of every leaf (Tensors included) as numpy arrays."""
    return jax.tree.map(np.asarray, tree, is_leaf=_is_tensor)


def _flat(tree: Any) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def _cosine(a: Any, b: Any) -> float:
    a, b = _flat(a), _flat(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


# --------------------------------------------------------------------- models


class _Block(nn.Module):
    d: int
    heads: int
    rate: float = 0.1

    @nn.compact
    def __call__(self, x, mask, deterministic):
        b, t, _ = x.shape
        h = nn.LayerNorm(name="ln_1")(x)
        q, k, v = jnp.split(nn.Dense(3 * self.d, name="c_attn")(h), 3, axis=-1)
        split = lambda a: a.reshape(b, t, self.heads, self.d // self.heads)
        a = nn.dot_product_attention(
            split(q),
            split(k),
            split(v),
            mask=mask,
            dropout_rng=None if deterministic else self.make_rng("dropout"),
            dropout_rate=self.rate,
            deterministic=deterministic,
        )
        a = nn.Dense(self.d, name="c_proj")(a.reshape(b, t, self.d))
        x = x + nn.Dropout(self.rate)(a, deterministic=deterministic)
        h = nn.Dense(4 * self.d, name="c_fc")(nn.LayerNorm(name="ln_2")(x))
        h = nn.Dense(self.d, name="c_out")(nn.gelu(h))
        return x + nn.Dropout(self.rate)(h, deterministic=deterministic)


class GPT(nn.Module):
    """GPT-2 style: token + position embedding, pre-norm blocks, tied output embedding."""

    vocab: int = 128
    d: int = 64
    heads: int = 4
    layers: int = 2
    context: int = 16

    @nn.compact
    def __call__(self, tokens, deterministic=True):
        t = tokens.shape[1]
        wte = nn.Embed(self.vocab, self.d, name="wte")
        wpe = self.param("wpe", nn.initializers.normal(0.02), (self.context, self.d))
        x = wte(tokens) + wpe[None, :t]
        x = nn.Dropout(0.1)(x, deterministic=deterministic)
        mask = nn.make_causal_mask(tokens)
        for i in range(self.layers):
            x = _Block(self.d, self.heads, name=f"h_{i}")(x, mask, deterministic)
        return wte.attend(nn.LayerNorm(name="ln_f")(x))


class _ResBlock(nn.Module):
    channels: int
    strides: int = 1

    @nn.compact
    def __call__(self, x, train):
        norm = lambda name: nn.BatchNorm(use_running_average=not train, momentum=0.9, name=name)
        y = nn.Conv(self.channels, (3, 3), self.strides, use_bias=False, name="conv1")(x)
        y = nn.relu(norm("bn1")(y))
        y = norm("bn2")(nn.Conv(self.channels, (3, 3), use_bias=False, name="conv2")(y))
        if x.shape != y.shape:
            proj = nn.Conv(self.channels, (1, 1), self.strides, use_bias=False, name="proj")
            x = norm("bn_proj")(proj(x))
        return nn.relu(x + y)


class ResNet(nn.Module):
    """ResNet-18 in miniature: a stem and two residual blocks with BatchNorm."""

    @nn.compact
    def __call__(self, x, train=False):
        x = nn.Conv(16, (3, 3), use_bias=False, name="stem")(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, name="bn_stem")(x))
        x = _ResBlock(16, name="block1")(x, train)
        x = _ResBlock(32, 2, name="block2")(x, train)
        return nn.Dense(10, name="head")(jnp.mean(x, axis=(1, 2)))


class NNXNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(32, 64, rngs=rngs)
        self.ln = nnx.LayerNorm(64, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.fc2 = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x, deterministic=True):
        h = self.drop(nnx.gelu(self.ln(self.fc1(x))), deterministic=deterministic)
        return self.fc2(h)


class EqxNet(eqx.Module):
    ln: eqx.nn.LayerNorm
    mha: eqx.nn.MultiheadAttention
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.ln = eqx.nn.LayerNorm(32)
        self.mha = eqx.nn.MultiheadAttention(4, 32, key=k1)
        self.head = eqx.nn.Linear(32, 10, key=k2)

    def __call__(self, x):
        h = jax.vmap(self.ln)(x)
        t = x.shape[0]
        h = x + self.mha(h, h, h, mask=jnp.tril(jnp.ones((t, t), bool)))
        return jax.vmap(self.head)(h)


@dataclasses.dataclass
class Case:
    """A model as a pure function `fn(params, extra, x)`.

    `params` is the differentiable tree, `extra` the rest of the model's
    state (batch statistics, NNX RNG streams, or None), `x` the input batch
    and `labels` the targets of a cross-entropy loss on `logits(fn(...))`.
    """

    fn: Callable
    params: Any
    extra: Any
    x: jax.Array
    labels: jax.Array
    out_axis: int  # the output-channel axis of the weight layout
    logits: Callable = lambda out: out
    causal: bool = False  # outputs at position i depend on inputs at positions <= i


def _gpt() -> Case:
    model = GPT()
    tokens = jax.random.randint(jax.random.key(1), (8, 16), 0, 128)
    params = model.init(jax.random.key(0), tokens)
    labels = jax.random.randint(jax.random.key(2), (8, 16), 0, 128)
    return Case(lambda p, e, x: model.apply(p, x), params, None, tokens, labels, -1, causal=True)


def _resnet() -> Case:
    model = ResNet()
    x = jax.random.normal(jax.random.key(1), (32, 8, 8, 3))
    variables = model.init(jax.random.key(0), x)

    def train_step(p, stats, x):
        return model.apply(
            {"params": p, "batch_stats": stats}, x, train=True, mutable=["batch_stats"]
        )

    labels = jax.random.randint(jax.random.key(2), (32,), 0, 10)
    return Case(
        train_step,
        variables["params"],
        variables["batch_stats"],
        x,
        labels,
        -1,
        logits=lambda out: out[0],
    )


def _nnx() -> Case:
    graphdef, params, rest = nnx.split(NNXNet(nnx.Rngs(0, dropout=1)), nnx.Param, ...)
    x = jax.random.normal(jax.random.key(1), (64, 32))
    labels = jax.random.randint(jax.random.key(2), (64,), 0, 10)
    return Case(lambda p, r, x: nnx.merge(graphdef, p, r)(x), params, rest, x, labels, -1)


def _eqx() -> Case:
    params, static = eqx.partition(EqxNet(jax.random.key(0)), eqx.is_array)
    x = jax.random.normal(jax.random.key(1), (8, 16, 32))
    labels = jax.random.randint(jax.random.key(2), (8, 16), 0, 10)
    fn = lambda p, e, x: jax.vmap(eqx.combine(p, static))(x)
    # Equinox weights are (out, in): output channels are axis 0.
    return Case(fn, params, None, x, labels, 0, causal=True)


_BUILDERS = {"gpt2": _gpt, "resnet": _resnet, "nnx": _nnx, "equinox": _eqx}
_CASES: dict[str, Case] = {}


def _case(name: str) -> Case:
    if name not in _CASES:
        _CASES[name] = _BUILDERS[name]()
    return _CASES[name]


def _convert(tree: Any, recipe: str, out_axis: int) -> Any:
    fmt, scaling = RECIPES[recipe]
    return precision.to_reduced_precision(tree, fmt, scaling=scaling(out_axis), exclude=EXCLUDE)


_QUANTIZED: dict[tuple[str, str], tuple[Any, Any, Any]] = {}


def _quantized(model: str, recipe: str) -> tuple[Any, Any, Any]:
    """(stored params, stored extra, plain-JAX reference on the decoded weights)."""
    key = (model, recipe)
    if key not in _QUANTIZED:
        case = _case(model)
        pq, eq = _convert((case.params, case.extra), recipe, case.out_axis)
        decoded = precision.to_full_precision((pq, eq))
        ref = _np(jax.jit(case.fn)(*decoded, case.x))
        _QUANTIZED[key] = (pq, eq, ref)
    return _QUANTIZED[key]


MODELS = list(_BUILDERS)


def _pairs(recipes: Any) -> list[tuple[str, str]]:
    """(model, recipe) pairs: every model with int8 per output channel (its scaling axis is
    the model's own), and the recipes whose scaling no model changes (blocks of the last
    axis, one scale per tensor) on the flax linen transformer and CNN; every pair under
    the hunt profile (tests/conftest.py)."""
    hunt = os.environ.get("HYPOTHESIS_PROFILE") == "hunt"
    return [
        (model, recipe)
        for model in MODELS
        for recipe in recipes
        if hunt or recipe == "int8-per-axis" or model in ("gpt2", "resnet")
    ]


# ------------------------------------------------- the reference decode itself


def _np_quantize(x: np.ndarray, qmax: int, groups: str) -> np.ndarray:
    """Decoded symmetric absmax integer quantization, written from docs/design.md §2 in numpy.

    `groups="last-axis"`: one scale per index of the last axis (PerAxis(-1));
    `groups="block32"`: blocks of 32 consecutive values along the last axis.
    """
    x = np.asarray(x, np.float32)
    if groups == "last-axis":
        g = x.reshape(-1, x.shape[-1]).T  # one row per output channel
    else:
        g = x.reshape(-1, 32)
    absmax = np.max(np.abs(g), axis=1, keepdims=True)
    zero = absmax == 0
    safe = np.where(zero, np.float32(1), absmax)
    codes = np.clip(np.rint(g * (np.float32(qmax) / safe)), -qmax, qmax)
    scale = np.where(zero, np.float32(1), safe / np.float32(qmax)).astype(np.float32)
    out = (np.where(zero, 0, codes) * scale).astype(np.float32)
    return (out.T if groups == "last-axis" else out).reshape(x.shape)


@pytest.mark.parametrize(("fmt", "scaling", "qmax", "groups"), [
    ("int8", dtypes.PerAxis(-1), 127, "last-axis"),
    ("int4", dtypes.PerBlock(32), 7, "block32"),
])  # fmt: skip
def test_decoded_weights_match_a_numpy_quantization(fmt, scaling, qmax, groups):
    """The reference of every test below (plain JAX on decoded weights) decodes what it should."""
    params = _case("gpt2").params
    stored = precision.to_reduced_precision(params, fmt, scaling=scaling, exclude=EXCLUDE)
    decoded = _np(precision.to_full_precision(stored))
    for (path, leaf), got in zip(
        jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(decoded), strict=True
    ):
        keep = "bias" in jax.tree_util.keystr(path) or "scale" in jax.tree_util.keystr(path)
        want = np.asarray(leaf) if keep else _np_quantize(leaf, qmax, groups)
        np.testing.assert_array_equal(got, want, err_msg=jax.tree_util.keystr(path))


# ------------------------------------------ (a) float32 compute = decoded weights


@pytest.mark.parametrize(("model", "recipe"), _pairs(RECIPES))
def test_float32_compute_equals_plain_jax_on_decoded_weights(model, recipe):
    case = _case(model)
    pq, eq, ref = _quantized(model, recipe)
    out = precision.apply(case.fn, compute="float32")(pq, eq, case.x)
    for leaf in jax.tree.leaves(out, is_leaf=_is_tensor):
        if isinstance(leaf, Tensor):
            assert leaf.format == dtypes.float32, "storage must not be re-encoded"
    # The same float32 program on the same decoded values: the only freedom
    # left is XLA's fusion (a decode's multiply contracted with its consumer
    # into one FMA) and reassociation of the reductions (LayerNorm,
    # BatchNorm statistics, softmax, contractions of length <= 576), a few
    # dozen float32 ulps of the largest output at most.
    for got, want in zip(jax.tree.leaves(_np(out)), jax.tree.leaves(ref), strict=True):
        scale = max(float(np.max(np.abs(want))), 1e-30)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("recipe", ["int8-per-axis"])
def test_gpt2_dropout_with_typed_key_equals_plain_jax(recipe):
    """The PRNG key passes through untouched: the same dropout masks as plain JAX."""
    model = GPT()
    case = _case("gpt2")
    pq, _, _ = _quantized("gpt2", recipe)

    def train_fn(p, x, key):
        return model.apply(p, x, deterministic=False, rngs={"dropout": key})

    key = jax.random.key(7)
    out = _np(precision.apply(train_fn, compute="float32")(pq, case.x, key))
    ref = np.asarray(jax.jit(train_fn)(precision.to_full_precision(pq), case.x, key))
    assert not np.array_equal(ref, _quantized("gpt2", recipe)[2]), "dropout was not active"
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(ref))))
    half = precision.apply(train_fn, compute="bfloat16")(pq, case.x, key)
    assert half.format == dtypes.bfloat16
    assert np.isfinite(np.asarray(half)).all()


def test_nnx_state_with_rng_streams_converts_and_runs():
    """A whole `nnx.state` (typed key and counter included) through conversion and apply."""
    net = NNXNet(nnx.Rngs(0, dropout=1))
    graphdef, state = nnx.split(net)
    x = _case("nnx").x

    def train_fn(state, x):
        return nnx.merge(graphdef, state)(x, deterministic=False)

    stored = precision.to_reduced_precision(
        state, "int8", scaling=dtypes.PerAxis(-1), exclude=EXCLUDE
    )
    before = jax.tree.leaves(state)
    after = jax.tree.leaves(stored, is_leaf=_is_tensor)
    for a, b in zip(before, after, strict=True):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            assert b is a or np.array_equal(jax.random.key_data(a), jax.random.key_data(b))
        elif not jnp.issubdtype(a.dtype, jnp.floating):
            assert b is a or np.array_equal(np.asarray(a), np.asarray(b))
    key_bytes = sum(
        leaf.nbytes
        for leaf in jax.tree.leaves(state)
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    )
    assert precision.tree_nbytes(stored) >= key_bytes  # counted without raising
    out = _np(precision.apply(train_fn, compute="float32")(stored, x))
    ref = np.asarray(jax.jit(train_fn)(precision.to_full_precision(stored), x))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(ref))))


# ------------------------------------------------ (b) bfloat16 compute declared


@pytest.mark.parametrize(("model", "recipe"), _pairs(RECIPES))
def test_bfloat16_compute_is_finite_and_agrees(model, recipe):
    case = _case(model)
    pq, eq, ref = _quantized(model, recipe)
    run = precision.apply(case.fn, compute="bfloat16")
    out = run(pq, eq, case.x)
    logits = case.logits(out)
    assert isinstance(logits, Tensor)
    assert logits.format == dtypes.bfloat16
    got, want = np.asarray(logits), case.logits(ref)
    for leaf in jax.tree.leaves(_np(out)):
        assert np.isfinite(leaf).all()
    agreement = float(np.mean(got.argmax(-1) == want.argmax(-1)))
    assert agreement >= 0.9, f"top-1 agreement {agreement:.3f} with the float32 reference"
    if case.causal:
        # Changing the last position's input changes nothing before it: every
        # masked attention probability is exactly zero.
        x2 = case.x.at[:, -1].set(
            (case.x[:, -1] + 1) % 128 if case.x.dtype == jnp.int32 else -case.x[:, -1]
        )
        got2 = np.asarray(case.logits(run(pq, eq, x2)))
        np.testing.assert_array_equal(got2[:, :-1], got[:, :-1])
        assert not np.array_equal(got2[:, -1], got[:, -1])


def test_resnet_eval_mode_bfloat16_agrees_with_decoded_float32():
    model = ResNet()
    case = _case("resnet")
    pq, eq, _ = _quantized("resnet", "int4-per-block32")

    def eval_fn(p, stats, x):
        return model.apply({"params": p, "batch_stats": stats}, x)

    ref = np.asarray(jax.jit(eval_fn)(*precision.to_full_precision((pq, eq)), case.x))
    out32 = np.asarray(precision.apply(eval_fn, compute="float32")(pq, eq, case.x))
    np.testing.assert_allclose(out32, ref, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(ref))))
    out = precision.apply(eval_fn, compute="bfloat16")(pq, eq, case.x)
    assert out.format == dtypes.bfloat16
    got = np.asarray(out)
    assert np.isfinite(got).all()
    assert np.mean(got.argmax(-1) == ref.argmax(-1)) >= 0.9


@pytest.mark.parametrize("storage", ["int8", "bfloat16"])
def test_masked_attention_probabilities_are_exactly_zero(storage):
    """Flax's attention weights under a causal mask, queries/keys stored, bf16 compute."""
    q = jax.random.normal(jax.random.key(3), (2, 16, 4, 16))
    k = jax.random.normal(jax.random.key(4), (2, 16, 4, 16))
    mask = nn.make_causal_mask(jnp.ones((2, 16)))
    if storage == "int8":
        qs, ks = (
            Tensor(a).to_reduced_precision("int8", scaling=dtypes.PerAxis(-2)) for a in (q, k)
        )
    else:
        qs, ks = (Tensor(a).to_reduced_precision("bfloat16") for a in (q, k))
    weights = precision.apply(
        lambda q, k, m: nn.dot_product_attention_weights(q, k, mask=m), compute="bfloat16"
    )(qs, ks, mask)
    w = np.asarray(weights)  # (batch, heads, query, key)
    causal = np.tril(np.ones((16, 16), bool))
    assert np.isfinite(w).all()
    assert (w[..., ~causal] == 0).all()
    assert (w[..., causal] > 0).all()
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=0, atol=16 * 2.0**-8)
    # independent reference: numpy softmax over the decoded q, k
    qd, kd = (np.asarray(a, np.float64) for a in (qs, ks))
    s = np.einsum("bqhd,bkhd->bhqk", qd, kd) / np.sqrt(16.0)
    s = np.where(causal, s, -np.inf)
    ref = np.exp(s - s.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(w, ref, rtol=0, atol=2e-2)


# --------------------------------------------------- (c) QAT gradients


# The float32 model's own gradient at the decoded weights is the straight-through
# estimator's exact value; how far it is from the float32 gradient at the
# original weights is a property of the recipe and the model, not of the code.
# For fp8 per tensor on the random-weight ReLU/BatchNorm CNN it is 0.974 (plain
# JAX, whatever the batch or image size tried), so 0.99 is asked elsewhere.
_QAT_FLOOR = {("resnet", "fp8-per-tensor"): 0.97}


@pytest.mark.parametrize(("model", "recipe"), _pairs(QAT_RECIPES))
def test_qat_gradients_are_finite_and_aligned_with_float32(model, recipe):
    case = _case(model)

    def loss_q(p):
        stored, extra = _convert((p, case.extra), recipe, case.out_axis)
        out = precision.apply(case.fn)(stored, extra, case.x)
        return _cross_entropy(precision.to_full_precision(case.logits(out)), case.labels)

    def loss_32(p):
        return _cross_entropy(case.logits(case.fn(p, case.extra, case.x)), case.labels)

    g = jax.grad(loss_q)(case.params)
    grad_32 = jax.jit(jax.grad(loss_32))
    g32 = grad_32(case.params)
    assert jax.tree.structure(g) == jax.tree.structure(g32)
    flat = _flat(g)
    assert np.isfinite(flat).all()
    assert np.any(flat != 0)
    # straight-through: exactly the float32 gradient taken at the decoded weights
    decoded = precision.to_full_precision(_convert(case.params, recipe, case.out_axis))
    ste = _cosine(g, grad_32(decoded))
    assert ste >= 0.9999, f"cosine {ste:.6f} to the straight-through reference"
    cos = _cosine(g, g32)
    floor = _QAT_FLOOR.get((model, recipe), 0.99)
    assert cos >= floor, f"cosine {cos:.4f} to the float32 gradient"


# ------------------------------------------------- (d) non-finite values stay local


def _np_int8(x: np.ndarray) -> np.ndarray:
    """Decoded int8 per-tensor storage, from docs/design.md §2 in numpy."""
    return _np_quantize(np.asarray(x, np.float32).reshape(-1, 1), 127, "last-axis").reshape(
        np.shape(x)
    )


def _bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


# (stored format of the activations, declared compute): int8 storage in float32,
# int8 storage decoded into declared bfloat16, bfloat16 Tensors in bfloat16.
MODES = {
    "int8": ("int8", None),
    "int8-in-bf16": ("int8", "bfloat16"),
    "bf16": ("bfloat16", "bfloat16"),
}


def _stored(x: np.ndarray, fmt: str) -> Tensor:
    scaling = dtypes.PerTensor() if fmt == "int8" else None
    return Tensor(np.asarray(x, np.float32)).to_reduced_precision(fmt, scaling=scaling)


def _inputs(x: np.ndarray, fmt: str, compute: str | None) -> np.ndarray:
    """What the op reads: the decoded storage, on the compute format's grid."""
    d = _np_int8(x) if fmt == "int8" else _bf16(x)
    return _bf16(d) if compute == "bfloat16" else d


def _assert_elementwise(
    got: Any, want: np.ndarray, compute: str | None, bf16_atol: float = 1e-2
) -> None:
    """Same NaN and ±inf positions exactly; finite elements within the compute format's rounding."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), err_msg="+inf positions")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg="-inf positions")
    finite = np.isfinite(want)
    # float32: a few ulps of a handful of ops; bfloat16: a few roundings of 2**-8.
    rtol, atol = (1e-5, 1e-6) if compute is None else (2e-2, bf16_atol)
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=atol)


@pytest.mark.parametrize("mode", MODES)
def test_division_by_zero_stays_elementwise(mode):
    fmt, compute = MODES[mode]
    a = np.array([1.0, 2.0, 3.0, 4.0, 0.0, -2.0], np.float32)
    b = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], np.float32)
    out = precision.apply(jnp.divide, compute=compute)(_stored(a, fmt), _stored(b, fmt))
    with np.errstate(divide="ignore", invalid="ignore"):
        want = _inputs(a, fmt, compute) / _inputs(b, fmt, compute)
    # [~1, inf, ~3, ~4, nan, -inf]
    _assert_elementwise(out, want, compute)


@pytest.mark.parametrize("mode", MODES)
def test_rsqrt_of_zero_stays_elementwise(mode):
    fmt, compute = MODES[mode]
    x = np.array([0.0, 1.0, 4.0, 0.25, -1.0, 2.0], np.float32)
    out = precision.apply(lax.rsqrt, compute=compute)(_stored(x, fmt))
    with np.errstate(divide="ignore", invalid="ignore"):
        want = 1.0 / np.sqrt(_inputs(x, fmt, compute).astype(np.float64))
    _assert_elementwise(out, want, compute)


def _layer_norm(x, scale, bias, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * scale[None, :] + bias[None, :]


@pytest.mark.parametrize("eps", [1e-6, 0.0])
@pytest.mark.parametrize("mode", MODES)
def test_zero_variance_layer_norm_row_stays_local(mode, eps):
    """A constant row: with eps its output is the bias; without, NaN in that row only."""
    fmt, compute = MODES[mode]
    rng = np.random.default_rng(0)
    x = np.clip(rng.normal(size=(4, 8)), -3.5, 3.5).astype(np.float32)
    # absmax 127/32 makes the int8 scale 2**-5, so every decoded value is a
    # multiple of 1/32 and the mean of the constant row is exact: its variance
    # is exactly 0 in any arithmetic.
    x[0, 0] = 127 / 32
    x[2] = 0.5  # zero variance
    scale = rng.uniform(0.5, 1.5, size=8).astype(np.float32)
    bias = rng.normal(size=8).astype(np.float32)
    fn = lambda x, s, b: _layer_norm(x, s, b, eps)
    out = np.asarray(precision.apply(fn, compute=compute)(_stored(x, fmt), scale, bias))
    xd = _inputs(x, fmt, compute).astype(np.float64)
    mean = xd.mean(-1, keepdims=True)
    var = np.square(xd - mean).mean(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = (xd - mean) / np.sqrt(var + eps) * scale + bias
    # bfloat16: `x - mean` rounds to 2**-8 of |x| <= 4 before the normalisation
    # gain (about 1.5) multiplies it
    _assert_elementwise(out, want, compute, bf16_atol=4e-2)
    if eps:
        assert np.isfinite(out).all()
        # exactly the bias: `x - mean` is 0 in the constant row, and 0 + bias is the bias
        # (rounded onto the compute format, the one rounding of that row)
        want_bias = _inputs(bias, "bfloat16", compute) if compute else bias
        np.testing.assert_array_equal(out[2], want_bias)
    else:
        assert np.isnan(out[2]).all()
        assert np.isfinite(np.delete(out, 2, axis=0)).all()


def test_flax_layer_norm_on_a_zero_variance_row_is_its_bias():
    x = np.random.default_rng(1).normal(size=(4, 64)).astype(np.float32)
    x[1] = -3.0
    ln = nn.LayerNorm()
    variables = ln.init(jax.random.key(0), x)
    variables = jax.tree.map(lambda a: a + 0.25, variables)  # a visible bias
    stored = _stored(x, "int8")
    ref = np.asarray(jax.jit(ln.apply)(variables, _np_int8(x)))
    np.testing.assert_array_equal(ref[1], 0.25)  # plain JAX: exactly the bias
    for compute in (None, "bfloat16"):
        out = np.asarray(precision.apply(ln.apply, compute=compute)(variables, stored))
        assert np.isfinite(out).all()
        # One decoded value minus the mean of 64 copies of it is exactly 0,
        # whatever the arithmetic, so the row is the bias (to 1e-6: a float32
        # mean that were off by one ulp would show as 1.4e-5 after rsqrt(eps)).
        np.testing.assert_allclose(out[1], 0.25, rtol=0, atol=1e-6)
        if compute is None:
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_a_decoded_value_is_one_float32_number():
    """Every use of a stored element reads the same float32 value (docs/design.md §4: storage
    decodes exactly into its logical dtype), so `x - x[:, :1]` over a constant row is 0."""
    x = np.full((2, 64), -3.0, np.float32)
    x[0] = np.linspace(-3.3, 3.3, 64, dtype=np.float32)
    stored = _stored(x, "int8")
    out = np.asarray(precision.apply(lambda a: a - a[:, :1])(stored))
    np.testing.assert_array_equal(out[1], 0.0)
    want = _np_int8(x) - _np_int8(x)[:, :1]
    np.testing.assert_array_equal(out, want)


def _np_masked_softmax(s: np.ndarray, mask: np.ndarray, fill: float | None) -> np.ndarray:
    """Softmax of `where(mask, s, fill)` in float64; `fill=None` is `softmax(where=mask)`
    (masked entries 0, a fully masked row all 0, as jax.nn.softmax documents)."""
    s = np.asarray(s, np.float64)
    with np.errstate(invalid="ignore"):
        if fill is None:
            z = np.where(mask, s, -np.inf)
            m = np.max(z, axis=-1, keepdims=True)
            e = np.where(mask, np.exp(z - np.where(np.isfinite(m), m, 0)), 0)
            d = e.sum(-1, keepdims=True)
            return np.where(mask, e / np.where(d == 0, 1, d), 0)
        z = np.where(mask, s, fill)
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("fill", ["-inf", "finfo.min", "where="])
@pytest.mark.parametrize("mode", MODES)
def test_masked_softmax_stays_elementwise(mode, fill):
    fmt, compute = MODES[mode]
    rng = np.random.default_rng(2)
    s = (rng.normal(size=(5, 6)) * 3).astype(np.float32)
    mask = np.tril(np.ones((5, 6), bool), k=0)
    # Row 0 of `mask` keeps one entry; a fully masked row is added where its
    # meaning does not depend on the compute format: -inf gives NaN (0/0) and
    # softmax(where=) gives zeros in every format; finfo(float32).min gives a
    # uniform row in float32 but rounds to -inf in bfloat16, so it is left out.
    if fill != "finfo.min" or compute is None:
        mask[4] = False
    if fill == "where=":
        fn = lambda s, m: jax.nn.softmax(s, axis=-1, where=m)
        value = None
    else:
        value = -np.inf if fill == "-inf" else float(np.finfo(np.float32).min)
        c = -jnp.inf if fill == "-inf" else jnp.finfo(jnp.float32).min
        fn = lambda s, m: jax.nn.softmax(jnp.where(m, s, c), axis=-1)
    out = np.asarray(precision.apply(fn, compute=compute)(_stored(s, fmt), mask))
    want = _np_masked_softmax(_inputs(s, fmt, compute), mask, value)
    _assert_elementwise(out, want, compute)
    live = mask.any(-1)
    assert (out[live][~mask[live]] == 0).all(), "masked entries of a live row must be exactly 0"


# ----------------------------------------------------------- (e) honest bytes


def _leaf_bytes(t: Any) -> int:
    return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(t))


# (format, scaling, independent byte count for a (64, 96) float32 matrix)
_BYTES = [
    ("int8", dtypes.PerAxis(0), 64 * 96 + 64 * 4),
    ("int4", dtypes.PerBlock(32), 64 * 96 // 2 + 64 * 3 * 4),
    ("float8_e4m3fn", dtypes.PerTensor(), 64 * 96 + 4),
    ("bfloat16", None, 64 * 96 * 2),
]


@pytest.mark.parametrize(("fmt", "scaling", "expected"), _BYTES)
@pytest.mark.parametrize("where", ["eager", "jit"])
def test_tensor_leaves_are_exactly_its_nbytes(fmt, scaling, expected, where):
    x = jax.random.normal(jax.random.key(0), (64, 96))
    make = lambda x: Tensor(x).to_reduced_precision(fmt, scaling=scaling)
    t = make(x) if where == "eager" else jax.jit(make)(x)
    assert t.nbytes == expected
    assert _leaf_bytes(t) == t.nbytes
    assert jax.tree.structure(t) == jax.tree.structure(make(x))


def test_apply_updates_under_jit_keeps_bytes_structure_and_does_not_retrace():
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {
        "w": jax.random.normal(k1, (64, 96)),
        "b": jax.random.normal(k2, (96,)),
    }
    stored = precision.to_reduced_precision(params, "int8", scaling=dtypes.PerAxis(-1), exclude="b")
    updates = jax.tree.map(lambda p: 1e-2 * jnp.ones_like(p), params)
    # a typed PRNG key among the parameters passes through untouched
    rng = jax.random.key(3)
    stored["rng"], updates["rng"] = rng, None
    traces = []

    @jax.jit
    def step(p, u):
        traces.append(1)
        return precision.apply_updates(p, u)

    once = step(stored, updates)
    twice = step(once, updates)
    assert len(traces) == 1, "the second step retraced: the pytree changed"
    for new in (once, twice):
        assert jax.tree.structure(new) == jax.tree.structure(stored)
        w = new["w"]
        assert isinstance(w, Tensor)
        assert w.format == dtypes.int8
        assert _leaf_bytes(w) == w.nbytes == 64 * 96 + 96 * 4
        assert not isinstance(new["b"], Tensor)
        np.testing.assert_array_equal(jax.random.key_data(new["rng"]), jax.random.key_data(rng))
    # the new weights: int8 per-axis quantization of (decoded + update), in numpy
    # (XLA may contract the decode's multiply and the add into one FMA, so a
    # group's absmax, hence its scale, can differ from numpy's by one ulp)
    want = _np_quantize(np.asarray(stored["w"]) + np.float32(1e-2), 127, "last-axis")
    np.testing.assert_allclose(np.asarray(once["w"]), want, rtol=1e-6, atol=0)
    np.testing.assert_allclose(
        np.asarray(twice["b"]), np.asarray(params["b"]) + np.float32(2e-2), rtol=1e-6
    )


def test_reduced_optimizer_state_keeps_bytes_and_does_not_retrace():
    reduced_state = pytest.importorskip("precision.optax").reduced_state
    params = {"w": jax.random.normal(jax.random.key(0), (64, 128))}
    tx = reduced_state(optax.adam(1e-3), mu="int8", nu="int8")
    traces = []

    @jax.jit
    def step(params, state, grads):
        traces.append(1)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    grads = {"w": jax.random.normal(jax.random.key(1), (64, 128))}
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes int and float
        state = tx.init(params)
        params, state = step(params, state, grads)
        params, state2 = step(params, state, grads)
    assert len(traces) == 1
    assert jax.tree.structure(state2, is_leaf=_is_tensor) == jax.tree.structure(
        state, is_leaf=_is_tensor
    )
    moments = [t for t in jax.tree.leaves(state2, is_leaf=_is_tensor) if isinstance(t, Tensor)]
    assert len(moments) == 2
    for t in moments:
        assert t.format == dtypes.int8
        assert _leaf_bytes(t) == t.nbytes < 64 * 128 * 4 // 3
    assert np.isfinite(np.asarray(params["w"])).all()


# ------------------------------------------------------- (f) no silent mixing


def test_undeclared_narrower_compute_over_storage_raises():
    w = Tensor(np.ones((8, 4), np.float32)).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1))
    h = Tensor(np.ones((2, 8), np.float32)).to_reduced_precision("bfloat16")
    with pytest.raises(precision.PrecisionMismatchError, match="compute=") as info:
        precision.apply(lambda h, w: h @ w)(h, w)
    assert isinstance(info.value, TypeError)
    assert "bfloat16" in str(info.value)
    assert "int8" in str(info.value)
    # the fix the message names works
    out = precision.apply(lambda h, w: h @ w, compute="bfloat16")(h, w)
    assert out.format == dtypes.bfloat16


def test_a_different_compute_format_under_a_declared_one_raises():
    h = Tensor(np.ones((2, 8), np.float32)).to_reduced_precision("float16")
    w = Tensor(np.ones((8, 4), np.float32)).to_reduced_precision("int8")
    with pytest.raises(precision.PrecisionMismatchError) as info:
        precision.apply(lambda h, w: h @ w, compute="bfloat16")(h, w)
    assert isinstance(info.value, TypeError)
    assert "float16" in str(info.value)
    assert "bfloat16" in str(info.value)


def test_int8_weight_with_float32_bias_is_float32_arithmetic():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(8, 4)).astype(np.float32)
    b = rng.normal(size=4).astype(np.float32)
    x = rng.normal(size=(2, 8)).astype(np.float32)
    ws = Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1))
    out = precision.apply(lambda x, w, b: x @ w + b[None, :])(x, ws, b)
    assert out.format == dtypes.float32
    want = x.astype(np.float64) @ _np_quantize(w, 127, "last-axis").astype(np.float64) + b
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ (g) memory


def _temp_bytes(f: Callable, *args: Any) -> int:
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def _mlp_scan(ws, x):
    return lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]


def _mlp_unrolled(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return x


def test_int4_mlp_under_scan_decodes_one_layer_at_a_time():
    layers, d, batch = 8, 1024, 8
    ws = jax.random.normal(jax.random.key(0), (layers, d, d)) / 32
    x = jax.random.normal(jax.random.key(1), (batch, d))
    stored = precision.to_reduced_precision(ws, "int4", scaling=dtypes.PerBlock(32))
    layer = d * d * 4  # one decoded float32 layer: 4 MiB
    activations = 4 * batch * d * 4  # a few (batch, d) float32 buffers
    temp = _temp_bytes(precision.apply(_mlp_scan), stored, x)
    plain = _temp_bytes(lambda w, x: _mlp_scan(precision.to_full_precision(w), x), stored, x)
    unrolled = [
        precision.to_reduced_precision(ws[i], "int4", scaling=dtypes.PerBlock(32))
        for i in range(layers)
    ]
    temp_unrolled = _temp_bytes(precision.apply(_mlp_unrolled), unrolled, x)
    plain_unrolled = _temp_bytes(
        lambda w, x: _mlp_unrolled(precision.to_full_precision(w), x), unrolled, x
    )
    mib = 2.0**-20
    print(
        f"\nXLA temp bytes, 8 x 1024^2 int4 PerBlock(32) MLP: scan apply {temp * mib:.2f} MiB, "
        f"scan plain decode-first {plain * mib:.2f} MiB; unrolled apply "
        f"{temp_unrolled * mib:.2f} MiB, unrolled plain decode-first {plain_unrolled * mib:.2f} MiB"
    )
    assert temp <= 2 * layer + activations, f"temp {temp * mib:.2f} MiB"
    out = np.asarray(precision.apply(_mlp_scan)(stored, x))
    ref = np.asarray(jax.jit(_mlp_scan)(precision.to_full_precision(stored), x))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_a_flax_scanned_stack_trains_under_bfloat16_compute():
    """`nn.scan` over layers carries the float32 input through bfloat16 layers: under
    `compute="bfloat16"` the carry adopts the format (it was refused as a mix of
    formats), rounded once before the loop: the forward is bit for bit the same stack
    unrolled layer by layer on the input rounded to bfloat16. (Unrolled on the float32
    input, the first LayerNorm's statistics, which run in float32, would read its exact
    values.)"""

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            return jnp.tanh(nn.Dense(16)(nn.LayerNorm()(h))), None

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, x):
            scanned = nn.scan(
                Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=4
            )
            return scanned()(x, None)[0]

    model = Stack()
    x = jax.random.normal(jax.random.key(0), (8, 16))
    params = model.init(jax.random.key(1), x)
    run = precision.apply(model.apply, compute="bfloat16")
    out = np.asarray(precision.to_full_precision(jax.jit(run)(params, x)))

    def unrolled(p, x):
        h = x
        for i in range(4):
            layer = jax.tree_util.tree_map(lambda a, i=i: a[i], p["params"]["ScanBlock_0"])
            h, _ = Block().apply({"params": layer}, h, None)
        return h

    rounded = jnp.asarray(np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32))
    want = np.asarray(
        precision.to_full_precision(precision.apply(unrolled, compute="bfloat16")(params, rounded))
    )
    np.testing.assert_array_equal(out, want)
    assert np.array_equal(out.astype(ml_dtypes.bfloat16).astype(np.float32), out)
    loss = lambda p: jnp.sum(precision.to_full_precision(run(p, x)) ** 2)
    grads = jax.jit(jax.grad(loss))(params)
    kernel = grads["params"]["ScanBlock_0"]["Dense_0"]["kernel"]
    assert kernel.shape == (4, 16, 16)
    assert bool(jnp.all(jnp.isfinite(kernel)))
