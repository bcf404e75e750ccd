"""Policy: parsing (long, short, named forms and every wrong way), and casting trees."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import dtypes
import precision
from precision import Policy


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("params=float32,compute=bfloat16,output=float32", ("float32", "bfloat16", "float32")),
        ("p=f32,c=bf16,o=f32", ("float32", "bfloat16", "float32")),
        ("p=f32,c=bf16", ("float32", "bfloat16", "float32")),
        ("c=fp16", ("float32", "float16", "float32")),
        ("params=bf16", ("bfloat16", "bfloat16", "bfloat16")),
        (" Param = FP32 , Compute = E4M3 ", ("float32", "float8_e4m3fn", "float32")),
        ("compute=int8", ("float32", "int8", "float32")),
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
        ("mixed_bf16", "unknown name.*mixed_bfloat16, mixed_float16.*params=FORMAT"),
        ("weights=bf16", "unknown field 'weights'.*params, param, p, compute, c, output, o"),
        ("compute=bf17", "unknown format 'bf17' for compute.*bfloat16"),
        ("compute", "unknown name"),
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


def test_cast_to_int8_compute():
    out = Policy.parse("c=int8").cast_to_compute(_tree())
    assert out["w"].format is dtypes.int8
    assert out["b"].format is dtypes.int8


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
