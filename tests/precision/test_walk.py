"""The walk of a jaxpr under `precision.apply`: what crosses into the functions that
`jax.checkpoint`, `custom_vjp` and `custom_jvp` hold, and the bodies of `shard_map`."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec

import dtypes
import precision


def _custom_vjp(f):
    g = jax.custom_vjp(f)
    g.defvjp(lambda *a: (f(*a), a), lambda a, ct: jax.vjp(f, *a)[1](ct))
    return g


def _custom_jvp(f):
    g = jax.custom_jvp(f)
    g.defjvp(lambda p, t: jax.jvp(f, p, t))
    return g


WRAPPERS = {"checkpoint": jax.checkpoint, "custom_vjp": _custom_vjp, "custom_jvp": _custom_jvp}


def _dot_operands(text: str) -> list[tuple[str, str]]:
    found = re.findall(r"dot_general[^\n]*: \(tensor<([^>]*)>, tensor<([^>]*)>\)", text)
    return [(a.split("x")[-1], b.split("x")[-1]) for a, b in found]


@pytest.mark.parametrize("wrap", list(WRAPPERS), ids=list(WRAPPERS))
def test_stored_integer_operands_reach_a_wrapped_contraction_as_codes(wrap):
    """An int8 weight and input passed into the function a wrapper holds stay codes up
    to their contraction (the exact integer dot), instead of float32 decoded where they
    enter; the result and its gradient are those of the unwrapped call."""
    x = precision.Tensor(jax.random.normal(jax.random.key(0), (8, 32))).to_reduced_precision("int8")
    w = precision.Tensor(jax.random.normal(jax.random.key(1), (32, 4))).to_reduced_precision(
        "int8", scaling=dtypes.PerAxis(-1)
    )
    plain = precision.apply(lambda x, w: x @ w)
    wrapped = precision.apply(lambda x, w: WRAPPERS[wrap](lambda a, b: a @ b)(x, w))
    text = jax.jit(wrapped).lower(x, w).as_text()
    assert ("i8", "i8") in _dot_operands(text), _dot_operands(text)
    np.testing.assert_array_equal(np.asarray(wrapped(x, w)), np.asarray(plain(x, w)))


@pytest.mark.parametrize("wrap", list(WRAPPERS), ids=list(WRAPPERS))
def test_gradients_through_a_wrapper_are_the_wrappers_own(wrap):
    w = jax.random.normal(jax.random.key(1), (32, 4))
    x = jax.random.normal(jax.random.key(0), (8, 32))
    stored = precision.Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1))

    def loss(x, w):
        return jnp.sum(WRAPPERS[wrap](lambda a, b: a @ b)(x, w) ** 2)

    # (a float32 result: its values are exactly what the rules computed in)
    dx = jax.grad(lambda x: jnp.asarray(precision.apply(loss)(x, stored)))(x)
    want = jax.grad(loss)(x, jnp.asarray(stored.to_full_precision().numpy()))
    np.testing.assert_allclose(np.asarray(dx), np.asarray(want), rtol=1e-5)


def test_a_shard_map_body_rounds_every_op():
    """Each op inside the mapped body is rounded onto bfloat16, as outside it (before,
    the whole body ran in float32 and only its result was rounded)."""
    mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    body = jax.shard_map(
        lambda a: (a * 1.01) * 1.01,
        mesh=mesh,
        in_specs=PartitionSpec("x"),
        out_specs=PartitionSpec("x"),
    )
    values = np.float32([1.0, 1.25, 3.0, 0.3])
    t = precision.Tensor(jnp.asarray(values)).to_reduced_precision("bfloat16")
    out = precision.apply(body)(t)
    bf16 = ml_dtypes.bfloat16
    c = np.float32(bf16(1.01))
    a = values.astype(bf16).astype(np.float32)
    want = ((a * c).astype(bf16).astype(np.float32) * c).astype(bf16).astype(np.float32)
    assert out.format.name == "bfloat16"
    np.testing.assert_array_equal(out.numpy(), want)
