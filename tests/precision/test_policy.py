"""Policy: parsing (long, short, named forms and every wrong way), and casting trees."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive

import dtypes
import precision
from precision import Policy

# A primitive of the user's own, bound at module level like JAX's.
_OWN_PRIMITIVE = Primitive("precision_test_own_op")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("params=float32,compute=bfloat16,output=float32", ("float32", "bfloat16", "float32")),
        ("p=f32,c=bf16,o=f32", ("float32", "bfloat16", "float32")),
        ("p=f32,c=bf16", ("float32", "bfloat16", "float32")),
        ("c=fp16", ("float32", "float16", "float32")),
        ("params=bf16", ("bfloat16", "bfloat16", "bfloat16")),
        (" Param = FP32 , Compute = E4M3 ", ("float32", "float8_e4m3fn", "float32")),
        ("params=int8,o=f32", ("int8", "float32", "float32")),
        ("o=f32,c=tf32,p=f32", ("float32", "tf32", "float32")),
        ("mixed_bfloat16", ("float32", "bfloat16", "float32")),
        ("mixed_float16", ("float32", "float16", "float32")),
        ("float32", ("float32", "float32", "float32")),
        ("bf16", ("bfloat16", "bfloat16", "bfloat16")),
    ],
)
def test_parse(text, expected):
    policy = Policy.parse(text)
    assert (policy.params, policy.compute, policy.output) == tuple(dtypes.get(n) for n in expected)
    # str() is itself parsable and gives the same policy back.
    assert Policy.parse(str(policy)) == policy


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty policy.*mixed_bfloat16"),
        ("mixed_bf16", "not a policy name.*mixed_bfloat16, mixed_float16.*params=FORMAT"),
        ("weights=bf16", "unknown field 'weights'.*params, param, p, compute, c, output, o"),
        ("compute=bf17", "field compute: unknown format 'bf17' .did you mean 'bf16'.*bfloat16"),
        ("compute", "not a policy name"),
        ("compute=bf16,output", "cannot read 'output'.*KEY=FORMAT"),
        ("c=bf16=fp16", "cannot read"),
        ("c=bf16,compute=fp16", "field 'compute' given twice"),
        ("p=f32,,c=bf16", "cannot read ''"),
    ],
)
def test_parse_errors_say_what_was_expected(text, match):
    with pytest.raises(ValueError, match=match):
        Policy.parse(text)


def test_parse_refuses_non_strings():
    with pytest.raises(TypeError, match="string"):
        Policy.parse(16)


def test_constructor_resolves_names_and_defaults_to_params():
    policy = Policy(params="f32", compute="bf16")
    assert policy.output is dtypes.float32
    assert Policy(params="bf16") == Policy("bfloat16", "bfloat16", "bfloat16")
    with pytest.raises(precision.FormatError):
        Policy(compute="nope")
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.compute = dtypes.float16


def test_float32_ops_take_every_primitive_a_jaxpr_can_hold():
    def model(x, w):
        h = jax.nn.gelu(x @ w)
        h = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)
        return jax.nn.log_softmax(jnp.cumsum(h, axis=0)).sum()

    x = jnp.ones((4, 8))
    jaxpr = jax.make_jaxpr(jax.grad(model, argnums=1))(x, jnp.ones((8, 8)))
    traced = {e.primitive.name for e in jaxpr.eqns}
    assert "dot_general" in traced
    assert Policy(float32_ops=traced).float32_ops == traced
    assert Policy(float32_ops=precision.DEFAULT_FLOAT32_OPS).float32_ops  # each a primitive
    own = Policy(compute="bf16", float32_ops={"exp", "precision_test_own_op"})
    assert own.with_output("bf16").float32_ops == {"exp", "precision_test_own_op"}


def test_every_default_float32_op_is_a_primitive_of_this_jax():
    # the check skips the default names: a JAX rename would make one dead
    from precision._jax_compat import primitive_names

    assert precision.DEFAULT_FLOAT32_OPS <= primitive_names()


@pytest.mark.parametrize(
    ("ops", "named", "suggested"),
    [
        ({"exp", "softmaxx"}, "names 'softmaxx', but", []),  # the known 'exp' is not listed
        ({"layer_norm"}, "'layer_norm'", []),
        ({"reduce_summ"}, "'reduce_summ'", ["'reduce_sum'"]),
        ({"sum", "Exp"}, "'sum'", ["'reduce_sum'", "'exp'"]),
        ({"dot"}, "'dot'", ["'dot_general'"]),
        ({"erfinv"}, "'erfinv'", ["'erf_inv'"]),
    ],
)
def test_float32_ops_names_no_primitive_has_are_refused_with_close_names(ops, named, suggested):
    with pytest.raises(precision.PolicyError) as info:
        Policy(compute="bf16", float32_ops=ops)
    message = str(info.value)
    assert named in message
    assert all(s in message for s in suggested), message


def _tree():
    return {
        "w": jnp.linspace(-1, 1, 12, dtype=jnp.float32).reshape(3, 4),
        "b": jnp.full(4, 0.1, jnp.float32),
        "step": jnp.int32(3),
    }


def test_cast_to_compute_reduced_gives_tensors_and_keeps_integers():
    tree = _tree()
    out = Policy.parse("mixed_bfloat16").cast_to_compute(tree)
    assert isinstance(out["w"], precision.Tensor)
    assert out["w"].format is dtypes.bfloat16
    assert out["step"].dtype == jnp.int32
    assert int(out["step"]) == 3
    # Values: independently rounded by ml_dtypes.
    import ml_dtypes

    expected = np.asarray(tree["w"]).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(out["w"]), expected)


@pytest.mark.parametrize("spelling", ["c=int8", "c=mxfp4", "c=nf4"])
def test_a_storage_encoding_is_refused_as_compute_format_at_once(spelling):
    # It used to be accepted here and refused only when apply ran under the policy.
    name = spelling[2:]
    with pytest.raises(precision.FormatError) as info:
        Policy.parse(spelling)
    said = str(info.value)
    assert f"compute={name!r} is a storage encoding" in said
    assert f"params={name!r}" in said
    assert 'compute="bfloat16"' in said


def test_storage_params_compute_in_the_logical_dtype():
    policy = Policy.parse("params=int8,output=float32")
    assert policy.compute is dtypes.float32
    assert Policy.parse("params=int8").compute is dtypes.float32
    kept = policy.cast_to_param(_tree())
    assert kept["w"].format is dtypes.int8
    x = precision.Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    out = precision.apply(lambda w, v: v @ w.T, policy=policy)(kept["w"], x)
    ref = np.asarray(x) @ np.asarray(kept["w"]).T  # decoded int8 weight, float32 arithmetic
    np.testing.assert_array_equal(np.asarray(out), ref)


def test_cast_to_full_precision_gives_plain_arrays_of_that_dtype():
    policy = Policy.parse("mixed_float16")
    reduced = policy.cast_to_compute(_tree())
    back = policy.cast_to_output(reduced)
    assert not precision.is_reduced_precision(back)
    assert type(back["w"]) is type(jnp.zeros(1))
    assert back["w"].dtype == jnp.float32
    expected = np.asarray(_tree()["w"]).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(back["w"]), expected)
    # A float16 array cast to a float32 param policy becomes float32.
    half = {"x": jnp.ones(2, jnp.float16)}
    assert policy.cast_to_param(half)["x"].dtype == jnp.float32
