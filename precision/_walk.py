"""One walk of a jaxpr, for every interpretation of it.

`walk(jaxpr, consts, inputs, interpretation)` evaluates a jaxpr equation by
equation the way JAX's own evaluator does, with the values an interpretation
chooses (`precision.apply`'s interpreter walks `(value, State)` pairs under the
precision rules; calibration's recorder walks `(value, Origin, Tag)` triples and
adds up statistics; `explain` reads the interpreter's notes). The walk owns what
every interpretation shares:

- the environment of variables, literals and constants (`Interpretation.literal`,
  `Interpretation.constant`);
- which primitives hold jaxprs, and how their parameters name them: every kind
  of the one primitive table (`precision._primitives`) is dispatched here, and
  nowhere else;
- calls (`jit`, `closed_call`, `call`): their bodies are walked inline;
- the parts of each other higher-order primitive, read from its parameters
  once (`Scan`, `While`, `ShardMap`), through `_jax_compat`.

An interpretation decides what those primitives mean for its values: the
`remat`, `custom_jvp` and `custom_vjp` wrappers (`Interpretation.wrapped`: the
function is their body; derivatives are theirs), `cond`, `scan`, `while` and
`shard_map`. A higher-order primitive JAX adds is one branch of `_dispatch` and
one hook; a first-order one is one row of the primitive table.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, Literal, TypeVar

from . import _jax_compat as compat
from . import _primitives

__all__ = ["Interpretation", "Scan", "ShardMap", "While", "Wrapper", "walk", "walk_closed"]

_V = TypeVar("_V")

Wrapper = Literal["remat", "custom_jvp", "custom_vjp"]


@dataclasses.dataclass(frozen=True)
class Scan:
    """A `scan` equation's parts: its inputs are `consts`, then `carry`, then `xs`."""

    body: Any  # ClosedJaxpr
    n_consts: int
    n_carry: int
    length: int
    reverse: bool
    unroll: Any


@dataclasses.dataclass(frozen=True)
class While:
    """A `while` equation's parts: its inputs are the condition's constants, the
    body's constants, then the carry."""

    cond: Any  # ClosedJaxpr
    body: Any  # ClosedJaxpr
    n_cond_consts: int
    n_body_consts: int


@dataclasses.dataclass(frozen=True)
class ShardMap:
    """A `shard_map` equation's body and what re-maps a new body the same way."""

    body: Any  # Jaxpr of one shard
    params: dict[str, Any]


class Interpretation(Generic[_V]):
    """What a walk's values are, and what each kind of equation does to them.

    `equation` handles every first-order primitive; the higher-order hooks get
    their parts read by the walk. Each hook's default raises: an interpretation
    says what it does with each.
    """

    def literal(self, value: Any) -> _V:
        raise NotImplementedError

    def constant(self, value: Any) -> _V:
        raise NotImplementedError

    def equation(self, eqn: Any, ins: list[_V]) -> list[_V]:
        """A first-order equation (any kind but `walked`)."""
        raise NotImplementedError

    def wrapped(self, eqn: Any, kind: Wrapper, body: Any, ins: list[_V]) -> list[_V]:
        """`remat`, `custom_jvp` or `custom_vjp`: `body` (a jaxpr, open or closed)
        computes the function; the equation itself holds its derivatives."""
        raise NotImplementedError

    def cond(self, eqn: Any, index: _V, branches: list[Any], ops: list[_V]) -> list[_V]:
        raise NotImplementedError

    def scan(self, eqn: Any, parts: Scan, ins: list[_V]) -> list[_V]:
        raise NotImplementedError

    def while_loop(self, eqn: Any, parts: While, ins: list[_V]) -> list[_V]:
        raise NotImplementedError

    def shard_map(self, eqn: Any, parts: ShardMap, ins: list[_V]) -> list[_V]:
        raise NotImplementedError


def walk(jaxpr: Any, consts: list[Any], inputs: list[_V], interp: Interpretation[_V]) -> list[_V]:
    """Evaluate the open `jaxpr` (with `consts` for its constvars) on `inputs`."""
    env: dict[Any, _V] = {}

    def read(var: Any) -> _V:
        if isinstance(var, compat.Literal):
            return interp.literal(var.val)
        return env[var]

    for var, c in zip(jaxpr.constvars, consts, strict=True):
        env[var] = interp.constant(c)
    for var, v in zip(jaxpr.invars, inputs, strict=True):
        env[var] = v
    for eqn in jaxpr.eqns:
        outs = _dispatch(eqn, [read(v) for v in eqn.invars], interp)
        for var, out in zip(eqn.outvars, outs, strict=True):
            env[var] = out
    return [read(v) for v in jaxpr.outvars]


def walk_closed(closed_jaxpr: Any, inputs: list[_V], interp: Interpretation[_V]) -> list[_V]:
    """`walk` of a jaxpr that may be closed (its constants inside) or open."""
    inner, consts = compat.closed(closed_jaxpr)
    return walk(inner, consts, inputs, interp)


def _dispatch(eqn: Any, ins: list[_V], interp: Interpretation[_V]) -> list[_V]:
    p = eqn.primitive
    if _primitives.kind_of(p.name) != "walked":
        return interp.equation(eqn, ins)
    if p in compat.CALLS:
        return walk_closed(compat.inner_jaxpr(eqn), ins, interp)
    if p is compat.REMAT:
        return interp.wrapped(eqn, "remat", eqn.params["jaxpr"], ins)
    if p is compat.CUSTOM_JVP:
        return interp.wrapped(eqn, "custom_jvp", eqn.params["call_jaxpr"], ins)
    if p is compat.CUSTOM_VJP:
        return interp.wrapped(eqn, "custom_vjp", eqn.params["call_jaxpr"], ins)
    if p is compat.COND:
        return interp.cond(eqn, ins[0], list(eqn.params["branches"]), ins[1:])
    if p is compat.SCAN:
        params = eqn.params
        nc, nk = compat.scan_counts(params)
        parts = Scan(params["jaxpr"], nc, nk, params["length"], params["reverse"], params["unroll"])
        return interp.scan(eqn, parts, ins)
    if p is compat.WHILE:
        params = eqn.params
        cn, bn = compat.while_counts(params)
        return interp.while_loop(
            eqn, While(params["cond_jaxpr"], params["body_jaxpr"], cn, bn), ins
        )
    if p.name == compat.SHARD_MAP:
        return interp.shard_map(eqn, ShardMap(eqn.params["jaxpr"], dict(eqn.params)), ins)
    raise AssertionError(f"walked primitive {p.name} has no branch here")  # pragma: no cover
