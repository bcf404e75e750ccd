"""Everything that depends on how this JAX version spells jaxprs and primitives.

Written against jax 0.10.2 and run on the releases in `JAX_VERSIONS_TESTED`. Only
`jax.extend.core` (the public extension API) is imported; what may move between
releases is the set of equation parameters read here (`jaxpr`, `call_jaxpr`,
`branches`, scan's and while's counts) and the primitive names. When upgrading JAX,
this is the one module to re-check.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import jax
from jax.extend import core as jex
from jax.extend.core import primitives as prims

from dtypes import is_tracer  # (the one test of a tracer, both packages')

__all__ = [
    "CALLS",
    "COND",
    "CUSTOM_JVP",
    "CUSTOM_VJP",
    "INLINED_AT_LOWERING",
    "JAX_VERSIONS_TESTED",
    "REMAT",
    "SCAN",
    "SHARD_MAP",
    "WHILE",
    "ClosedJaxpr",
    "Jaxpr",
    "Literal",
    "Primitive",
    "bind_eqn",
    "closed",
    "inner_jaxpr",
    "is_differentiated",
    "is_tracer",
    "primitive_names",
    "prims",
    "scan_counts",
    "shard_mapped",
    "while_counts",
]

# The JAX releases the test suite passed on: what pip installs on Python 3.11, the
# oldest Python supported, and on Python 3.13, the newest CI has (docs/design.md §8).
# .ci/run runs the suite on both and fails when the JAX it ran is not listed here, so
# this record cannot go stale unnoticed.
JAX_VERSIONS_TESTED = ("0.10.2", "0.12.0.1")

# `jax.jit(f, inline=INLINED_AT_LOWERING)`: a `jit` called inside another program is
# lowered into the caller's function, where this JAX can do that while every jaxpr
# keeps the call (jax 0.12: `jax.Inline.JAX_LATE`). XLA then compiles and schedules its
# operations as the caller's own, and anything that evaluates a jaxpr eagerly (an eager
# `grad`, `checkpoint` or `custom_vjp`) still runs the call compiled. Older JAX inlines
# only into the jaxpr (`inline=True`), which those evaluators then run operation by
# operation; there a call stays a call (False).
INLINED_AT_LOWERING: Any = getattr(getattr(jax, "Inline", None), "JAX_LATE", False)

ClosedJaxpr = jex.ClosedJaxpr
Jaxpr = jex.Jaxpr
Literal = jex.Literal
Primitive = jex.Primitive


def scan_counts(params: dict[str, Any]) -> tuple[int, int]:
    """(number of constants, number of carries) of a `scan` equation.

    jax 0.10 names them `num_consts` and `num_carry`; jax 0.11 packs the inputs
    as (consts, carry, xs) in a flat tree, `ft_in`, whose parts have lengths.
    """
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


def while_counts(params: dict[str, Any]) -> tuple[int, int]:
    """(constants of the condition, constants of the body) of a `while` equation."""
    return int(params["cond_nconsts"]), int(params["body_nconsts"])


def is_differentiated(x: Any) -> bool:
    """Whether `x` is being differentiated (a JVP or linearize tracer, at any depth).

    Forward-mode and linearize tracers carry a `tangent`; batching tracers
    wrap their value in `val`. A value traced by `jit` alone is neither. Duck
    typing on these two attributes avoids importing JAX's private tracer
    classes (jax 0.10: `ad.JVPTracer`, `ad.LinearizeTracer`, `batching.BatchTracer`).
    """
    seen = 0
    while is_tracer(x) and seen < 64:
        if hasattr(x, "tangent") and hasattr(x, "primal"):
            return True
        x = getattr(x, "val", None)
        seen += 1
    return False


def primitive_names() -> frozenset[str]:
    """The names of the primitives defined so far: every `Primitive` bound to a
    module-level name of an imported module (JAX's own, a library's, the user's).

    JAX publishes no complete list: `jax.extend.core.primitives` lacks some
    that jaxprs hold (jax 0.10: `optimization_barrier`, `split`,
    `ragged_dot_general`, ...), so the loaded modules are read instead (about
    20 ms with a few thousand modules). Only plain modules are read, by type
    and `vars`: a lazily loaded module would import itself on first attribute
    access, and `isinstance` would ask proxy objects for their `__class__`.
    """
    names: set[str] = set()
    for module in list(sys.modules.values()):
        if type(module) is types.ModuleType:
            values = list(vars(module).values())
            names.update(v.name for v in values if issubclass(type(v), jex.Primitive))
    return frozenset(names)


def closed(jaxpr: Any) -> tuple[Any, list[Any]]:
    """(open jaxpr, consts) from a `ClosedJaxpr` or an open `Jaxpr`."""
    if isinstance(jaxpr, jex.ClosedJaxpr):
        return jaxpr.jaxpr, list(jaxpr.consts)
    return jaxpr, []


def bind_eqn(eqn: Any, *invals: Any) -> list[Any]:
    """Evaluate one equation exactly as JAX's own jaxpr evaluator does.

    `get_bind_params` turns stored sub-jaxprs back into the callables the
    primitive's `bind` expects (custom_jvp/custom_vjp keep their rules). In
    jax 0.10 it returns one dict, the callables under `subfuns`; older
    releases returned `(subfuns, params)`.
    """
    params = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(params, tuple):  # jax < 0.7
        subfuns, params = params
        out = eqn.primitive.bind(*subfuns, *invals, **params)
    else:
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def inner_jaxpr(eqn: Any) -> Any:
    """The body of a call-like equation (`jit`, `closed_call`, `call`, `remat`)."""
    for name in ("jaxpr", "call_jaxpr"):
        if name in eqn.params:
            return eqn.params[name]
    raise KeyError(f"equation {eqn.primitive.name} holds no jaxpr")


# Call-like primitives whose body is evaluated inline by the interpreter.
CALLS = frozenset(p for p in (prims.jit_p, prims.closed_call_p, prims.call_p) if p is not None)
REMAT = prims.remat_p
CUSTOM_JVP = prims.custom_jvp_call_p
CUSTOM_VJP = prims.custom_vjp_call_p
COND = prims.cond_p
SCAN = prims.scan_p
WHILE = prims.while_p
#: `shard_map`'s primitive is not in `jax.extend` (jax 0.10 to 0.12): known by name.
SHARD_MAP = "shard_map"


def shard_mapped(params: dict[str, Any], fn: Any) -> Any:
    """`fn` mapped over shards as a `shard_map` equation with `params` maps its body:
    the same mesh, specs, manual axes and check (jax 0.10 to 0.12 name them
    `mesh`, `in_specs`, `out_specs`, `newly_manual_axes`, `check_vma`)."""
    return jax.shard_map(
        fn,
        mesh=params["mesh"],
        in_specs=params["in_specs"],
        out_specs=params["out_specs"],
        axis_names=params.get("newly_manual_axes", frozenset()),
        check_vma=params.get("check_vma", True),
    )
