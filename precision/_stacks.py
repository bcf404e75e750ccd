"""Stacks of layers mapped from outside `apply`: every layer given its own scales.

`jax.vmap` and `lax.scan` slice each array of a Tensor along the stacking
axis. A stack whose scale is shared by every layer (`PerTensor()`,
`PerAxis(-1)`, NVFP4's float32 tensor scale) has one scale row for all of
them, which JAX cannot slice.
`scales_per_layer` repeats that row once per layer: the codes are untouched,
every value decodes to the same bits, and the scaling becomes the per-layer
one (`PerAxis(0)`, `PerAxis((0, -1))`) that maps (docs/models.md, "Stacked
layers under vmap and scan").
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

import dtypes

from ._codes_layout import held_axis
from ._tensor import Tensor


def scales_per_layer(tree: Any, axis: int = 0) -> Any:
    """`tree` with each Tensor's scales repeated along the stacking `axis`.

    A Tensor whose scales (and zero points) already vary along `axis` is
    returned as it is; one that shares them across the stack holds them once
    per layer afterwards. The codes are not re-encoded, so every value
    decodes exactly as before; the storage grows by one scale row per layer.
    Leaves that are not Tensors pass through.

    Args:
        tree: a pytree holding stacked Tensors (a Tensor itself is a tree).
        axis: the stacking axis the tree will be mapped over.

    A two-level encoding (NVFP4) has its float32 tensor scale repeated the
    same way, shaped `(layers, 1, 1)`.

    Raises:
        ScalingError: blocks that run along `axis`.

    Examples:
        >>> import numpy as np, dtypes, precision
        >>> stack = precision.Tensor(np.ones((4, 8, 8), np.float32)).to_reduced_precision(
        ...     "int8", scaling=dtypes.PerAxis(-1))          # one scale row for 4 layers
        >>> layered = precision.scales_per_layer(stack)
        >>> layered.encoded.scaling, layered.encoded.scale.shape
        (PerAxis(power_of_two=False, scale_format='float32', axis=(0, 2)), (4, 1, 8))
        >>> bool((layered.numpy() == stack.numpy()).all())
        True
    """

    def fix(leaf: Any) -> Any:
        return _per_layer(leaf, axis) if isinstance(leaf, Tensor) else leaf

    return jax.tree.map(fix, tree, is_leaf=lambda x: isinstance(x, Tensor))


def _per_layer(t: Tensor, axis: int) -> Tensor:
    enc = t.encoded
    shape = enc.shape
    if enc.scaling is None or not shape:
        return t  # unscaled, or nothing to stack
    where = _axis(axis, len(shape))
    if t.layout is not None:  # the codes held with the last two axes swapped
        where = held_axis(where, len(shape))
    ts = enc.tensor_scale
    ts_per_layer = ts is None or (ts.ndim > 0 and ts.shape[where] == shape[where])
    if enc.scale is None or (enc.scale.shape[where] == shape[where] and ts_per_layer):
        return t  # already a scale per layer
    if isinstance(enc.scaling, dtypes.PerBlock) and enc.scaling.axis % len(shape) == where:
        raise dtypes.ScalingError(
            f"scales_per_layer: {enc.scaling} runs its blocks along axis {axis}, the stacking "
            f"axis of shape {shape}, so a layer's values share blocks with the next; scale the "
            "stack with blocks along another axis (PerBlock(size, axis=-1))"
        )
    layers = shape[where]

    def repeat(a: jax.Array | None) -> jax.Array | None:
        if a is None:
            return None
        wide = list(a.reshape(a.shape or (1,) * len(shape)).shape)  # a tensor scale: ()
        wide[where] = layers
        return jnp.broadcast_to(a, tuple(wide))

    scale, ts, zero_point = (repeat(a) for a in (enc.scale, ts, enc.zero_point))
    last = shape[-1] if enc.format.packed else None
    scaling = dtypes.Encoded.fitted_scaling(enc.format, enc.scaling, last, enc.data, scale)
    out = dtypes.Encoded(
        enc.data, scale, enc.format, scaling, last, tensor_scale=ts, zero_point=zero_point
    )
    return Tensor._make(out, t.dtype, None, t.layout)


def _axis(axis: int, ndim: int) -> int:
    if not isinstance(axis, int) or isinstance(axis, bool) or not -ndim <= axis < ndim:
        raise dtypes.ShapeError(
            f"scales_per_layer: axis {axis!r} is not an axis of a {ndim}-d stack; give an int "
            f"in [-{ndim}, {ndim - 1}] (0 for layers stacked first)"
        )
    return axis % ndim
