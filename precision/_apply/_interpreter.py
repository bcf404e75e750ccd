"""`precision.apply`'s interpretation of the walk: `(value, State)` pairs under the rules.

`evaluate` walks a traced function (`precision._walk`) with each equation's
`(value, state)` inputs handed to the rule its primitive's kind names
(`_compute.rule_for`). The rules decide every format; this module reads a
format only to slice stacked storage for a `scan` (`_scan_slice`: which arrays
vary along the stacking axis). Calls are inlined by the walk; `remat`,
`custom_jvp` and `custom_vjp` are re-wrapped so their body runs under the rules
while derivatives come from the function's own rule, storage crossing into them
as its encodings (a stored int8 weight reaches a contraction inside as codes);
`cond`, `scan`, `while` and `shard_map` run their bodies under the rules inside
the same `lax` control flow, loop carries kept in one compute format (a carry
that starts weak, e.g. zeros, adopts the format the body gives it). A scan over
stacked storage (an int4 weight per layer) scans the codes and scales themselves
and decodes one layer per iteration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dtypes

from .. import _jax_compat as compat
from .._compute import Context, State, Stored, Val, in_compute_format, join, rule_for
from .._compute._explain_notes import paused
from .._compute._moves import squeezed_scaling
from .._storage import decode_encoded, is_float
from .._walk import Interpretation, Scan, ShardMap, While, Wrapper, walk

__all__ = ["evaluate"]


# -- evaluation ----------------------------------------------------------------
def evaluate(jaxpr: Any, consts: list[Any], invals: list[Val], ctx: Context) -> list[Val]:
    """Evaluate an open jaxpr on `(value, state)` pairs under the precision rules."""
    return walk(jaxpr, consts, invals, _Rules(ctx))


class _Rules(Interpretation[Val]):
    """The walk's values are `(value, State | None)`; each equation takes its rule."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def literal(self, value: Any) -> Val:
        return (value, None)

    def constant(self, value: Any) -> Val:
        return (value, None)  # constants made inside the function are weak

    def equation(self, eqn: Any, ins: list[Val]) -> list[Val]:
        return rule_for(eqn.primitive.name)(eqn, ins, self.ctx)

    def wrapped(self, eqn: Any, kind: Wrapper, body: Any, ins: list[Val]) -> list[Val]:
        return _WRAPPERS[kind](eqn, body, ins, self.ctx)

    def cond(self, eqn: Any, index: Val, branches: list[Any], ops: list[Val]) -> list[Val]:
        return _cond(index, branches, ops, self.ctx)

    def scan(self, eqn: Any, parts: Scan, ins: list[Val]) -> list[Val]:
        return _scan(parts, ins, self.ctx)

    def while_loop(self, eqn: Any, parts: While, ins: list[Val]) -> list[Val]:
        return _while(parts, ins, self.ctx)

    def shard_map(self, eqn: Any, parts: ShardMap, ins: list[Val]) -> list[Val]:
        box: list[State | None] = []
        fn = _run(parts.body, _plain([s for _, s in ins]), self.ctx, box)
        outs = compat.shard_mapped(parts.params, fn)(*(v for v, _ in ins))
        return list(zip(outs, box, strict=True))


def _plain(states: list[State | None]) -> list[State | None]:
    """States for a sub-function traced apart (its storage arrays are not visible there)."""
    return [None if s is None else s.plain() for s in states]


def _run(
    jaxpr: Any, states: list[State | None], ctx: Context, box: list[State | None] | None = None
) -> Callable[..., tuple[Any, ...]]:
    """A function of plain values walking `jaxpr` (open or closed) with fixed input states."""
    inner, consts = compat.closed(jaxpr)

    def fn(*xs: Any) -> tuple[Any, ...]:
        outs = evaluate(inner, consts, list(zip(xs, states, strict=True)), ctx)
        if box is not None:
            box[:] = [None if s is None else s.plain() for _, s in outs]
        return tuple(v for v, _ in outs)

    return fn


def _abstract_states(
    jaxpr: Any, args: list[Any], states: list[State | None], ctx: Context
) -> list[State | None]:
    """The output states of `jaxpr`, found by abstract evaluation (no compute)."""
    box: list[State | None] = []
    with paused():  # `explain` notes the contractions of the traced program only
        jax.eval_shape(_run(jaxpr, _plain(states), ctx, box), *args)
    return box


def _adopt_to(value: Any, state: State | None, target: State | None) -> Any:
    """A loop carry or branch output brought to the format its slot holds: a weak value,
    or a full-precision one in a slot of the declared compute format (`join`: rounded
    once, before a loop, so an op kept in float32 reads the rounded first value where
    unrolled it would read the exact one)."""
    if target is None or not is_float(value):
        return value
    if state is not None and (state.format == target.format or not state.format.is_full_precision):
        return value
    return in_compute_format([(value, state)], target)[0]


# -- remat, custom_jvp, custom_vjp: the function is their body -------------------
_Encodings = tuple[dtypes.Encoded | None, ...]


def _crossing(ins: list[Val]) -> tuple[tuple[Any, ...], _Encodings]:
    """What a wrapped body takes for `ins`: each value, and each storage encoding (so a
    stored weight reaches the contractions inside as its codes, not as float32)."""
    values = tuple(v for v, _ in ins)
    encs = tuple(None if s is None or s.stored is None else s.stored.enc for _, s in ins)
    return values, encs


def _body(
    jaxpr: Any, ins: list[Val], ctx: Context, box: list[State | None]
) -> Callable[[tuple[Any, ...], _Encodings], tuple[Any, ...]]:
    """`(values, encodings) -> outputs` walking `jaxpr` under the rules, the inputs'
    states rebuilt around the encodings that crossed (their output states in `box`)."""
    states = [None if s is None else s.plain() for _, s in ins]
    dtypes_of = [None if s is None or s.stored is None else s.stored.dtype for _, s in ins]

    def fn(values: tuple[Any, ...], encs: _Encodings) -> tuple[Any, ...]:
        rebuilt = [
            s if e is None or s is None or d is None else s._replace(stored=Stored(e, d))
            for s, e, d in zip(states, encs, dtypes_of, strict=True)
        ]
        return _run(jaxpr, rebuilt, ctx, box)(*values)

    return fn


def _no_cotangents(encs: _Encodings) -> Any:
    """Zero cotangents for encodings (integer codes take `float0`)."""
    return jax.tree_util.tree_map(
        lambda a: (
            jnp.zeros_like(a)
            if jnp.issubdtype(a.dtype, jnp.floating)
            else np.zeros(a.shape, jax.dtypes.float0)
        ),
        encs,
    )


def _remat(eqn: Any, jaxpr: Any, ins: list[Val], ctx: Context) -> list[Val]:
    box: list[State | None] = []
    fn = _body(jaxpr, ins, ctx, box)
    params = eqn.params
    outs = jax.checkpoint(fn, prevent_cse=params["prevent_cse"], policy=params["policy"])(
        *_crossing(ins)
    )
    return list(zip(outs, box, strict=True))


def _custom_jvp(eqn: Any, jaxpr: Any, ins: list[Val], ctx: Context) -> list[Val]:
    """The primal under the rules; tangents from the function's own jvp rule."""
    box: list[State | None] = []
    primal = _body(jaxpr, ins, ctx, box)
    wrapped = jax.custom_jvp(primal)

    @wrapped.defjvp
    def _jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        outs = primal(*primals)
        _, tans = jax.jvp(lambda *xs: tuple(compat.bind_eqn(eqn, *xs)), primals[0], tangents[0])
        return outs, tans

    outs = wrapped(*_crossing(ins))
    return list(zip(outs, box, strict=True))


def _custom_vjp(eqn: Any, jaxpr: Any, ins: list[Val], ctx: Context) -> list[Val]:
    """The primal under the rules; cotangents from the function's own fwd/bwd."""
    box: list[State | None] = []
    primal = _body(jaxpr, ins, ctx, box)
    wrapped = jax.custom_vjp(primal)

    def fwd(xs: tuple[Any, ...], encs: _Encodings) -> tuple[tuple[Any, ...], Any]:
        return primal(xs, encs), (xs, encs)

    def bwd(res: Any, cts: tuple[Any, ...]) -> tuple[Any, Any]:
        xs, encs = res
        _, vjp = jax.vjp(lambda *a: tuple(compat.bind_eqn(eqn, *a)), *xs)
        grads: tuple[Any, ...] = vjp(tuple(cts))
        return grads, _no_cotangents(encs)

    wrapped.defvjp(fwd, bwd)
    outs = wrapped(*_crossing(ins))
    return list(zip(outs, box, strict=True))


_WRAPPERS: dict[Wrapper, Callable[[Any, Any, list[Val], Context], list[Val]]] = {
    "remat": _remat,
    "custom_jvp": _custom_jvp,
    "custom_vjp": _custom_vjp,
}


def _cond(index: Val, branches: list[Any], ops: list[Val], ctx: Context) -> list[Val]:
    values, states = [v for v, _ in ops], _plain([s for _, s in ops])
    per_branch = [_abstract_states(br, values, states, ctx) for br in branches]
    joined: list[State | None] = []
    for slot in zip(*per_branch, strict=True):
        acc: State | None = None
        for s in slot:
            acc = join("cond", acc, s, ctx.compute)
        joined.append(acc)

    def make(br: Any) -> Callable[..., tuple[Any, ...]]:
        box: list[State | None] = []
        run = _run(br, states, ctx, box)

        def fn(*xs: Any) -> tuple[Any, ...]:
            outs = run(*xs)
            return tuple(_adopt_to(o, s, t) for o, s, t in zip(outs, box, joined, strict=True))

        return fn

    outs = lax.switch(index[0], [make(br) for br in branches], *values)
    return list(zip(outs, joined, strict=True))


def _fixed_point(
    op: str,
    carry_states: list[State | None],
    abstract_args: Callable[[list[State | None]], list[State | None]],
    ctx: Context,
) -> tuple[list[State | None], list[State | None]]:
    """Carry states stable under the body: weak carries adopt the body's format (and
    full-precision ones the declared compute format, `join`)."""
    states = _plain(list(carry_states))
    for _ in range(len(states) + 2):
        outs = abstract_args(states)
        new = [
            join(op, s, o, ctx.compute) for s, o in zip(states, outs[: len(states)], strict=True)
        ]
        if new == states:
            return states, outs
        states = new
    raise AssertionError(f"carry formats of `{op}` did not settle")  # pragma: no cover


def _scan_slice(
    enc: dtypes.Encoded,
) -> tuple[tuple[Any, ...], Callable[..., dtypes.Encoded]] | None:
    """(arrays to scan over, rebuild of one iteration's encoding) for stacked storage.

    The stacking axis is 0; the scale follows when it varies along it (per
    axis 0 among others, or per block on another axis) and is a loop constant
    otherwise; so does a two-level tensor scale (one per layer, or one for all). Zero
    points are not sliced (None: the stack is decoded whole).
    """
    shape, scaling = enc.shape, enc.scaling
    if (len(shape) < 2 and enc.format.packed) or enc.zero_point is not None:
        return None
    fmt, last = enc.format, (shape[-1] if enc.format.packed else None)
    if enc.scale is None:
        return (enc.data,), lambda d: dtypes.Encoded(d, None, fmt, None, last)
    assert scaling is not None  # a scale comes with its scaling
    fits, inner = squeezed_scaling(scaling, (0,), len(shape))
    if not fits:
        return None  # blocks along the stacking axis: decoded whole
    # each of scale and tensor scale: scanned when it varies along the stack, else constant
    parts = [enc.scale.reshape(scaling.scale_shape(shape)), enc.tensor_scale]
    scanned = [p is not None and p.ndim > 0 and p.shape[0] != 1 for p in parts]
    const = [
        p if p is None or p.ndim == 0 or s else p.reshape(p.shape[1:])
        for p, s in zip(parts, scanned, strict=True)
    ]

    def make(data: Any, *steps: Any) -> dtypes.Encoded:
        it = iter(steps)
        scale, ts = (next(it) if s else c for c, s in zip(const, scanned, strict=True))
        return dtypes.Encoded(data, scale, fmt, inner, last, tensor_scale=ts)

    return (enc.data, *(p for p, s in zip(parts, scanned, strict=True) if s)), make


def _scan(parts: Scan, ins: list[Val], ctx: Context) -> list[Val]:
    nc, nk = parts.n_consts, parts.n_carry
    consts, carry, xs = ins[:nc], ins[nc : nc + nk], ins[nc + nk :]
    const_vals, const_states = [v for v, _ in consts], _plain([s for _, s in consts])
    x_states = _plain([s for _, s in xs])
    x_specs = [
        jax.ShapeDtypeStruct(
            np.shape(v)[1:], np.asarray(v).dtype if not hasattr(v, "dtype") else v.dtype
        )
        for v, _ in xs
    ]

    def abstract(states: list[State | None]) -> list[State | None]:
        args = [*const_vals, *(v for v, _ in carry), *x_specs]
        return _abstract_states(parts.body, args, [*const_states, *states, *x_states], ctx)

    carry_states, outs = _fixed_point("scan", [s for _, s in carry], abstract, ctx)
    y_states = outs[nk:]
    init = [_adopt_to(v, s, t) for (v, s), t in zip(carry, carry_states, strict=True)]

    scanned, rebuilds = _scanned_xs(xs)
    inner, inner_consts = compat.closed(parts.body)
    box: list[State | None] = []

    def body(c: list[Any], x: list[tuple[Any, ...]]) -> tuple[list[Any], list[Any]]:
        x_ins = _step_inputs(x, rebuilds, x_states)
        outs = evaluate(
            inner,
            inner_consts,
            [
                *zip(const_vals, const_states, strict=True),
                *zip(c, carry_states, strict=True),
                *x_ins,
            ],
            ctx,
        )
        box[:] = [None if s is None else s.plain() for _, s in outs]
        new = [_adopt_to(o, s, t) for (o, s), t in zip(outs[:nk], carry_states, strict=True)]
        return new, [o for o, _ in outs[nk:]]

    final, ys = lax.scan(
        body,
        init,
        [tuple(a) for a in scanned],
        length=parts.length,
        reverse=parts.reverse,
        unroll=parts.unroll,
    )
    return [*zip(final, carry_states, strict=True), *zip(ys, y_states, strict=True)]


_Rebuild = tuple[Callable[..., dtypes.Encoded], State] | None


def _scanned_xs(xs: list[Val]) -> tuple[list[tuple[Any, ...]], list[_Rebuild]]:
    """The arrays `lax.scan` runs over for each of a scan's `xs`, and how one step's slice
    is rebuilt (None: the value as it is). Stacked storage is scanned as codes and
    scales: one slice decoded per step."""
    scanned: list[tuple[Any, ...]] = []
    rebuilds: list[_Rebuild] = []
    for v, s in xs:
        if s is None or s.stored is None or (sliced := _scan_slice(s.stored.enc)) is None:
            scanned.append((v,))
            rebuilds.append(None)
        else:
            scanned.append(sliced[0])
            rebuilds.append((sliced[1], s))
    return scanned, rebuilds


def _step_inputs(
    x: list[tuple[Any, ...]], rebuilds: list[_Rebuild], x_states: list[State | None]
) -> list[Val]:
    """One scan step's slices of the `xs` as the body's inputs: a slice of stacked storage
    rebuilt as its encoding (decoded, its codes kept), any other as it is."""
    x_ins: list[Val] = []
    for arrays, rebuild, st in zip(x, rebuilds, x_states, strict=True):
        if rebuild is None:
            x_ins.append((arrays[0], st))
            continue
        make, outer = rebuild
        assert outer.stored is not None  # only stacked storage is rebuilt
        enc = make(*arrays)
        value = decode_encoded(enc, outer.stored.dtype)
        stored = Stored(enc, outer.stored.dtype)
        x_ins.append((value, State(outer.format, outer.tensor, stored, outer.source)))
    return x_ins


def _while(parts: While, ins: list[Val], ctx: Context) -> list[Val]:
    cn, bn = parts.n_cond_consts, parts.n_body_consts
    cconsts, bconsts, carry = ins[:cn], ins[cn : cn + bn], ins[cn + bn :]
    bvals, bstates = [v for v, _ in bconsts], _plain([s for _, s in bconsts])
    cvals, cstates = [v for v, _ in cconsts], _plain([s for _, s in cconsts])

    def abstract(states: list[State | None]) -> list[State | None]:
        args = [*bvals, *(v for v, _ in carry)]
        return _abstract_states(parts.body, args, [*bstates, *states], ctx)

    carry_states, _ = _fixed_point("while", [s for _, s in carry], abstract, ctx)
    init = tuple(_adopt_to(v, s, t) for (v, s), t in zip(carry, carry_states, strict=True))
    cond_run = _run(parts.cond, [*cstates, *carry_states], ctx)
    box: list[State | None] = []
    body_run = _run(parts.body, [*bstates, *carry_states], ctx, box)

    def cond_fn(c: tuple[Any, ...]) -> Any:
        return cond_run(*cvals, *c)[0]

    def body_fn(c: tuple[Any, ...]) -> tuple[Any, ...]:
        outs = body_run(*bvals, *c)
        return tuple(_adopt_to(o, s, t) for o, s, t in zip(outs, box, carry_states, strict=True))

    final = lax.while_loop(cond_fn, body_fn, init)
    return list(zip(final, carry_states, strict=True))
