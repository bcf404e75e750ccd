"""`precision.calibrate`: GPTQ against an independent reference, per-layer statistics
under `scan`, the converted tree in `apply` and `save`, and the errors of bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gptq_reference import patches as _patches
from gptq_reference import reference_gptq as _reference_gptq

import dtypes
import precision
from precision._calibrate._record import Found, record

# These tests check the algorithm, often on few rows; generalising from too few rows
# per input, and its warning, is tested in test_calibrate_rows.py.
pytestmark = pytest.mark.filterwarnings("ignore:calibrate. GPTQ saw fewer:UserWarning")


def _batches(rng, n, rows, k):
    # integer-valued activations: their Hessian is exact in float32 and in float64,
    # so this test and the code under test start from the very same matrix
    spread = rng.integers(1, 4, size=k)
    return [(rng.integers(-3, 4, size=(rows, k)) * spread).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize(
    ("group", "block", "act_order", "fmt"),
    [
        (32, 128, False, "int4"),
        (32, 48, False, "int4"),
        (16, 64, True, "int4"),
        (32, 48, False, "uint4"),
        (16, 64, True, "uint4"),
    ],
)
def test_gptq_on_one_layer_equals_the_published_algorithm_code_for_code(
    group, block, act_order, fmt, clip
):
    rng = np.random.default_rng(7)
    k, m = 96, 24
    w = rng.normal(size=(k, m)).astype(np.float32)
    batches = _batches(rng, 3, 40, k)
    batches[0][:, 5] = 0  # one input never seen in the first batch: still seen later
    for b in batches:
        b[:, 11] = 0  # and one never seen at all: its weights are set to zero
    q = precision.calibrate(
        lambda p, x: x @ p["w"],
        {"w": w},
        batches,
        format=fmt,
        scaling=dtypes.PerBlock(group),
        damp=0.01,
        block_size=block,
        act_order=act_order,
        clip=clip,
    )["w"]
    x = np.concatenate(batches).astype(np.float64)
    want = _reference_gptq(
        w.T, x.T @ x, group, 0.01, act_order, fmt == "uint4", clip=20 if clip else 0
    ).T
    assert q.scaling == dtypes.PerBlock(group, axis=0)
    np.testing.assert_array_equal(q.numpy(), want.astype(np.float32))


def test_gptq_on_a_convolution_equals_the_published_algorithm_on_its_patches():
    nn = pytest.importorskip("flax.linen")
    rng = np.random.default_rng(12)

    class Conv(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Conv(4, (3, 3), padding="SAME", use_bias=False)(x)

    model = Conv()
    batches = [rng.integers(-2, 3, size=(2, 6, 6, 8)).astype(np.float32) for _ in range(2)]
    params = model.init(jax.random.key(0), batches[0])
    q = precision.calibrate(model.apply, params, batches, scaling=dtypes.PerBlock(4))
    kernel = q["params"]["Conv_0"]["kernel"]
    assert kernel.scaling == dtypes.PerBlock(4, axis=2)  # blocks of input channels (HWIO)
    x = np.concatenate([_patches(b, 3) for b in batches])
    w = np.asarray(params["params"]["Conv_0"]["kernel"])
    want = _reference_gptq(w.reshape(-1, 4).T, x.T @ x, 4, 0.01).T.reshape(w.shape)
    np.testing.assert_array_equal(kernel.numpy(), want.astype(np.float32))
    out = precision.apply(model.apply)(q, batches[0])
    np.testing.assert_allclose(
        np.asarray(out),
        np.asarray(model.apply(precision.to_full_precision(q), batches[0])),
        rtol=1e-5,
        atol=1e-5,
    )


def test_gptq_beats_round_to_nearest_on_correlated_inputs():
    rng = np.random.default_rng(1)
    k, m = 128, 64
    # activations of lower rank than the layer's width (as real ones are): correlated
    mix = rng.normal(size=(32, k))
    batches = [
        (rng.normal(size=(256, 32)) @ mix + 0.1 * rng.normal(size=(256, k))).astype(np.float32)
        for _ in range(4)
    ]
    w = rng.normal(size=(k, m)).astype(np.float32)
    f = lambda p, x: x @ p["w"]
    x = np.concatenate(batches)
    err = {}
    for method in ("rtn", "gptq"):
        q = precision.calibrate(f, {"w": w}, batches, method=method, scaling=dtypes.PerBlock(32))
        err[method] = np.mean((x @ q["w"].numpy() - x @ w) ** 2)
    assert err["gptq"] < 0.5 * err["rtn"], err


def test_gptq_clip_search_beats_the_full_range_on_heavy_tailed_weights():
    # a few large weights per group set the full range's step: clipping them gives the
    # many small ones a finer step, which held-out inputs see as less output error
    rng = np.random.default_rng(4)
    k, m = 128, 64
    w = rng.standard_t(5, size=(k, m)).astype(np.float32)
    f = lambda p, x: x @ p["w"]
    batches = [rng.normal(size=(256, k)).astype(np.float32) for _ in range(4)]
    held = rng.normal(size=(2048, k)).astype(np.float32)
    err = {}
    for clip in (True, False):
        q = precision.calibrate(f, {"w": w}, batches, scaling=dtypes.PerBlock(32), clip=clip)
        err[clip] = np.mean((held @ q["w"].numpy() - held @ w) ** 2)
    assert err[True] < 0.95 * err[False], err  # measured: 0.90


def _stacked_model(params, x):
    x = x @ params["embed"]

    def layer(h, w):
        return jnp.round(h @ w), None  # integer-valued inputs: exact Hessians

    x, _ = jax.lax.scan(layer, x, params["layers"])
    return x @ params["head"]


@pytest.mark.parametrize("method", ["awq", "awq+gptq", "smoothquant"])
def test_folding_methods_do_the_unstacked_layers_and_name_the_stacked_ones(method):
    rng = np.random.default_rng(5)
    d, layers = 16, 3
    params = {
        "embed": rng.normal(size=(8, d)).astype(np.float32),
        "layers": rng.normal(size=(layers, d, d)).astype(np.float32) / 4,
        "head": rng.normal(size=(d, 5)).astype(np.float32),
    }
    batches = [rng.normal(size=(32, 8)).astype(np.float32) for _ in range(4)]
    with pytest.warns(precision.CalibrationWarning, match=r"\['layers'\] hold layers stacked"):
        q = precision.calibrate(_stacked_model, params, batches, method=method, progress=False)
    assert all(isinstance(q[k], precision.Tensor) for k in params)
    # the stacked layers rounded to nearest (AWQ+GPTQ: by GPTQ), a scale for each layer
    stacked = q["layers"]
    assert stacked.encoded.scale.shape[0] == layers
    if method == "awq+gptq":
        want = precision.calibrate(_stacked_model, params, batches, method="gptq")["layers"]
    else:
        want = precision.Tensor(params["layers"]).to_reduced_precision(
            stacked.format, scaling=stacked.scaling
        )
    np.testing.assert_array_equal(stacked.numpy(), want.numpy())


def test_a_layer_under_scan_and_one_outside_each_get_their_own_statistics():
    rng = np.random.default_rng(3)
    d, layers = 16, 3
    params = {
        "embed": rng.integers(-1, 2, size=(8, d)).astype(np.float32),
        "layers": rng.normal(size=(layers, d, d)).astype(np.float32) / 4,
        "head": rng.normal(size=(d, 5)).astype(np.float32),
    }
    x = rng.integers(-3, 4, size=(64, 8)).astype(np.float32)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    stats = jax.jit(
        record(_stacked_model, lambda xs: jax.tree_util.tree_unflatten(treedef, xs), Found())
    )(leaves, x)
    names = {name: i for i, name in enumerate(sorted(params))}  # dict leaves: sorted keys
    # independent: each layer's input computed by plain numpy
    h = x.astype(np.float64) @ params["embed"]
    inputs = []
    for w in params["layers"]:
        inputs.append(h)
        h = np.round(h @ w)
    assert set(stats) == {
        (names["embed"], (0,), ()),
        (names["layers"], (1,), (0,)),
        (names["head"], (0,), ()),
    }
    got = np.asarray(stats[(names["layers"], (1,), (0,))].h)
    assert got.shape == (layers, d, d)
    for i, xi in enumerate(inputs):
        np.testing.assert_allclose(got[i], xi.T @ xi, rtol=0)
    np.testing.assert_allclose(np.asarray(stats[(names["head"], (0,), ())].h), h.T @ h, rtol=0)
    np.testing.assert_allclose(np.asarray(stats[(names["embed"], (0,), ())].h), x.T @ x, rtol=0)

    # and GPTQ then converts each stacked layer with its own Hessian: layer i of the
    # calibrated stack equals calibrating layer i alone on its own inputs, and not
    # layer i calibrated on another layer's inputs
    q = precision.calibrate(_stacked_model, params, [x], scaling=dtypes.PerBlock(8))
    assert q["layers"].scaling == dtypes.PerBlock(8, axis=1)

    def alone(i, xi):
        return precision.calibrate(
            lambda p, a: a @ p["w"],
            {"w": params["layers"][i]},
            [xi.astype(np.float32)],
            scaling=dtypes.PerBlock(8),
        )["w"].numpy()

    for i, xi in enumerate(inputs):
        stacked = q["layers"].numpy()[i]
        own = np.mean(stacked == alone(i, xi))
        other = np.mean(stacked == alone(i, inputs[(i + 1) % layers]))
        assert own == 1, (i, own)
        assert other < 0.9, (i, other)


def test_the_calibrated_tree_runs_under_apply_and_survives_save_and_load(tmp_path):
    rng = np.random.default_rng(4)
    params = {
        "embed": rng.normal(size=(8, 16)).astype(np.float32),
        "layers": rng.normal(size=(2, 16, 16)).astype(np.float32) / 4,
        "head": rng.normal(size=(16, 5)).astype(np.float32),
    }
    x = rng.normal(size=(10, 8)).astype(np.float32)
    q = precision.calibrate(_stacked_model, params, [x], scaling=dtypes.PerBlock(8))
    decoded = precision.to_full_precision(q)
    want = _stacked_model(decoded, x)  # plain JAX on the decoded weights
    got = precision.apply(_stacked_model)(q, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    path = tmp_path / "q.safetensors"
    precision.save(path, q)
    back = precision.load(path)
    for name in params:
        np.testing.assert_array_equal(back[name].numpy(), q[name].numpy())
        assert back[name].format.name == "int4"


def test_flax_and_equinox_models_are_calibrated_through_their_own_apply():
    flax = pytest.importorskip("flax.linen")
    eqx = pytest.importorskip("equinox")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(32, 24)).astype(np.float32)

    class MLP(flax.Module):
        @flax.compact
        def __call__(self, x):
            x = flax.LayerNorm()(x)
            x = flax.relu(flax.Dense(64)(x))
            return flax.Dense(8)(x)

    model = MLP()
    params = model.init(jax.random.key(0), x)
    q = precision.calibrate(model.apply, params, [x, x * 2], scaling=dtypes.PerBlock(16))
    kernels = {
        jax.tree_util.keystr(p): leaf
        for p, leaf in jax.tree_util.tree_flatten_with_path(
            q, is_leaf=lambda t: isinstance(t, precision.Tensor)
        )[0]
    }
    converted = sorted(k for k, v in kernels.items() if isinstance(v, precision.Tensor))
    assert converted == ["['params']['Dense_0']['kernel']", "['params']['Dense_1']['kernel']"]
    out = precision.apply(model.apply)(q, x)
    assert np.all(np.isfinite(np.asarray(out)))

    mlp = eqx.nn.MLP(24, 8, 32, depth=2, key=jax.random.key(1))
    qm = precision.calibrate(lambda m, a: jax.vmap(m)(a), mlp, [x], scaling=dtypes.PerBlock(8))
    assert all(isinstance(layer.weight, precision.Tensor) for layer in qm.layers)
    assert qm.layers[0].weight.scaling == dtypes.PerBlock(8, axis=1)  # (out, in): inputs on 1
    assert not isinstance(qm.layers[0].bias, precision.Tensor)


def test_a_flax_nnx_model_is_calibrated_through_split_and_merge():
    nnx = pytest.importorskip("flax.nnx")

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.norm = nnx.LayerNorm(32, rngs=rngs)
            self.fc1 = nnx.Linear(32, 64, rngs=rngs)
            self.fc2 = nnx.Linear(64, 8, rngs=rngs)

        def __call__(self, x):
            return self.fc2(nnx.relu(self.fc1(self.norm(x))))

    graphdef, state = nnx.split(Net(nnx.Rngs(0)))

    def f(s, x):
        return nnx.merge(graphdef, s)(x)

    x = np.random.default_rng(0).normal(size=(16, 32)).astype(np.float32)
    for method in ("gptq", "awq"):
        q = precision.calibrate(f, state, [x], method=method, scaling=dtypes.PerBlock(16))
        assert isinstance(q["fc1"]["kernel"].get_value(), precision.Tensor)
        assert isinstance(q["fc2"]["kernel"].get_value(), precision.Tensor)
        assert not isinstance(q["norm"]["scale"].get_value(), precision.Tensor)
        decoded = precision.to_full_precision(q)
        np.testing.assert_allclose(
            np.asarray(precision.apply(f)(q, x)), np.asarray(f(decoded, x)), rtol=1e-5, atol=1e-5
        )


def _linear(p, x):
    return jnp.tanh(x @ p["w1"]) @ p["w2"]


@pytest.fixture
def linear_params():
    rng = np.random.default_rng(6)
    return {
        "w1": rng.normal(size=(8, 16)).astype(np.float32),
        "w2": rng.normal(size=(16, 4)).astype(np.float32),
        "emb": rng.normal(size=(5, 8)).astype(np.float32),
    }


def test_bad_input_is_refused_with_the_layer_or_batch_named(linear_params):
    x = np.ones((4, 8), np.float32)
    with pytest.raises(precision.CalibrationError, match="`batches` is empty"):
        precision.calibrate(_linear, linear_params, [])
    with pytest.raises(
        precision.CalibrationError, match=r"batch 1 of shapes \(4, 7\).*batch 0 had shapes \(4, 8\)"
    ):
        precision.calibrate(_linear, linear_params, [x, np.ones((4, 7), np.float32)])
    with pytest.raises(precision.CalibrationError, match="selects none of the contracted weights"):
        precision.calibrate(_linear, linear_params, [x], exclude="w")
    with pytest.raises(
        precision.CalibrationError, match=r"\['emb'\] is selected but f never contracts it"
    ):
        precision.calibrate(_linear, linear_params, [x], where="emb|w1")
    bad = x.copy()
    bad[2, 3] = np.nan
    with pytest.raises(
        precision.CalibrationError, match=r"inputs of \['w1'\] hold 1 NaN .* batch 1"
    ):
        precision.calibrate(_linear, linear_params, [x, bad])
    with pytest.raises(precision.CalibrationError, match="method='gtpq' is not one of 'gptq'"):
        precision.calibrate(_linear, linear_params, [x], method="gtpq")
    with pytest.raises(precision.CalibrationError, match=r"alpha must be within \[0, 1\]"):
        precision.calibrate(_linear, linear_params, [x], method="smoothquant", alpha=2)
    with pytest.raises(
        precision.CalibrationError, match="is not an integer format calibration writes"
    ):
        precision.calibrate(_linear, linear_params, [x], format="float8_e4m3fn")
    q = precision.to_reduced_precision(linear_params, "int8")
    with pytest.raises(precision.CalibrationError, match="already a Tensor"):
        precision.calibrate(_linear, q, [x])
    with pytest.raises(ValueError, match="iterable of inputs"):  # the builtin users catch
        precision.calibrate(_linear, linear_params, None)


def test_nan_inside_a_later_layer_names_that_layer(linear_params):
    params = dict(linear_params)
    params["w1"] = params["w1"].copy()
    params["w1"][0, 0] = np.inf  # w1's inputs are finite; w2's inputs are not
    x = np.ones((4, 8), np.float32)
    with pytest.raises(precision.CalibrationError, match=r"inputs of \['w2'\] hold 4 NaN"):
        precision.calibrate(lambda p, a: (a @ p["w1"]) @ p["w2"], params, [x], where="w2")


def test_from_codes_builds_what_decode_reads():
    codes = np.array([[7, -7, 0, 3], [1, 2, -3, 4]])
    scale = np.array([[0.5], [0.25]], np.float32)
    enc = dtypes.from_codes(codes, scale, "int4", dtypes.PerAxis(0))
    np.testing.assert_array_equal(np.asarray(enc.decode()), codes * scale)
    with pytest.raises(dtypes.FormatError, match=r"within \[-7, 7\], got -8"):
        dtypes.from_codes(np.array([[-8]]), np.ones((1, 1), np.float32), "int4", dtypes.PerAxis(0))
    with pytest.raises(dtypes.PrecisionTypeError, match="integers"):
        dtypes.from_codes(np.array([[1.0]]), np.ones((1, 1), np.float32), "int4", dtypes.PerAxis(0))
    with pytest.raises(dtypes.FormatError, match="scales of shape"):
        dtypes.from_codes(
            np.array([[1, 2]]), np.ones((2, 1), np.float32), "int8", dtypes.PerAxis(0)
        )


class _Block:
    """A pre-LayerNorm transformer block in Flax linen, with an untied head."""

    @staticmethod
    def make():
        nn = pytest.importorskip("flax.linen")

        class Block(nn.Module):
            @nn.compact
            def __call__(self, x):
                h = nn.LayerNorm()(x)
                q, k, v = nn.Dense(32)(h), nn.Dense(32)(h), nn.Dense(32)(h)
                a = jax.nn.softmax(q @ k.swapaxes(-1, -2) / 8) @ v
                x = x + nn.Dense(32)(a)
                h = nn.LayerNorm()(x)
                x = x + nn.Dense(32)(nn.gelu(nn.Dense(128)(h)))
                h = nn.LayerNorm()(x)
                return nn.Dense(7)(h) + h[..., :7]  # the last norm's output is read twice

        return Block()


def _batches_3d(rng, n=4):
    return [rng.normal(size=(4, 16, 32)).astype(np.float32) for _ in range(n)]


def _init(model, x, seed):
    """Parameters whose norms have a few outlier channels (gains 20x the rest), as
    trained transformers have, and nonzero shifts."""
    params = model.init(jax.random.key(seed), x)
    rng = np.random.default_rng(seed)
    norms = {}
    for name in params["params"]:
        if name.startswith("LayerNorm"):
            scale = 1 + 0.1 * rng.normal(size=32)
            scale[[3, 17]] = 20.0
            norms[name] = {
                "scale": jnp.asarray(scale, jnp.float32),
                "bias": jnp.asarray(0.1 * rng.normal(size=32), jnp.float32),
            }
    return {"params": {**params["params"], **norms}}


@pytest.mark.parametrize("method", ["awq", "awq+gptq", "smoothquant"])
def test_folded_scales_leave_the_float32_function_unchanged(method, monkeypatch):
    from precision._calibrate import _calibrate

    model = _Block.make()
    rng = np.random.default_rng(8)
    batches = _batches_3d(rng)
    params = _init(model, batches[0], 0)
    # stop before rounding (and AWQ's clipping): the folded float32 weights come back
    monkeypatch.setattr(_calibrate, "_converted", lambda recipe, leaf, *args: ("-", leaf))
    folded = precision.calibrate(model.apply, params, batches, method=method)
    for x in batches:
        want, got = model.apply(params, x), model.apply(folded, x)
        rel = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
        assert rel <= 1e-5, rel
    p, f = params["params"], folded["params"]
    # folded into the two norms whose outputs only the layers read ...
    for norm in ("LayerNorm_0", "LayerNorm_1"):
        assert not np.array_equal(np.asarray(f[norm]["scale"]), np.asarray(p[norm]["scale"]))
        assert not np.array_equal(np.asarray(f[norm]["bias"]), np.asarray(p[norm]["bias"]))
    # ... not into the last, whose output is also added to the result
    np.testing.assert_array_equal(f["LayerNorm_2"]["scale"], p["LayerNorm_2"]["scale"])
    np.testing.assert_array_equal(f["Dense_6"]["kernel"], p["Dense_6"]["kernel"])


def test_awq_gptq_rounds_the_scaled_weight_by_gptq_against_the_scaled_inputs(monkeypatch):
    # x * g + b is a normalization's end: AWQ+GPTQ folds its scales s into g and b, and
    # rounds w * s by GPTQ against the Hessian of the inputs it then meets, x / s
    from precision._calibrate import _calibrate

    rng = np.random.default_rng(21)
    k, m = 64, 16
    params = {
        "g": rng.integers(1, 4, size=k).astype(np.float32),
        "b": rng.integers(-2, 3, size=k).astype(np.float32),
        "w": rng.normal(size=(k, m)).astype(np.float32),
    }
    params["g"][[3, 40]] = 30  # two outlier channels
    f = lambda p, x: (x * p["g"][None] + p["b"][None]) @ p["w"]
    batches = [rng.integers(-3, 4, size=(64, k)).astype(np.float32) for _ in range(4)]
    chosen = []
    searched = _calibrate.awq_scales
    monkeypatch.setattr(
        _calibrate, "awq_scales", lambda *a: chosen.append(searched(*a)) or chosen[-1]
    )
    q = precision.calibrate(f, params, batches, method="awq+gptq", scaling=dtypes.PerBlock(16))
    ((s, alpha),) = chosen
    assert alpha > 0  # the outlier channels are scaled
    u = np.concatenate(batches).astype(np.float64) * params["g"] + params["b"]  # exact
    scaled = (params["w"].astype(np.float64) * s[:, None]).astype(np.float32)
    want = _reference_gptq(scaled.T, (u.T @ u) / np.outer(s, s), 16, 0.01).T
    np.testing.assert_array_equal(q["w"].numpy(), want.astype(np.float32))
    np.testing.assert_array_equal(q["g"], (params["g"] / s).astype(np.float32))


def test_awq_gptq_loses_less_than_either_method_on_outlier_channels():
    rng = np.random.default_rng(22)
    k, m = 128, 64
    g = rng.uniform(0.5, 1.5, size=k).astype(np.float32)
    g[rng.choice(k, 4, replace=False)] = 40  # four outlier channels
    params = {"g": g, "b": np.zeros(k, np.float32), "w": rng.normal(size=(k, m)) / 10}
    params["w"] = params["w"].astype(np.float32)
    f = lambda p, x: (x * p["g"][None] + p["b"][None]) @ p["w"]
    mix = rng.normal(size=(32, k))  # correlated inputs, as GPTQ meets them
    data = lambda n: (rng.normal(size=(n, 32)) @ mix / 4 + rng.normal(size=(n, k))).astype(
        np.float32
    )
    batches, held = [data(256) for _ in range(4)], data(4096)
    err = {}
    for method in ("gptq", "awq", "awq+gptq"):
        q = precision.calibrate(f, params, batches, method=method, scaling=dtypes.PerBlock(32))
        got = np.asarray(f(precision.to_full_precision(q), held))
        err[method] = float(np.mean((got - np.asarray(f(params, held))) ** 2))
    assert err["awq+gptq"] < 0.9 * min(err["gptq"], err["awq"]), err  # measured: 0.66


def test_awq_int4_loses_less_than_round_to_nearest_on_outlier_channels():
    model = _Block.make()
    rng = np.random.default_rng(9)
    batches = _batches_3d(rng)
    params = _init(model, batches[0], 1)
    held = _batches_3d(np.random.default_rng(10), 2)
    err = {}
    for method in ("rtn", "awq"):
        q = precision.calibrate(
            model.apply, params, batches, method=method, scaling=dtypes.PerBlock(16)
        )
        decoded = precision.to_full_precision(q)
        err[method] = sum(
            float(jnp.mean((model.apply(decoded, x) - model.apply(params, x)) ** 2)) for x in held
        )
    assert err["awq"] < 0.8 * err["rtn"], err


def test_smoothquant_w8a8_loses_less_than_round_to_nearest_w8a8():
    nn = pytest.importorskip("flax.linen")

    class NormDense(nn.Module):  # the layer SmoothQuant is for: its input has outliers
        @nn.compact
        def __call__(self, x):
            return nn.Dense(64)(nn.LayerNorm()(x))

    model = NormDense()
    rng = np.random.default_rng(11)
    batches = _batches_3d(rng)
    params = _init(model, batches[0], 2)
    held = _batches_3d(np.random.default_rng(12), 2)
    err = {}
    for method in ("rtn", "smoothquant"):
        # SmoothQuant's defaults: int8, one scale per output channel
        same = {} if method == "smoothquant" else {"format": "int8", "scaling": dtypes.PerAxis()}
        q = precision.calibrate(model.apply, params, batches, method=method, **same)
        kernel = q["params"]["Dense_0"]["kernel"]
        assert (kernel.format.name, str(kernel.scaling)) == ("int8", "per-axis 1")
        run = precision.apply(model.apply, contract="int8")
        err[method] = sum(
            float(jnp.mean((np.asarray(run(q, x)) - model.apply(params, x)) ** 2)) for x in held
        )
    assert err["smoothquant"] < 0.5 * err["rtn"], err


@pytest.mark.parametrize("method", ["gptq", "awq", "awq+gptq"])
def test_a_small_statistics_budget_runs_more_passes_with_the_same_result(method, capsys):
    model = _Block.make()
    batches = _batches_3d(np.random.default_rng(13), 2)
    params = _init(model, batches[0], 3)
    kw = {"method": method, "scaling": dtypes.PerBlock(16)}
    whole = precision.calibrate(model.apply, params, batches, **kw)
    # every weight's statistics alone: one pass over the batches per weight
    apart = precision.calibrate(model.apply, params, batches, stats_memory=1, progress=True, **kw)
    err = capsys.readouterr().err
    assert "weights 1-1 of 7: batch 2/2 recorded" in err
    assert "weights 7-7 of 7: batch 2/2 recorded" in err
    for a, b in zip(
        jax.tree_util.tree_leaves(whole), jax.tree_util.tree_leaves(apart), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_awq_clip_search_never_loses_to_the_full_range_and_wins_on_outlier_weights():
    from precision._calibrate._smooth import awq_clip

    rng = np.random.default_rng(14)
    k, m, group = 64, 12, 16
    w = rng.normal(size=(k, m)).astype(np.float32)
    w[rng.integers(0, k, 6), rng.integers(0, m, 6)] *= 8  # a few outlier weights
    x = rng.normal(size=(256, k))
    h = x.T @ x

    def rtn(v, axis):
        enc = dtypes.int4.encode(v, scaling=dtypes.PerBlock(group, axis=axis))
        return np.asarray(enc.decode(), np.float64)

    def loss(v):  # per (group, output), independently of numpy's reference rounding
        d = w.astype(np.float64) - rtn(v, 0)
        return np.array(
            [
                np.sum((h[g : g + group, g : g + group] @ d[g : g + group]) * d[g : g + group], 0)
                for g in range(0, k, group)
            ]
        )

    clipped = awq_clip(w, 0, h, group, rtn, 20)
    assert np.all(np.abs(clipped) <= np.abs(w))  # only ever clipped
    assert np.all(loss(clipped) <= loss(w) + 1e-9)
    assert loss(clipped).sum() < 0.9 * loss(w).sum()


def test_arrays_built_from_nothing_inside_f_are_no_trouble():
    # iota, arange, tril: equations without inputs (a causal mask is made of them)
    nn = pytest.importorskip("flax.linen")
    x = np.random.default_rng(15).normal(size=(2, 8, 16)).astype(np.float32)
    params = {"w": np.ones((16, 16), np.float32)}

    def f(p, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))[:, 0]
        scores = jnp.where(mask, (x @ p["w"]) @ x.swapaxes(1, 2), -1e9)
        built = jnp.tril(jnp.ones((8, 16))) + jax.lax.iota(jnp.float32, 16)[None]
        return jax.nn.softmax(scores) @ x + built[None]

    for method in ("rtn", "gptq", "awq"):
        q = precision.calibrate(f, params, [x], method=method, scaling=dtypes.PerBlock(8))
        assert isinstance(q["w"], precision.Tensor)


def test_nan_in_a_batch_names_the_first_weight_that_reads_it():
    # the weights' key order ("a" before "b") is not the order f reads them in
    rng = np.random.default_rng(7)
    params = {"a": rng.normal(size=(16, 4)).astype(np.float32)}
    params["b"] = rng.normal(size=(8, 16)).astype(np.float32)
    x = np.ones((4, 8), np.float32)
    bad = x.copy()
    bad[1, 2] = np.nan
    with pytest.raises(
        precision.CalibrationError,
        match=r"inputs of \['b'\] hold 1 NaN .* batch 1 \(and those of 1 later weight",
    ):
        precision.calibrate(lambda p, a: jnp.tanh(a @ p["b"]) @ p["a"], params, [x, bad])


def test_a_batch_a_flax_model_cannot_take_is_refused_by_name():
    nn = pytest.importorskip("flax.linen")

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4)(nn.LayerNorm()(x))

    model = Model()
    x = np.ones((4, 8), np.float32)
    params = model.init(jax.random.key(0), x)
    # Flax's own error for a parameter of another shape is no ValueError
    with pytest.raises(
        precision.CalibrationError,
        match=r"fails on batch 1 of shapes \(4, 6\) \(batch 0 had shapes \(4, 8\)\): "
        "ScopeParamShapeError",
    ):
        precision.calibrate(model.apply, params, [x, np.ones((4, 6), np.float32)])
