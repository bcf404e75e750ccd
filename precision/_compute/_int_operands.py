"""Integer storage as a contraction takes it: its codes, and its scales when they factor out.

An integer contraction `sum_k (c_a[k] * s_a[k]) * (c_b[k] * s_b[k])` equals
`s_a * s_b * sum_k c_a[k] * c_b[k]` (int32 accumulation of the codes, then one
rescale) only when neither operand's scale varies along a summed dim. That
holds for a dim `d` exactly when the scaling has one group along it,
`scaling.scale_shape(shape)[d] == 1`:

- `PerTensor`: always;
- `PerAxis(axis)`: when `axis` is not summed;
- `PerBlock(size, axis)`: only when every summed dim has one group, i.e. the
  block axis is kept or one block spans it, *and* every other summed dim has
  size 1. A `(K, N)` kernel blocked along N has a scale for each of its K
  rows, so it never factors out of a sum over K.

Everything else is decoded at the contraction (see `_contractions`). Both the
exact `Tensor @ Tensor` path and the declared W8A8 contraction (`_quantized`)
ask this module, so the rule lives once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dtypes

from .._storage import decode_storage
from ._state import Stored

__all__ = ["codes", "dot_operands", "kept_scale"]


def dot_operands(a: jax.Array, b: jax.Array, dims: Any) -> tuple[jax.Array, jax.Array]:
    """Integer codes as an `s8 x s8 -> s32` `dot_general` is handed them.

    Where the contracted length is not a multiple of 4, zero codes extend the
    last contracted dim of both operands to one: they add nothing to an
    integer sum. XLA:GPU's GEMM fusion returns twice the product of a plain
    `s8` `dot_general` whose contracted length is not a multiple of 4 (jax
    0.11.2 on an H100, with or without batch dims, whatever the layout;
    `benchmarks/backend_diff.py` part 5), and is right when it is one. Done on
    every backend, so every backend runs the same program.
    """
    (lc, rc), _ = dims
    if not lc or not jnp.issubdtype(a.dtype, jnp.integer):
        return a, b
    if math.prod(a.shape[d] for d in lc) % 4 == 0:
        return a, b
    extra = -a.shape[lc[-1]] % 4
    a = jnp.pad(a, [(0, extra if d == lc[-1] else 0) for d in range(a.ndim)])
    b = jnp.pad(b, [(0, extra if d == rc[-1] else 0) for d in range(b.ndim)])
    return a, b


def codes(stored: Stored | dtypes.Encoded) -> jax.Array:
    """The integer codes of an integer encoding (unpacked), as int8."""
    enc = stored.enc if isinstance(stored, Stored) else stored
    if not enc.format.packed:
        return enc.data
    assert enc.scale is not None  # integer storage is always scaled
    assert enc.scaling is not None
    # Unit float32 scales decode to the codes themselves, exactly.
    unit = dataclasses.replace(enc.scaling, scale_format="float32", power_of_two=False)
    ones = jnp.ones(enc.scale.shape, jnp.float32)
    last = enc.shape[-1] if enc.shape else None
    return decode_storage(enc.format, enc.data, ones, unit, last, np.float32).astype(np.int8)


def kept_scale(enc: dtypes.Encoded, summed: tuple[int, ...], kept: list[int]) -> Any | None:
    """The operand's float32 scales over its `kept` dims (in that order), or None
    when they vary along a `summed` dim (then they do not factor out of the sum).

    Asymmetric encodings (a zero point) never factor out: their codes are not
    proportional to the values.
    """
    if enc.zero_point is not None or enc.scaling is None:
        return None
    shape, scaling = enc.shape, enc.scaling
    scales = enc.group_scales()
    assert scales is not None  # integer storage is always scaled
    if not shape:
        return scales.reshape(())
    groups = scaling.scale_shape(shape)
    if any(groups[d] != 1 for d in summed):
        return None
    full = scaling.broadcast(scales.reshape(groups), shape)
    for d in sorted(summed, reverse=True):  # constant along these: take index 0
        full = lax.index_in_dim(full, 0, axis=d, keepdims=False)
    rest = [d for d in range(len(shape)) if d not in summed]
    return jnp.transpose(full, [rest.index(d) for d in kept])
