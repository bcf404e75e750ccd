"""Moves of a storage value made on its codes: the value keeps its encoding.

A reshape or transpose of an int8 weight, or the slice of one layer from a
stacked int4 stack, is the same numbers in another place. Made on the stored
arrays instead of the decoded ones, the result is still storage: a later
contraction decodes only what it uses (one layer, not the whole stack), and
an integer contraction can still multiply codes (docs/design.md §5).

Two kinds of move qualify:

* slicing (`slice`, `dynamic_slice`, `squeeze`) of any encoding: codes,
  scales and zero points are cut along the same axes, so each element keeps
  its own code and its group's scale. It declines (the decoded values move
  instead) where a cut would split a scaling group (a block axis sliced
  part-way), the packed last axis is cut, or a squeezed block axis would
  leave one scale per element;
* the other code moves (reshape, transpose, broadcast, reversal, negation,
  abs) of an unpacked symmetric encoding with one scale: the codes move like
  the values and the scale stays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from jax import lax

import dtypes

from .. import _primitives
from .._jax_compat import bind_eqn
from ._state import State, Stored

__all__ = [
    "CODE_MOVES",
    "CUTS",
    "IDENTITIES",
    "Val",
    "as_scaling",
    "moved_storage",
    "squeezed_scaling",
]

# Moves that storage codes can make themselves (one operand, its elements kept,
# negated or their magnitude taken: symmetric codes allow both), valid for an unpacked
# encoding with one scale for the whole tensor; the identities, valid for every
# encoding; and the cuts, valid for every encoding whose groups they do not split:
# kinds of the one primitive table.
CODE_MOVES = _primitives.CODE_MOVES
IDENTITIES = _primitives.IDENTITIES
CUTS = _primitives.CUTS

Val = tuple[Any, State | None]


def moved_storage(eqn: Any, vals: list[Val]) -> Stored | None:
    """The storage encoding of a moved storage value, if the move keeps it valid."""
    op = eqn.primitive.name
    if op not in CODE_MOVES and op not in IDENTITIES:
        return None
    state = vals[0][1]
    if state is None or state.stored is None:
        return None
    if any(s is not None for _, s in vals[1:]):
        return None  # (a second floating operand: dynamic_slice's indices are integers)
    stored = state.stored
    enc = stored.enc
    if op in IDENTITIES:
        return stored
    if op in CUTS:
        cut = _sliced_encoding(eqn, enc, [v for v, _ in vals[1:]])
        if cut is not None:
            return Stored(cut, stored.dtype)
    if enc.format.packed or not isinstance(enc.scaling, dtypes.PerTensor):
        return None
    if (
        enc.tensor_scale is not None
        or enc.zero_point is not None
        or enc.format.kind not in ("int", "float")
    ):
        return None  # (zero points and code books do not commute with negation)
    # The codes move exactly like the values; the one scale stays.
    data = bind_eqn(eqn, enc.data, *(v for v, _ in vals[1:]))[0]
    assert enc.scale is not None  # a per-tensor encoding always has its scale
    moved = dtypes.Encoded(data, enc.scale.reshape(()), enc.format, enc.scaling)
    return Stored(moved, stored.dtype)


class _Cut(NamedTuple):
    """An encoding's arrays as a cut moves them: scales and zero points shaped one entry
    per group along each dim, the tensor scale as stored."""

    data: Any
    scale: Any
    zero_point: Any
    tensor_scale: Any


def _sliced_encoding(eqn: Any, enc: dtypes.Encoded, indices: list[Any]) -> dtypes.Encoded | None:
    """`enc` sliced or squeezed as `eqn` moves its values, or None where groups would split."""
    shape, packed = enc.shape, enc.format.packed
    n = len(shape)
    if n == 0 or (packed and enc.data.ndim != n):
        return None
    sc = enc.scaling
    groups = None if sc is None or enc.scale is None else sc.scale_shape(shape)
    scale = None if groups is None or enc.scale is None else enc.scale.reshape(groups)
    zp = None if groups is None or enc.zero_point is None else enc.zero_point.reshape(groups)
    arrays = _Cut(enc.data, scale, zp, enc.tensor_scale)
    if eqn.primitive.name == "squeeze":
        done = _squeezed(enc, arrays, tuple(d % n for d in eqn.params["dimensions"]))
    else:
        done = _sliced(eqn, enc, arrays, groups, indices)
    if done is None:
        return None
    cut, scaling, new_shape = done
    last = new_shape[-1] if packed and new_shape else None
    if packed and not new_shape:
        return None
    return dtypes.Encoded(
        cut.data,
        cut.scale,
        enc.format,
        scaling,
        last,
        tensor_scale=cut.tensor_scale,
        zero_point=cut.zero_point,
    )


def _squeezed(
    enc: dtypes.Encoded, arrays: _Cut, dims: tuple[int, ...]
) -> tuple[_Cut, dtypes.Scaling | None, tuple[int, ...]] | None:
    """`arrays` with the unit `dims` squeezed out, the scaling and the shape left, or None
    where the packed last axis or a block axis would go."""
    shape = enc.shape
    n = len(shape)
    if enc.format.packed and n - 1 in dims:
        return None
    fits, scaling = squeezed_scaling(enc.scaling, dims, n)
    if not fits:
        return None
    scale, zp, ts = arrays.scale, arrays.zero_point, arrays.tensor_scale
    # a tensor scale per layer of a stack (shape (layers, 1, 1)) is cut like the scales
    cut = _Cut(
        lax.squeeze(arrays.data, dims),
        None if scale is None else lax.squeeze(scale, dims),
        None if zp is None else lax.squeeze(zp, dims),
        ts if ts is None or not ts.ndim else lax.squeeze(ts, dims),
    )
    return cut, scaling, tuple(s for i, s in enumerate(shape) if i not in dims)


def _sliced(
    eqn: Any, enc: dtypes.Encoded, arrays: _Cut, groups: Any, indices: list[Any]
) -> tuple[_Cut, dtypes.Scaling | None, tuple[int, ...]] | None:
    """`arrays` sliced (`slice`, `dynamic_slice` at `indices`) as `eqn` slices the values,
    the scaling and the new shape, or None where a group or the packed last axis would
    be cut part-way."""
    shape, packed = enc.shape, enc.format.packed
    n = len(shape)
    op, p = eqn.primitive.name, eqn.params
    if op == "slice":
        start, limit = tuple(p["start_indices"]), tuple(p["limit_indices"])
        strides = tuple(p["strides"] or (1,) * n)
        full = [start[a] == 0 and limit[a] == shape[a] and strides[a] == 1 for a in range(n)]
    else:
        sizes = tuple(p["slice_sizes"])
        full = [sizes[a] == shape[a] for a in range(n)]
    if packed and not full[-1]:
        return None
    cut_axes = [a for a in range(n) if not full[a]]
    if groups is not None and any(groups[a] not in (1, shape[a]) for a in cut_axes):
        return None  # a block axis cut part-way: groups would split

    def cut(x: Any, along: list[int]) -> Any:
        if op == "slice":
            lo = [start[a] if a in along else 0 for a in range(x.ndim)]
            hi = [limit[a] if a in along else x.shape[a] for a in range(x.ndim)]
            st = [strides[a] if a in along else 1 for a in range(x.ndim)]
            return lax.slice(x, lo, hi, st)
        at = [indices[a] if a in along else 0 for a in range(x.ndim)]
        size = [sizes[a] if a in along else x.shape[a] for a in range(x.ndim)]
        return lax.dynamic_slice(x, at, size)

    data = cut(arrays.data, cut_axes)
    scale, zp, ts = arrays.scale, arrays.zero_point, arrays.tensor_scale
    if groups is not None:
        # a scale axis of length 1 is shared along a cut axis; a full one is cut with it
        along = [a for a in cut_axes if groups[a] == shape[a] != 1]
        scale = None if scale is None else cut(scale, along)
        zp = None if zp is None else cut(zp, along)
    # a tensor scale per layer of a stack (shape (layers, 1, 1)) is cut like the scales
    ts_axes = [] if ts is None or not ts.ndim else [a for a in range(n) if ts.shape[a] != 1]
    ts = ts if not ts_axes else cut(ts, [a for a in cut_axes if a in ts_axes])
    if op == "slice":
        new_shape = tuple(len(range(start[a], limit[a], strides[a])) for a in range(n))
    else:
        new_shape = tuple(sizes)
    return _Cut(data, scale, zp, ts), enc.scaling, new_shape


def squeezed_scaling(
    sc: dtypes.Scaling | None, dims: tuple[int, ...], n: int
) -> tuple[bool, dtypes.Scaling | None]:
    """(whether a scaling describes the groups left, that scaling) after squeezing `dims`
    (axes of length 1) from an `n`-d encoding."""
    if sc is None or isinstance(sc, dtypes.PerTensor):
        return True, sc
    if isinstance(sc, dtypes.PerAxis):
        kept = [a - sum(d < a for d in dims) for a in sc.kept(n) if a not in dims]
        if not kept:
            return True, as_scaling(dtypes.PerTensor, sc)
        if len(kept) > 1:
            return True, as_scaling(dtypes.PerAxis, sc, axis=tuple(kept))
        one = kept[0] - (n - len(dims)) * (isinstance(sc.axis, int) and sc.axis < 0)
        return True, as_scaling(dtypes.PerAxis, sc, axis=one)
    assert isinstance(sc, dtypes.PerBlock)
    axis = sc.axis % n
    if axis in dims:
        return False, None  # one block scale per element would be left
    new = axis - sum(d < axis for d in dims)
    if sc.axis < 0:
        new -= n - len(dims)
    return True, as_scaling(dtypes.PerBlock, sc, axis=new)


def as_scaling(cls: type, scaling: dtypes.Scaling, **changes: Any) -> dtypes.Scaling:
    """A scaling of class `cls` keeping every option `scaling` shares with it."""

    names = {f.name for f in dataclasses.fields(cls)}
    kept = {
        f.name: getattr(scaling, f.name) for f in dataclasses.fields(scaling) if f.name in names
    }
    out: dtypes.Scaling = cls(**{**kept, **changes})
    return out
