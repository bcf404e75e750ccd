"""`precision.calibrate` on the ways models read weights beyond `x @ w`: a weight contracted
over several axes (attention's output projection), grouped and depthwise convolutions,
weights inside `cond` branches and `while` loops, and what is left (named, never silent).

Each case is checked code for code against GPTQ written out plainly on inputs built
independently (numpy patches, the batches that take a branch, an unrolled loop).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gptq_reference import patches, reference_gptq
from jax import lax

import dtypes
import precision

# These tests check the algorithm, often on few rows; generalising from too few rows
# per input, and its warning, is tested in test_calibrate_rows.py.
pytestmark = pytest.mark.filterwarnings("ignore:calibrate. GPTQ saw fewer:UserWarning")


def _ints(rng, shape, spread=None):
    # integer-valued activations: their Hessian is exact in float32 and float64, so the
    # reference and the code under test start from the same matrix
    x = rng.integers(-3, 4, size=shape)
    return (x if spread is None else x * spread).astype(np.float32)


def _calibrate(f, params, batches, scaling, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", precision.CalibrationWarning)
        warnings.filterwarnings("ignore", "calibrate. GPTQ saw fewer", precision.CalibrationWarning)
        return precision.calibrate(f, params, batches, scaling=scaling, progress=False, **kw)


def test_a_weight_contracted_over_two_axes_is_gptq_of_its_flattened_matrix():
    rng = np.random.default_rng(3)
    heads, dim, out = 4, 8, 12
    w = rng.normal(size=(heads, dim, out)).astype(np.float32)
    batches = [_ints(rng, (16, heads, dim), rng.integers(1, 4, size=dim)) for _ in range(3)]
    q = _calibrate(
        lambda p, x: jnp.einsum("bhd,hdo->bo", x, p["w"]), {"w": w}, batches, dtypes.PerBlock(8)
    )["w"]
    assert q.scaling == dtypes.PerBlock(8, axis=1)  # blocks along the last contracted axis
    x = np.concatenate([b.reshape(-1, heads * dim) for b in batches]).astype(np.float64)
    want = reference_gptq(w.reshape(heads * dim, out).T, x.T @ x, 8, 0.01).T
    np.testing.assert_array_equal(q.numpy(), want.reshape(w.shape).astype(np.float32))


def test_every_kernel_of_flax_attention_is_calibrated():
    nn = pytest.importorskip("flax.linen")
    rng = np.random.default_rng(4)
    model = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=32)
    batches = [rng.normal(size=(2, 8, 32)).astype(np.float32) for _ in range(2)]
    params = model.init(jax.random.key(0), batches[0])
    q = _calibrate(lambda p, x: model.apply(p, x), params, batches, dtypes.PerBlock(8))
    kernels = {k: v["kernel"] for k, v in q["params"].items()}
    assert sorted(kernels) == ["key", "out", "query", "value"]
    assert all(isinstance(k, precision.Tensor) for k in kernels.values()), kernels
    assert kernels["out"].shape == (4, 8, 32)


@pytest.mark.parametrize(
    ("channels", "groups", "outputs", "scaling"),
    [(4, 2, 6, dtypes.PerBlock(2)), (3, 3, 3, dtypes.PerAxis())],
    ids=["grouped", "depthwise"],
)
def test_a_grouped_convolution_is_gptq_of_each_group_on_its_own_patches(
    channels, groups, outputs, scaling
):
    rng = np.random.default_rng(5)
    kernel = rng.normal(size=(3, 3, channels // groups, outputs)).astype(np.float32)

    def f(p, x):
        return lax.conv_general_dilated(
            x, p["k"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=groups,
        )  # fmt: skip

    batches = [_ints(rng, (2, 5, 5, channels)) for _ in range(2)]
    q = _calibrate(f, {"k": kernel}, batches, scaling)["k"]
    per_in, per_out = channels // groups, outputs // groups
    want = np.zeros_like(kernel, np.float64)
    for g in range(groups):
        x = np.concatenate([patches(b[..., g * per_in : (g + 1) * per_in], 3) for b in batches])
        w = kernel[..., g * per_out : (g + 1) * per_out].reshape(-1, per_out)
        group = per_in if isinstance(scaling, dtypes.PerBlock) else w.shape[0]
        part = reference_gptq(w.T, x.T @ x, group, 0.01).T
        want[..., g * per_out : (g + 1) * per_out] = part.reshape(3, 3, per_in, per_out)
    np.testing.assert_array_equal(q.numpy(), want.astype(np.float32))


def _branchy(p, batch):
    x, flag = batch
    # the other branch computes its own input (exactly, on integers)
    return lax.cond(flag, lambda x: x @ p["a"], lambda x: (2 * x + 1) @ p["b"], x)


def test_weights_in_cond_branches_get_the_statistics_of_the_batches_that_took_them():
    rng = np.random.default_rng(6)
    params = {k: rng.normal(size=(16, 8)).astype(np.float32) for k in "ab"}
    batches = [(_ints(rng, (8, 16)), np.bool_(i in (0, 2, 3))) for i in range(5)]
    q = _calibrate(_branchy, params, batches, dtypes.PerBlock(8))
    for name, took, act in (("a", True, lambda x: x), ("b", False, lambda x: 2 * x + 1)):
        x = np.concatenate([act(x) for x, flag in batches if flag == took]).astype(np.float64)
        want = reference_gptq(params[name].T, x.T @ x, 8, 0.01).T
        np.testing.assert_array_equal(q[name].numpy(), want.astype(np.float32), err_msg=name)


def test_a_branch_no_batch_took_is_refused_by_name():
    rng = np.random.default_rng(7)
    params = {k: rng.normal(size=(16, 8)).astype(np.float32) for k in "ab"}
    batches = [(_ints(rng, (8, 16)), np.bool_(True)) for _ in range(2)]
    with pytest.raises(precision.CalibrationError, match=r"\['b'\] met no activation in the 2"):
        precision.calibrate(_branchy, params, batches, progress=False)
    q = _calibrate(_branchy, params, batches, dtypes.PerBlock(8), exclude="b")
    assert isinstance(q["a"], precision.Tensor)
    assert not isinstance(q["b"], precision.Tensor)


def test_a_weight_in_a_while_loop_sums_the_iterations_that_ran():
    rng = np.random.default_rng(8)
    # quarters times small integers: every product and Hessian entry is exact in float32
    params = {"w": (rng.integers(-3, 4, size=(8, 8)) / 4).astype(np.float32)}

    def looped(p, batch):
        x, n = batch
        return lax.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, s[1] @ p["w"]), (0, x))[1]

    batches = [(_ints(rng, (4, 8)), np.int32(n)) for n in (1, 3, 0, 2)]
    q = _calibrate(looped, params, batches, dtypes.PerBlock(8))
    seen = []  # the loop unrolled by hand: the inputs of each iteration that ran
    for x, n in batches:
        y = x.astype(np.float64)
        for _ in range(int(n)):
            seen.append(y)
            y = y @ params["w"].astype(np.float64)
    x = np.concatenate(seen)
    want = reference_gptq(params["w"].T, x.T @ x, 8, 0.01).T
    np.testing.assert_array_equal(q["w"].numpy(), want.astype(np.float32))


def test_a_weight_read_in_a_way_calibration_does_not_record_is_named_not_skipped():
    rng = np.random.default_rng(9)
    params = {
        "per_head": rng.normal(size=(4, 8, 8)).astype(np.float32),
        "stack": rng.normal(size=(2, 32, 32)).astype(np.float32),
        "w": rng.normal(size=(32, 8)).astype(np.float32),
        "emb": rng.normal(size=(10, 32)).astype(np.float32),
    }

    def f(p, batch):
        x, tokens = batch
        x = x + p["emb"][tokens]  # a lookup: an activation, not a weight, from here on
        # one matrix per head: the contraction batches over the weight's axis 0
        y = jnp.einsum("bhd,hde->bhe", x.reshape(-1, 4, 8), p["per_head"]).reshape(-1, 32)
        # layers picked from a stack by index inside a loop (not scanned over)
        y = lax.fori_loop(0, 2, lambda i, y: jnp.tanh(y @ p["stack"][i]), y)
        return y @ p["w"]

    batches = [(rng.normal(size=(6, 32)).astype(np.float32), np.arange(6) % 10)]
    with pytest.warns(precision.CalibrationWarning) as caught:
        q = precision.calibrate(f, params, batches, scaling=dtypes.PerBlock(8), progress=False)
    (message,) = [str(w.message) for w in caught if "GPTQ saw fewer" not in str(w.message)]
    assert "['per_head'] (its contraction batches over one of its axes)" in message
    assert "['stack'] (it reaches its contraction through `dynamic_slice`" in message
    assert "emb" not in message
    assert isinstance(q["w"], precision.Tensor)
    assert not isinstance(q["per_head"], precision.Tensor)
    assert not isinstance(q["stack"], precision.Tensor)
    with pytest.raises(precision.CalibrationError, match="batches over one of its axes"):
        precision.calibrate(f, params, batches, where="per_head", progress=False)


def test_sequential_gptq_calibrates_each_layer_on_the_rounded_layers_before_it():
    rng = np.random.default_rng(10)
    params = {
        "w1": rng.normal(size=(16, 16)).astype(np.float32),
        "w2": rng.normal(size=(16, 8)).astype(np.float32),
    }

    def mlp(p, x):
        return jax.nn.relu(x @ p["w1"]) @ p["w2"]

    scaling = dtypes.PerBlock(8)
    batches = [_ints(rng, (12, 16)) for _ in range(3)]
    seq = _calibrate(mlp, params, batches, scaling, sequential=True)
    plain = _calibrate(mlp, params, batches, scaling)
    np.testing.assert_array_equal(seq["w1"].numpy(), plain["w1"].numpy())  # the first layer
    # the second layer: GPTQ (tested code for code above) on what the rounded first
    # layer hands it, computed by plain JAX on the decoded weights
    q1 = jnp.asarray(seq["w1"].numpy())
    inputs = [np.asarray(jax.jit(lambda x: jax.nn.relu(x @ q1))(x)) for x in batches]
    second = _calibrate(lambda p, y: y @ p["w2"], {"w2": params["w2"]}, inputs, scaling)
    np.testing.assert_array_equal(seq["w2"].numpy(), second["w2"].numpy())
    assert not np.array_equal(seq["w2"].numpy(), plain["w2"].numpy())
    with pytest.raises(precision.CalibrationError, match="sequential=True is GPTQ's"):
        precision.calibrate(mlp, params, batches, method="awq", sequential=True)


def test_sequential_passes_once_per_stage_of_weights_that_read_the_same_input(capsys):
    rng = np.random.default_rng(11)
    params = {n: rng.normal(size=(16, 16)).astype(np.float32) for n in "qkvo"}

    def attention(p, x):
        q, k, v = (x @ p[n] for n in "qkv")
        return jax.nn.softmax(q @ k.T / 4) @ v @ p["o"]

    batches = [rng.normal(size=(8, 16)).astype(np.float32) for _ in range(2)]
    precision.calibrate(
        attention, params, batches, scaling=dtypes.PerBlock(8), sequential=True, progress=True
    )
    passes = [line for line in capsys.readouterr().err.splitlines() if "batch 2/2" in line]
    assert [line.split(":")[1].strip() for line in passes] == [
        "weights 1-3 of 4",  # query, key and value read x: one pass
        "weights 4-4 of 4",  # the output projection reads what the rounded three made
    ]


def _custom_vjp_matmul():
    @jax.custom_vjp
    def mm(x, w):
        return x @ w

    mm.defvjp(lambda x, w: (x @ w, (x, w)), lambda r, g: (g @ r[1].T, r[0].T @ g))
    return mm


def _custom_jvp_matmul():
    @jax.custom_jvp
    def mm(x, w):
        return x @ w

    mm.defjvp(lambda p, t: (p[0] @ p[1], t[0] @ p[1] + p[0] @ t[1]))
    return mm


def _checkpointed_matmul():
    return jax.checkpoint(lambda x, w: x @ w)


@pytest.mark.parametrize(
    "wrap",
    [_custom_vjp_matmul, _custom_jvp_matmul, _checkpointed_matmul],
    ids=["custom_vjp", "custom_jvp", "checkpoint"],
)
def test_a_weight_inside_a_custom_derivative_or_checkpoint_is_calibrated(wrap):
    """The function these wrappers hold is walked as it runs: its weight is GPTQ of its
    own inputs, code for code, like an unwrapped `x @ w`."""
    rng = np.random.default_rng(8)
    w = rng.normal(size=(16, 6)).astype(np.float32)
    batches = [_ints(rng, (32, 16), rng.integers(1, 4, size=16)) for _ in range(3)]
    mm = wrap()
    q = _calibrate(lambda p, x: mm(x, p["w"]), {"w": w}, batches, dtypes.PerBlock(8))["w"]
    x = np.concatenate(batches).astype(np.float64)
    want = reference_gptq(w.T, x.T @ x, 8, 0.01).T
    np.testing.assert_array_equal(q.numpy(), want.astype(np.float32))
