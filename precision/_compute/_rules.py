"""The precision rules: one table keyed by primitive name.

A rule receives one equation and its `(value, state)` inputs and returns the
outputs' pairs. The default rule (docs/design.md §5):

1. the op's compute format is the format its formatted inputs share, else the
   format declared for the call, else the logical dtype (a storage encoding
   counts as its logical dtype: it decodes exactly);
2. two compute formats meeting raise `PrecisionMismatchError` before anything
   runs, unless a compute format was declared, which brings full-precision
   inputs (raw arrays, float32 Tensors, decoded storage) to it;
3. weak inputs adopt that format;
4. the primitive runs on the logical values, and each floating output is
   rounded onto the compute format's grid (the identity for float32), except
   for ops that only move, select or negate elements;
5. ops named in the declared float32 list run on their inputs' exact values
   and keep float32 results (softmax, normalisation statistics, losses).

Storage encodings are never an arithmetic precision: a result is not
re-encoded into one. Pure moves of a storage value keep its codes where the
scaling allows it (`Stored`), so `t.reshape(...)` of an int8 Tensor is int8.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dtypes

from .. import _primitives
from .._errors import PrecisionMismatchError
from .._jax_compat import bind_eqn
from .._storage import converts_by_rounding, decode_encoded, full_format, is_float, round_nearest
from ._moves import moved_storage
from ._state import Context, Rounded, State, Stored, mismatch
from ._transposed_operands import transposed

__all__ = [
    "GRID_PRESERVING",
    "MOVES",
    "Rule",
    "Val",
    "computed_at_use",
    "decode_at_use",
    "default_rule",
    "in_compute_format",
    "op_state",
    "operands_at_use",
    "rounded_outputs",
]

Val = tuple[Any, State | None]
Rule = Callable[[Any, list[Val], Context], list[Val]]

# Ops whose floating outputs are input elements moved, selected or negated (an element
# keeps its exact value, so a value on a compute format's grid stays on it and rounding
# would be the identity), and ops that map a value on a binary float grid to a value on
# the same grid: both are kinds of the one primitive table.
MOVES = _primitives.MOVES
GRID_PRESERVING = _primitives.GRID


def op_state(op: str, vals: list[Val], ctx: Context) -> State | None:
    """The state an op computes in, checking the no-mixing rule (raises before computing)."""
    if ctx.compute is None or op in ctx.float32_ops:
        states = [s for v, s in vals if s is not None and is_float(v)]
        if not states:
            return None
        for other in states[1:]:
            if other.format != states[0].format:
                raise mismatch(op, states[0], other)
        source = next((s.source for s in states if s.source is not None), None)
        state = State(states[0].format, any(s.tensor for s in states), None, source)
        if ctx.compute is not None and state is not None and not state.format.is_full_precision:
            if state.format != ctx.compute:
                raise _declared_mismatch(op, state, ctx)
            # a float32 op under a narrower compute format keeps its exact inputs
            return State(full_format(np.float32), state.tensor)
        return state
    tensor, floating = False, False
    for v, s in vals:
        if s is None or not is_float(v):
            continue
        floating = True
        tensor = tensor or s.tensor
        if s.format != ctx.compute and not s.format.is_full_precision:
            raise _declared_mismatch(op, s, ctx)
    return State(ctx.compute, tensor) if floating else None


def _declared_mismatch(op: str, state: State, ctx: Context) -> PrecisionMismatchError:
    assert ctx.compute is not None  # raised only under a declared compute format
    c = ctx.compute.name
    return PrecisionMismatchError(
        f"`{op}` meets a {state.format.name} tensor under the declared compute format {c}: "
        f"a declaration brings full-precision values and storage to {c}, never another "
        f'reduced format; convert it first, e.g. t.to_reduced_precision("{c}") or '
        "t.to_full_precision()"
    )


def in_compute_format(vals: list[Val], state: State) -> list[Any]:
    """Inputs brought to the op's compute format: weak and full-precision values rounded."""
    fmt = state.format
    out = []
    for v, s in vals:
        if not is_float(v) or fmt.is_full_precision or (s is not None and s.format == fmt):
            out.append(v)
        else:
            out.append(round_nearest(fmt, jnp.asarray(v)))
    return out


def rounded_outputs(op: str, outs: list[Any], state: State) -> list[Val]:
    """Outputs rounded onto the compute format's grid (unless the op keeps it)."""
    result: list[Val] = []
    for o in outs:
        if not is_float(o):
            result.append((o, None))
        elif op in MOVES or (op in GRID_PRESERVING and state.format.kind == "float"):
            result.append((o, state))
        elif op == "convert_element_type" and np.dtype(o.dtype).itemsize >= 4:
            result.append((o, state))  # widening: every format's grid fits in float32
        else:
            rounded = round_nearest(state.format, o)
            if converts_by_rounding(state.format, o):  # (kept for a stored result)
                result.append((rounded, state._replace(rounded=Rounded(rounded, o))))
            else:
                result.append((rounded, state))
    return result


def computed_at_use(fn: Callable[[Any], Any], arg: Any, *probes: Any) -> Any:
    """`fn(arg)`, computed where an op uses it.

    On CPU `fn` runs inside a conditional whose predicate is read from the
    first floating array of `probes` (the op's other operand, then a scale).
    XLA cannot hoist a conditional above its predicate, so an unrolled model
    does not decode or round every layer's weights at the start (XLA removes
    optimization barriers before it schedules; holding every float32 weight at
    once also takes XLA's temporaries past the size glibc reuses, and each
    call then pays a page fault per 4 KiB), and it cannot fuse a decode's
    multiply into its consumer, where LLVM would contract `code * scale - y`
    into one fused multiply-add: then one stored value would be two different
    float32 numbers (`a - a[:1]` would not be 0). Both branches are `fn`, so
    the result does not depend on the predicate, which is False only for a NaN.

    Derivatives are `fn`'s own, computed outside the conditional (it is linear
    in its tangent: a decode or a rounding), so the backward pass fuses as it
    would without it. Under `vmap` with only the probe batched, one element of
    the batch is the predicate and `arg` is made once for the whole batch
    (JAX would otherwise turn the conditional into a select over a copy of
    `arg` per batch element).
    """
    probe = None
    for candidate in probes:
        if candidate is not None and np.size(candidate) and is_float(candidate):
            probe = jnp.ravel(candidate)[0]
            break
    if probe is None:
        return fn(arg)
    # Chosen by the platform the program is lowered for (a program exported for a GPU
    # from a CPU machine is the GPU's): elsewhere XLA fuses the work into its consumer.
    return lax.platform_dependent(arg, probe, cpu=_placed(fn), default=lambda a, _: fn(a))


def _placed(fn: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    """`(arg, probe) -> fn(arg)` inside a conditional on `probe` (see `computed_at_use`)."""

    def branch(a: Any, p: Any) -> Any:
        return lax.cond(p == p, fn, fn, a)

    inner = jax.custom_batching.custom_vmap(branch)

    @inner.def_vmap
    def _batched(axis_size: int, in_batched: Any, a: Any, p: Any) -> tuple[Any, bool]:
        a_batched, p_batched = in_batched
        if not any(jax.tree_util.tree_leaves(a_batched)):
            # only the predicate varies along the batch: one placement for all
            return inner(a, p[0] if p_batched else p), False
        # `a`'s own structure: its scaling follows its batched arrays (`Scaling.refit`)
        flags = [0 if b else None for b in jax.tree_util.tree_leaves(a_batched)]
        axes = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(a), flags)
        return jax.vmap(fn, in_axes=(axes,))(a), True

    outer = jax.custom_jvp(inner)

    @outer.defjvp
    def _jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        _, t = jax.jvp(fn, primals[:1], tangents[:1])
        return outer(*primals), t

    placed: Callable[[Any, Any], Any] = outer
    return placed


def decode_at_use(stored: Stored, other: Any = None) -> Any:
    """The decoded values of `stored`, computed where an op uses them (see `computed_at_use`)."""
    dtype = stored.dtype

    def decode(enc: dtypes.Encoded) -> Any:
        return decode_encoded(enc, dtype)

    return computed_at_use(decode, stored.enc, other, stored.enc.scale)


def operands_at_use(vals: list[Val], state: State, native: Any = None) -> list[Any]:
    """The operands of a contraction in its compute format, each made where it is used.

    Storage is decoded and a float32 operand rounded into a narrower compute
    format inside one `computed_at_use` conditional per operand: a weight is the same
    value at every call, so XLA would otherwise decode or round every layer's
    weights first and hold them all. With `native` (a narrow container the
    contraction takes as it is) the conditional returns that container, so a
    rounded weight leaves it at its narrow width.
    """
    fmt = state.format

    def to_native(x: Any) -> Any:
        return x if native is None else jnp.asarray(x).astype(native)

    out = []
    for i, (v, s) in enumerate(vals):
        stored = s.stored if s is not None else None
        rounds = is_float(v) and not fmt.is_full_precision and (s is None or s.format != fmt)
        if stored is None and not rounds:
            out.append(to_native(v))
            continue

        def make(arg: Any, stored: Stored | None = stored, rounds: bool = rounds) -> Any:
            x = decode_encoded(arg, stored.dtype) if stored is not None else arg
            return to_native(round_nearest(fmt, jnp.asarray(x)) if rounds else x)

        others = [w for j, (w, _) in enumerate(vals) if j != i]
        if stored is None:
            out.append(computed_at_use(make, v, *others))
        else:
            out.append(computed_at_use(make, stored.enc, *others, stored.enc.scale))
    return out


def _decoded_at_use(op: str, vals: list[Val]) -> list[Val]:
    """Storage inputs of a computing op decoded at the op (see `decode_at_use`)."""
    if op in MOVES or not any(s is not None and s.stored is not None for _, s in vals):
        return vals
    other = next((v for v, s in vals if is_float(v) and (s is None or s.stored is None)), None)
    return [
        (decode_at_use(s.stored, other), s) if s is not None and s.stored is not None else (v, s)
        for v, s in vals
    ]


def default_rule(eqn: Any, vals: list[Val], ctx: Context) -> list[Val]:
    op = eqn.primitive.name
    state = op_state(op, vals, ctx)
    if state is None:
        return [(o, None) for o in bind_eqn(eqn, *(v for v, _ in vals))]
    moved = moved_storage(eqn, vals) if ctx.compute is None else None
    given = in_compute_format(_decoded_at_use(op, vals), state)
    result = rounded_outputs(op, bind_eqn(eqn, *given), state)
    if len(result) != 1:
        return result
    if moved is not None:
        ((o, s),) = result
        assert s is not None  # the moved floating value keeps the op's state
        result = [(o, State(s.format, s.tensor, moved, s.source))]
    return [transposed(eqn, vals[0], given[0], result[0])]
