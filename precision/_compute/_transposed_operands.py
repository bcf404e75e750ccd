"""Transposes seen through: a contraction reads a transposed operand where it lies.

`x @ w.T` (Flax's tied-embedding `attend`, any `nn.Linear`-style layer) hands
`dot_general` the transpose of a weight. XLA folds that transpose into a float
dot's dimension numbers, but a quantized contraction first quantizes the
operand, and XLA fuses the transpose into that quantization instead: the
absmax reductions and the writes of the codes then run strided over the whole
weight, and the codes come out transposed: for the logits projection of a
GPT-2 on a CPU most of the contraction's time, many times that of the `s8`
dot itself (docs/benchmarks.md, "Predicted time").

So the default rule records the result of a `transpose` as a `View` of its
operand (`transposed`), and the quantized contraction takes the operand
itself with its dimension numbers moved (`through_views`): same groups, so
the same codes and scales, bit for bit, quantized in the weight's own layout;
an integer storage weight is then used by its codes as stored, where its
transposed copy had dropped them.
"""

from __future__ import annotations

from typing import Any

from ._state import State, View

__all__ = ["Dims", "Val", "through_views", "transposed"]

Val = tuple[Any, State | None]
Dims = tuple[tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]


def transposed(eqn: Any, operand: Val, given: Any, out: Val) -> Val:
    """`out`, the result of `eqn` on `operand`, with a `View` of `operand` when `eqn` is a
    transpose made of `operand`'s value as it is (`given` is what the primitive was
    handed: a value rounded into the compute format first is not `operand`'s)."""
    value, state = operand
    o, s = out
    if eqn.primitive.name != "transpose" or state is None or s is None or given is not value:
        return out
    perm = tuple(int(d) for d in eqn.params["permutation"])
    if state.view is not None:  # a transpose of a transpose: one view of the first operand
        inner = state.view
        return (
            o,
            s._replace(view=View(inner.value, inner.state, tuple(inner.perm[d] for d in perm))),
        )
    return (o, s._replace(view=View(value, state, perm)))


def through_views(vals: list[Val], dims: Any) -> tuple[list[Val], Dims]:
    """`dot_general`'s operands with each transposed one replaced by the value it is a
    transpose of, and the dimension numbers that contract those in the same way.

    An operand is replaced only where its free dims keep their order in the value it
    views: the result's dims are the free dims in operand order, so it is then the same
    array. Batch and contracting dims pair by position and may move freely.
    """
    (lc, rc), (lb, rb) = dims
    out: list[Val] = []
    moved: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for (v, s), c, b in zip(vals, (tuple(lc), tuple(rc)), (tuple(lb), tuple(rb)), strict=True):
        view = s.view if s is not None else None
        if view is not None:
            perm = view.perm
            free = [perm[d] for d in range(len(perm)) if d not in c and d not in b]
            if free == sorted(free):
                v, s = view.value, view.state
                c, b = tuple(perm[d] for d in c), tuple(perm[d] for d in b)
        out.append((v, s))
        moved.append((c, b))
    (lc, lb), (rc, rb) = moved
    return out, ((lc, rc), (lb, rb))
