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
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dtypes

from .._storage import decode_storage
from ._state import Stored

__all__ = ["codes", "kept_scale"]


def codes(stored: Stored) -> jax.Array:
    """The integer codes of an integer encoding (unpacked), as int8."""
    enc = stored.enc
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
