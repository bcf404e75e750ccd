"""Integer storage meets integer storage in a contraction: every pair of scalings.

Each pair either takes the exact int32 path (scales that factor out of the sum)
or decodes; both must give the product of the *decoded* operands. The
reference is numpy in float64 on the values each Tensor decodes to, and the
bound is float32 accumulation's: |out - ref| <= 2 K eps32 sum|a||b|.

Before the fix, a kernel blocked along its kept axis took the exact path with
the scales of row 0 of the summed axis: 20-45% off.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from sampling import HUNT

import dtypes
import precision
from precision import Tensor

EPS32 = float(np.finfo(np.float32).eps)


def _scalings(ndim: int, block: int) -> list[dtypes.Scaling]:
    out: list[dtypes.Scaling] = [
        dtypes.PerTensor(),
        dtypes.PerTensor(power_of_two=True),
        dtypes.PerTensor(scale_format="bfloat16"),
    ]
    for axis in range(ndim):
        out.append(dtypes.PerAxis(axis))
        out.append(dtypes.PerBlock(block, axis=axis))
    out.append(dtypes.PerAxis(0, scale_format="float16"))
    out.append(dtypes.PerBlock(block, axis=-1, power_of_two=True, scale_format="float8_e8m0fnu"))
    return out


def _operand(rng: np.random.Generator, shape: tuple[int, ...], fmt: str, scaling) -> Tensor:
    # A wide spread of magnitudes across rows and columns, so that a scale taken from
    # the wrong group is visibly wrong.
    x = rng.normal(size=shape) * np.exp(rng.uniform(-3, 3, size=shape))
    return Tensor(x.astype(np.float32)).to_reduced_precision(fmt, scaling=scaling)


def _decoded(t: Tensor) -> np.ndarray:
    return np.asarray(t.to_full_precision().numpy(), np.float64)


def _check(out, a: np.ndarray, b: np.ndarray, ref_fn) -> None:
    out = np.asarray(out, np.float64)
    ref = ref_fn(a, b)
    bound = ref_fn(np.abs(a), np.abs(b))
    k = a.size  # generous: any summed length is below it
    err = np.abs(out - ref)
    assert np.all(err <= 2 * k * EPS32 * bound + 1e-30), float(np.max(err / (bound + 1e-30)))


# Every right-hand scaling against the left-hand scalings that differ in kind: one
# along the summed axis (whole or in blocks), one along the kept axis (whole or in
# blocks), one for the tensor, and narrow and power-of-two scales (all pairs under
# the hunt profile, tests/sampling.py).
_LEFT_2D = _scalings(2, 16) if HUNT else [
    dtypes.PerTensor(),
    dtypes.PerTensor(power_of_two=True),
    dtypes.PerAxis(0, scale_format="float16"),
    dtypes.PerAxis(1),
    dtypes.PerBlock(16, axis=0),
    dtypes.PerBlock(16, axis=-1, power_of_two=True, scale_format="float8_e8m0fnu"),
]  # fmt: skip
_PAIRS_2D = list(itertools.product(_LEFT_2D, _scalings(2, 16)))


@pytest.mark.parametrize(("sa", "sb"), _PAIRS_2D, ids=[f"{a}|{b}" for a, b in _PAIRS_2D])
def test_matmul_every_scaling_pair(sa, sb):
    rng = np.random.default_rng(abs(hash((str(sa), str(sb)))) % 2**32)
    x = _operand(rng, (12, 48), "int8", sa)
    w = _operand(rng, (48, 40), "int4", sb)
    a, b = _decoded(x), _decoded(w)
    _check((x @ w).numpy(), a, b, np.matmul)
    # the same through apply, inside jit: apply already compiles its own jax.jit per
    # signature, so the outer one traces the same program over traced Tensor leaves; in CI
    # every right-hand scaling meets it once, against the per-tensor left (all under hunt)
    if HUNT or sa == _LEFT_2D[0]:
        out = jax.jit(precision.apply(lambda p, q: p @ q))(x, w)
        _check(out.numpy(), a, b, np.matmul)


# The batched einsum likewise: every right-hand scaling against the left-hand ones
# that differ in kind (all pairs under the hunt profile).
_LEFT_3D = _scalings(3, 8) if HUNT else [
    dtypes.PerTensor(), dtypes.PerAxis(1), dtypes.PerBlock(8, axis=2), dtypes.PerBlock(8, axis=0)
]  # fmt: skip
_PAIRS_3D = [
    (sa, sb)
    for sa, sb in itertools.product(_LEFT_3D, _scalings(3, 8))
    if "power of two" not in str(sa) or "power of two" not in str(sb)
]


@pytest.mark.parametrize(("sa", "sb"), _PAIRS_3D, ids=[f"{a}|{b}" for a, b in _PAIRS_3D])
def test_batched_einsum_every_scaling_pair(sa, sb):
    rng = np.random.default_rng(abs(hash((str(sa), str(sb), 3))) % 2**32)
    x = _operand(rng, (3, 10, 24), "int8", sa)
    w = _operand(rng, (3, 24, 16), "int4", sb)
    a, b = _decoded(x), _decoded(w)
    out = precision.apply(lambda p, q: jnp.einsum("bmk,bkn->bmn", p, q))(x, w)
    _check(out.numpy(), a, b, lambda p, q: np.einsum("bmk,bkn->bmn", p, q))


def _conv(p, q):
    return lax.conv_general_dilated(
        p, q, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _conv_np(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    n, h, w, _ = p.shape
    kh, kw, _, o = q.shape
    out = np.zeros((n, h - kh + 1, w - kw + 1, o))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nhwc,co->nhwo", p[:, i : i + h - kh + 1, j : j + w - kw + 1], q[i, j])
    return out


_CONV_INPUT = [dtypes.PerTensor(), dtypes.PerAxis(0), dtypes.PerBlock(8, axis=-1)]
_CONV_KERNEL = [dtypes.PerTensor(), *[dtypes.PerAxis(d) for d in range(4)]] + [
    dtypes.PerBlock(8, axis=d) for d in (2, 3)
]
_PAIRS_CONV = list(itertools.product(_CONV_INPUT, _CONV_KERNEL))


@pytest.mark.parametrize(("sa", "sb"), _PAIRS_CONV, ids=[f"{a}|{b}" for a, b in _PAIRS_CONV])
def test_convolution_every_scaling_pair(sa, sb):
    rng = np.random.default_rng(abs(hash((str(sa), str(sb), 4))) % 2**32)
    x = _operand(rng, (2, 6, 6, 16), "int8", sa)
    w = _operand(rng, (3, 3, 16, 24), "int4", sb)
    a, b = _decoded(x), _decoded(w)
    out = precision.apply(_conv)(x, w)
    _check(out.numpy(), a, b, _conv_np)


@pytest.mark.parametrize(
    "sb",
    [dtypes.PerAxis(1), dtypes.PerBlock(32), dtypes.PerBlock(32, axis=0), dtypes.PerTensor()],
    ids=str,
)
def test_declared_int8_contraction_over_int4_storage(sb):
    """`contract="int8"` over int4 weights of any scaling: within W8A8's error of the
    decoded product (per-row int8 activations, weights used as stored or re-quantized)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(32, 64)).astype(np.float32)
    w = _operand(rng, (64, 96), "int4", sb)
    ref = x.astype(np.float64) @ _decoded(w)
    out = np.asarray(precision.apply(lambda p, q: p @ q, contract="int8")(x, w).numpy())
    rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert rel < 0.02, rel  # 0.24-0.29 before the fix
