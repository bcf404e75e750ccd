"""Convolutions under `apply` reach the kernels XLA:CPU gives plain JAX.

XLA:CPU's fast convolution kernel takes one operand layout; a convolution XLA
has not brought into that form before it runs runs in a naive loop, 16-28x
slower. A platform choice whose index crosses a `jit` boundary as a residual
kept the transposed convolutions of a training step in a conditional until
after that rewrite (the demo's bf16-mixed step took 360 ms instead of 22). So
each compiled training step here, directly and under a caller's nested `jit`,
must hold the convolutions the plain float32 step holds, in the same forms.
"""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import dtypes
import precision

_CONV = re.compile(r" convolution\(.*?dim_labels=([^,\s]+)")


def _conv_forms(fn, *args) -> collections.Counter[str]:
    text = jax.jit(fn).lower(*args).compile().as_text()
    return collections.Counter(_CONV.findall(text))


def _cnn(w1, w2, x):
    dn = ("NHWC", "HWIO", "NHWC")
    h = jnp.tanh(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
    h = lax.conv_general_dilated(h, w2, (1, 1), "SAME", dimension_numbers=dn)
    return jnp.sum(h * h)


def _args():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    w1 = jax.random.normal(k1, (3, 3, 4, 8))
    w2 = jax.random.normal(k2, (3, 3, 8, 8))
    x = jax.random.normal(k3, (16, 8, 8, 4))
    return w1, w2, x


@pytest.mark.parametrize("nested", [False, True], ids=["direct", "nested-jit"])
@pytest.mark.parametrize("compute", ["bfloat16", "float16", "tf32"])
def test_training_step_convolutions_take_plain_jax_forms(compute, nested):
    model = precision.apply(_cnn)

    def ours(w1, w2, x):
        fmt = dtypes.get(compute)
        w1, w2 = (precision.Tensor(w).to_reduced_precision(fmt) for w in (w1, w2))
        out = model(w1, w2, precision.Tensor(x).to_reduced_precision(fmt))
        return precision.to_full_precision(out)

    inner = jax.jit(ours) if nested else ours
    plain = jax.jit(_cnn) if nested else _cnn
    args = _args()
    expected = _conv_forms(jax.grad(plain, argnums=(0, 1)), *args)
    assert sum(expected.values()) >= 5  # two forward convolutions, three backward
    assert _conv_forms(jax.grad(inner, argnums=(0, 1)), *args) == expected
