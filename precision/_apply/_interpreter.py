"""The jaxpr walk: evaluate a traced function equation by equation under the rules.

`evaluate` binds each equation's primitive on `(value, state)` pairs through
the rule `_compute.rule_for` names. The rules decide every format; the walk
itself reads a format only to slice stacked storage for a `scan`
(`_scan_slice`: which arrays vary along the stacking axis). Call-like
equations (`jit`, `closed_call`, `remat`) are evaluated inline;
`custom_jvp_call` and `custom_vjp_call` are re-wrapped so the primal runs
under the rules while derivatives come from the function's own rule;
`cond`, `scan` and `while` run their bodies through the interpreter inside
the same `lax` control flow, loop carries kept in one compute format (a carry
that starts weak, e.g. zeros, adopts the format the body gives it). A scan
over stacked storage (an int4 weight per layer) scans the codes and scales
themselves and decodes one layer per iteration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax

import dtypes

from .. import _jax_compat as compat
from .._compute import Context, State, Stored, Val, in_compute_format, join, rule_for
from .._compute._moves import squeezed_scaling
from .._compute._notes import paused
from .._storage import decode_encoded, is_float

__all__ = ["evaluate"]


# -- evaluation ----------------------------------------------------------------
def evaluate(jaxpr: Any, consts: list[Any], invals: list[Val], ctx: Context) -> list[Val]:
    """Evaluate an open jaxpr on `(value, state)` pairs under the precision rules."""
    env: dict[Any, Val] = {}

    def read(var: Any) -> Val:
        if isinstance(var, compat.Literal):
            return (var.val, None)
        return env[var]

    for var, c in zip(jaxpr.constvars, consts, strict=True):
        env[var] = (c, None)  # constants made inside the function are weak
    for var, v in zip(jaxpr.invars, invals, strict=True):
        env[var] = v
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        handler = _HIGHER_ORDER.get(eqn.primitive)
        outs = handler(eqn, ins, ctx) if handler else rule_for(eqn.primitive.name)(eqn, ins, ctx)
        for var, out in zip(eqn.outvars, outs, strict=True):
            env[var] = out
    return [read(v) for v in jaxpr.outvars]


def _plain(states: list[State | None]) -> list[State | None]:
    """States for a sub-function traced apart (its storage arrays are not visible there)."""
    return [None if s is None else s.plain() for s in states]


def _run(
    jaxpr: Any, states: list[State | None], ctx: Context, box: list[State | None] | None = None
) -> Callable[..., tuple[Any, ...]]:
    """A function of plain values evaluating `jaxpr` with fixed input states."""
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
    """A loop carry or branch output brought to the format its slot holds."""
    if target is None or state is not None or not is_float(value):
        return value
    return in_compute_format([(value, None)], target)[0]


def _call(eqn: Any, ins: list[Val], ctx: Context) -> list[Val]:
    inner, consts = compat.closed(compat.inner_jaxpr(eqn))
    return evaluate(inner, consts, ins, ctx)


def _remat(eqn: Any, ins: list[Val], ctx: Context) -> list[Val]:
    box: list[State | None] = []
    fn = _run(eqn.params["jaxpr"], _plain([s for _, s in ins]), ctx, box)
    params = eqn.params
    outs = jax.checkpoint(fn, prevent_cse=params["prevent_cse"], policy=params["policy"])(
        *(v for v, _ in ins)
    )
    return list(zip(outs, box, strict=True))


def _custom_jvp(eqn: Any, ins: list[Val], ctx: Context) -> list[Val]:
    """The primal under the rules; tangents from the function's own jvp rule."""
    box: list[State | None] = []
    primal = _run(eqn.params["call_jaxpr"], _plain([s for _, s in ins]), ctx, box)
    wrapped = jax.custom_jvp(primal)

    @wrapped.defjvp
    def _jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        outs = primal(*primals)
        _, tans = jax.jvp(lambda *xs: tuple(compat.bind_eqn(eqn, *xs)), primals, tangents)
        return outs, tans

    outs = wrapped(*(v for v, _ in ins))
    return list(zip(outs, box, strict=True))


def _custom_vjp(eqn: Any, ins: list[Val], ctx: Context) -> list[Val]:
    """The primal under the rules; cotangents from the function's own fwd/bwd."""
    box: list[State | None] = []
    primal = _run(eqn.params["call_jaxpr"], _plain([s for _, s in ins]), ctx, box)
    wrapped = jax.custom_vjp(primal)

    def fwd(*xs: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return primal(*xs), xs

    def bwd(xs: tuple[Any, ...], cts: tuple[Any, ...]) -> tuple[Any, ...]:
        _, vjp = jax.vjp(lambda *a: tuple(compat.bind_eqn(eqn, *a)), *xs)
        grads: tuple[Any, ...] = vjp(tuple(cts))
        return grads

    wrapped.defvjp(fwd, bwd)
    outs = wrapped(*(v for v, _ in ins))
    return list(zip(outs, box, strict=True))


def _cond(eqn: Any, ins: list[Val], ctx: Context) -> list[Val]:
    (index, _), ops = ins[0], ins[1:]
    branches = eqn.params["branches"]
    values, states = [v for v, _ in ops], _plain([s for _, s in ops])
    per_branch = [_abstract_states(br, values, states, ctx) for br in branches]
    joined: list[State | None] = []
    for slot in zip(*per_branch, strict=True):
        acc: State | None = None
        for s in slot:
            acc = join("cond", acc, s)
        joined.append(acc)

    def make(br: Any) -> Callable[..., tuple[Any, ...]]:
        box: list[State | None] = []
        run = _run(br, states, ctx, box)

        def fn(*xs: Any) -> tuple[Any, ...]:
            outs = run(*xs)
            return tuple(_adopt_to(o, s, t) for o, s, t in zip(outs, box, joined, strict=True))

        return fn

    outs = lax.switch(index, [make(br) for br in branches], *values)
    return list(zip(outs, joined, strict=True))


def _fixed_point(
    op: str,
    carry_states: list[State | None],
    abstract_args: Callable[[list[State | None]], list[State | None]],
) -> tuple[list[State | None], list[State | None]]:
    """Carry states stable under the body: weak carries adopt the body's format."""
    states = _plain(list(carry_states))
    for _ in range(len(states) + 2):
        outs = abstract_args(states)
        new = [join(op, s, o) for s, o in zip(states, outs[: len(states)], strict=True)]
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


def _scan(eqn: Any, ins: list[Val], ctx: Context) -> list[Val]:
    p = eqn.params
    nc, nk = compat.scan_counts(p)
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
        return _abstract_states(p["jaxpr"], args, [*const_states, *states, *x_states], ctx)

    carry_states, outs = _fixed_point("scan", [s for _, s in carry], abstract)
    y_states = outs[nk:]
    init = [_adopt_to(v, s, t) for (v, s), t in zip(carry, carry_states, strict=True)]

    # Stacked storage is scanned as codes and scales: one slice decoded per step.
    scanned: list[tuple[Any, ...]] = []
    rebuilds: list[tuple[Callable[..., dtypes.Encoded], State] | None] = []
    for v, s in xs:
        if s is None or s.stored is None or (sliced := _scan_slice(s.stored.enc)) is None:
            scanned.append((v,))
            rebuilds.append(None)
        else:
            scanned.append(sliced[0])
            rebuilds.append((sliced[1], s))
    inner, inner_consts = compat.closed(p["jaxpr"])
    box: list[State | None] = []

    def body(c: list[Any], x: list[tuple[Any, ...]]) -> tuple[list[Any], list[Any]]:
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
        length=p["length"],
        reverse=p["reverse"],
        unroll=p["unroll"],
    )
    return [*zip(final, carry_states, strict=True), *zip(ys, y_states, strict=True)]


def _while(eqn: Any, ins: list[Val], ctx: Context) -> list[Val]:
    p = eqn.params
    cn, bn = compat.while_counts(p)
    cconsts, bconsts, carry = ins[:cn], ins[cn : cn + bn], ins[cn + bn :]
    bvals, bstates = [v for v, _ in bconsts], _plain([s for _, s in bconsts])
    cvals, cstates = [v for v, _ in cconsts], _plain([s for _, s in cconsts])

    def abstract(states: list[State | None]) -> list[State | None]:
        args = [*bvals, *(v for v, _ in carry)]
        return _abstract_states(p["body_jaxpr"], args, [*bstates, *states], ctx)

    carry_states, _ = _fixed_point("while", [s for _, s in carry], abstract)
    init = tuple(_adopt_to(v, s, t) for (v, s), t in zip(carry, carry_states, strict=True))
    cond_run = _run(p["cond_jaxpr"], [*cstates, *carry_states], ctx)
    box: list[State | None] = []
    body_run = _run(p["body_jaxpr"], [*bstates, *carry_states], ctx, box)

    def cond_fn(c: tuple[Any, ...]) -> Any:
        return cond_run(*cvals, *c)[0]

    def body_fn(c: tuple[Any, ...]) -> tuple[Any, ...]:
        outs = body_run(*bvals, *c)
        return tuple(_adopt_to(o, s, t) for o, s, t in zip(outs, box, carry_states, strict=True))

    final = lax.while_loop(cond_fn, body_fn, init)
    return list(zip(final, carry_states, strict=True))


_HIGHER_ORDER: dict[Any, Callable[[Any, list[Val], Context], list[Val]]] = {
    **{p: _call for p in compat.CALLS},
    compat.REMAT: _remat,
    compat.CUSTOM_JVP: _custom_jvp,
    compat.CUSTOM_VJP: _custom_vjp,
    compat.COND: _cond,
    compat.SCAN: _scan,
    compat.WHILE: _while,
}
