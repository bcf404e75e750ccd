"""How each operand of a quantized contraction is seen: a matrix of rows by summed
elements (`Layout`), the `dtypes` scaling a `Contract` scaling name gives that matrix,
and where its per-row scales land in the result.

Rows are an operand's non-contracting indices (batch and free dims of a
`dot_general`; the batch dim of a convolution's input, the output-feature dim of
its kernel); the summed part is everything the contraction adds over (for a
convolution the feature dim last, so MX blocks run along channels).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

import dtypes

__all__ = ["MX", "Layout", "grad_layout", "layouts", "out_scale", "scaling_for"]

MX = dtypes.PerBlock(32, axis=-1, power_of_two=True, scale_format="float8_e8m0fnu")


def scaling_for(name: str) -> dtypes.Scaling:
    """The `dtypes` scaling of the rows-by-summed matrix for a `Contract` scaling name."""
    if name == "tensorwise":
        return dtypes.PerTensor()
    if name == "rowwise":
        return dtypes.PerAxis(0)
    return MX


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one operand is seen as rows x summed elements (static).

    `kept` are the dims that index rows (in the order the result uses them),
    `summed` the dims the contraction adds over (MX blocks run along the
    last of them).
    """

    shape: tuple[int, ...]
    kept: tuple[int, ...]
    summed: tuple[int, ...]

    @property
    def kept_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[d] for d in self.kept)

    @property
    def summed_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[d] for d in self.summed)

    @property
    def in_order(self) -> bool:
        """Whether the kept dims lead and the summed dims follow, in order (rows are a
        reshape, no transpose)."""
        return (*self.kept, *self.summed) == tuple(range(len(self.shape)))

    def direct(self, scaling: str) -> dtypes.Scaling | None:
        """The scaling that groups the operand exactly like its rows, applied to the
        operand as it is laid out (no transpose), if there is one.

        A transpose feeding XLA's encode fusion makes its reductions strided (ten
        times slower on CPU for a (784, 1024) kernel), so a single kept dim is
        scaled `PerAxis` in place, and MX blocks run along a single summed dim.
        """
        if not self.shape:
            return None
        if scaling == "tensorwise":
            return dtypes.PerTensor()
        if scaling == "rowwise" and len(self.kept) == 1:
            return dtypes.PerAxis(self.kept[0])
        if scaling == "rowwise" and not self.kept:
            return dtypes.PerTensor()
        if scaling == "mx" and len(self.summed) == 1:
            return dataclasses.replace(MX, axis=self.summed[0])
        return None

    def moved(self, x: jax.Array) -> jax.Array:
        """`x` with its kept dims first, then its summed dims."""
        return jnp.transpose(x, (*self.kept, *self.summed))

    def unmoved(self, x: jax.Array) -> jax.Array:
        """The inverse of `moved`."""
        perm = (*self.kept, *self.summed)
        return jnp.transpose(x, [perm.index(d) for d in range(len(self.shape))])

    def rows(self, x: jax.Array) -> jax.Array:
        """`x` as a (rows, summed) matrix."""
        return self.moved(x).reshape(math.prod(self.kept_shape), math.prod(self.summed_shape))

    def back(self, m: jax.Array) -> jax.Array:
        """A (rows, summed) matrix in the operand's own layout."""
        return self.unmoved(m.reshape(self.kept_shape + self.summed_shape))

    def row_scale(self, scale: jax.Array) -> jax.Array:
        """Per-row (or one) scale of the matrix as an array over the kept dims."""
        if scale.size == 1:
            return scale.astype(jnp.float32).reshape((1,) * len(self.kept))
        return scale.astype(jnp.float32).reshape(self.kept_shape)

    def spread(self, kept_scale: jax.Array) -> jax.Array:
        """A scale over the kept dims, broadcastable to the operand's layout."""
        shape = [1] * len(self.shape)
        for i, d in enumerate(self.kept):
            shape[d] = kept_scale.shape[i]
        perm = list(self.kept) + [d for d in range(len(self.shape)) if d not in self.kept]
        moved = kept_scale.reshape(kept_scale.shape + (1,) * (len(self.shape) - len(self.kept)))
        return jnp.transpose(moved, [perm.index(d) for d in range(len(self.shape))]).reshape(shape)


def layouts(
    eqn: Any, a_shape: tuple[int, ...], b_shape: tuple[int, ...], dims: Any = None
) -> tuple[Layout, Layout]:
    """The two operands' layouts for one contraction equation (a `dot_general`'s with
    `dims` for dimension numbers, when given)."""
    if eqn.primitive.name == "dot_general":
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"] if dims is None else dims
        lc, rc, lb, rb = tuple(lc), tuple(rc), tuple(lb), tuple(rb)
        l_free = tuple(d for d in range(len(a_shape)) if d not in lc and d not in lb)
        r_free = tuple(d for d in range(len(b_shape)) if d not in rc and d not in rb)
        return Layout(tuple(a_shape), lb + l_free, lc), Layout(tuple(b_shape), rb + r_free, rc)
    lhs, rhs, _ = eqn.params["dimension_numbers"]
    # With batch groups the input's batch dim is split across groups: one scale for it.
    kept_a = (lhs[0],) if eqn.params.get("batch_group_count", 1) == 1 else ()
    summed_a = tuple(d for d in (*lhs[2:], lhs[1]) if d not in kept_a)
    if not kept_a:
        summed_a = (lhs[0], *summed_a)
    return (
        Layout(tuple(a_shape), kept_a, summed_a),
        Layout(tuple(b_shape), (rhs[0],), (*rhs[2:], rhs[1])),
    )


def out_scale(
    eqn: Any, out_ndim: int, sa: jax.Array, sb: jax.Array, la: Layout, lb_: Layout
) -> tuple[jax.Array, jax.Array]:
    """The two operands' kept-dim scales, broadcastable to the output."""
    if eqn.primitive.name == "dot_general":
        (_, _), (lb, _) = eqn.params["dimension_numbers"]
        nb = len(lb)
        n_lfree = len(la.kept) - nb
        n_rfree = len(lb_.kept) - nb
        sa = sa.reshape(sa.shape + (1,) * n_rfree)
        sb = sb.reshape(sb.shape[:nb] + (1,) * n_lfree + sb.shape[nb:])
        return sa, sb
    _, _, out = eqn.params["dimension_numbers"]

    def place(s: jax.Array, dim: int, kept: tuple[int, ...]) -> jax.Array:
        shape = [1] * out_ndim
        if kept:
            shape[dim] = s.shape[0]
        return s.reshape(shape)

    return place(sa, out[0], la.kept), place(sb, out[1], lb_.kept)


def grad_layout(eqn: Any, shape: tuple[int, ...]) -> Layout:
    """Rows of a cotangent: per token (all but the last dim) or per image of a convolution."""
    nd = len(shape)
    if not nd:
        return Layout(shape, (), ())
    if eqn.primitive.name == "dot_general":
        return Layout(shape, tuple(range(nd - 1)), (nd - 1,))
    _, _, out = eqn.params["dimension_numbers"]
    return Layout(shape, (out[0],), (*out[2:], out[1]))
