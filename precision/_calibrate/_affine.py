"""Which activations are a per-feature affine map of a normalization: where a scale can fold.

AWQ and SmoothQuant divide an activation's input channels by a vector `s` and
multiply the weights' rows by it, which leaves the function unchanged only if
the division can be folded into the operation that produced the activation.
The one producer folded here is the affine end of a normalization: a value
`u * g + b` (`g`, `b`: 1-D parameters, e.g. LayerNorm's scale and bias; `b`
optional) whose feature axis is the axis a contraction sums over. Dividing it
by `s` is `u * (g / s) + b / s`.

`propagate` follows that form through one equation: a 1-D parameter broadcast
along an axis and multiplied into an activation starts it; multiplying or
dividing by any other activation keeps it (the factor per feature stays);
adding a 1-D parameter on the same axis adds the shift; conversions,
broadcasts and unit-dimension reshapes carry it. Any other use of such a value
makes folding unsafe, because the scaled value would reach it too.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["SAME_VALUES", "Tag", "carry_axes", "propagate"]


class Tag(NamedTuple):
    """A value `u * leaf[scale] + leaf[bias]` along `axis` (bias None: no shift)."""

    scale: int
    bias: int | None
    axis: int


# equations whose output is their input, value for value (dtype aside)
SAME_VALUES = frozenset({"convert_element_type", "copy", "reduce_precision"})


def carry_axes(eqn: Any, axes: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Where each axis of a `broadcast_in_dim` / `reshape` result comes from (per input
    axis entries of `axes`; None for a new axis), or None if axes are mixed."""
    name = eqn.primitive.name
    in_shape = tuple(eqn.invars[0].aval.shape)
    out_shape = tuple(eqn.outvars[0].aval.shape)
    if name == "broadcast_in_dim":
        out: list[Any] = [None] * len(out_shape)
        for i, d in enumerate(eqn.params["broadcast_dimensions"]):
            if in_shape[i] == out_shape[d]:
                out[d] = axes[i]
        return tuple(out)
    if name in ("reshape", "squeeze"):
        kept_in = [(n, a) for n, a in zip(in_shape, axes, strict=True) if n != 1]
        kept_out = [i for i, n in enumerate(out_shape) if n != 1]
        if [n for n, _ in kept_in] != [out_shape[i] for i in kept_out]:
            return None
        out = [None] * len(out_shape)
        for i, (_, a) in zip(kept_out, kept_in, strict=True):
            out[i] = a
        return tuple(out)
    return None


def _vector_axis(origin: Any, ndims: list[int]) -> int | None:
    """The value axis a 1-D parameter runs along, if `origin` is one (broadcast)."""
    if origin is None or ndims[origin.leaf] != 1 or origin.stacked:
        return None
    found = [i for i, a in enumerate(origin.axes) if a is not None]
    return found[0] if len(found) == 1 else None


def propagate(
    eqn: Any, origins: list[Any], tags: list[Tag | None], ndims: list[int]
) -> tuple[list[Tag | None], bool]:
    """(tags of the outputs, whether every tagged input was used in a foldable way)."""
    name = eqn.primitive.name
    none: list[Tag | None] = [None] * len(eqn.outvars)
    if not any(tags) and name not in ("mul",):
        return none, True
    if name in SAME_VALUES:
        return [tags[0]], True
    first = tags[0]
    if name in ("broadcast_in_dim", "reshape", "squeeze") and first:
        t = first
        ndim = len(eqn.invars[0].aval.shape)
        where = carry_axes(eqn, tuple(i if i == t.axis else None for i in range(ndim)))
        if where is None or t.axis not in where:
            return none, False
        return [t._replace(axis=where.index(t.axis))], True
    if name == "mul":
        for v, other in ((0, 1), (1, 0)):
            axis = _vector_axis(origins[v], ndims)
            if axis is not None and tags[other] is None and origins[other] is None:
                return [Tag(origins[v].leaf, None, axis)], True
        for v, other in ((0, 1), (1, 0)):
            kept = tags[v]
            if kept and kept.bias is None and tags[other] is None and origins[other] is None:
                return [kept], True
        return none, not any(tags)
    if name == "div":
        if first and first.bias is None and tags[1] is None and origins[1] is None:
            return [first], True
        return none, False
    if name == "add":
        for v, other in ((0, 1), (1, 0)):
            shifted = tags[v]
            if shifted and shifted.bias is None and tags[other] is None:
                if _vector_axis(origins[other], ndims) == shifted.axis:
                    return [shifted._replace(bias=origins[other].leaf)], True
        return none, False
    return none, False
