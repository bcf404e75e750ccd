"""An independent emulation of `precision.apply` under one compute format, for tests.

Nothing here uses `precision` or `dtypes` beyond recognising a `Tensor` argument,
reading its decoded values (`np.asarray`) and reading a `scan`'s counts of constants and
carries through `precision._jax_compat` (how this JAX release spells them; checked
against JAX's own loops in test_jax_compat.py, not a rule of the library). The rule it
implements is the one docs/design.md §5 states: an operation with an input in the
compute format brings its other floating inputs (raw arrays, weak scalars) onto that
format, runs the primitive on the float32 values, and rounds each floating output once
onto the format; an operation with no such input runs as JAX runs it. The primitive runs
eagerly, one at a time, in plain JAX on float32 values; the rounding is ml_dtypes' cast
(round to nearest even), or, for tf32, an integer bit manipulation. Calls and custom
derivative rules are inlined; a `scan` is unrolled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import ml_dtypes
import numpy as np
from jax.extend import core as jex

from precision._jax_compat import scan_counts

__all__ = ["assert_same_bits", "emulate", "reference_round"]


def _tf32_round(x: np.ndarray) -> np.ndarray:
    """Round float32 onto the tf32 grid (10 mantissa bits), nearest-even, on bits."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 13) & 1
    out = ((bits + 0xFFF + lsb) & ~np.uint64(0x1FFF)).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out)


NATIVE = {
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e4m3": ml_dtypes.float8_e4m3,
    "float8_e3m4": ml_dtypes.float8_e3m4,
    # no inf and no NaN: overflow and inf saturate to ±max, as docs/formats.md says
    "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
    "float6_e3m2fn": ml_dtypes.float6_e3m2fn,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
}


def reference_round(x: Any, name: str) -> np.ndarray:
    """float32 values snapped onto format `name` by an independent implementation."""
    x = np.asarray(x, np.float32)
    if name == "tf32":
        return _tf32_round(x)
    if name == "float32":
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(NATIVE[name]).astype(np.float32)


def assert_same_bits(actual: Any, expected: Any, what: str = "") -> None:
    """Equal float32 bit patterns (any NaN equals any NaN), with the first differences."""
    a = np.asarray(actual, np.float32)
    e = np.asarray(expected, np.float32)
    assert a.shape == e.shape, (a.shape, e.shape)
    both_nan = np.isnan(a) & np.isnan(e)
    same = (a.view(np.uint32) == e.view(np.uint32)) | both_nan
    assert same.all(), (
        f"{what}: {(~same).sum()} of {same.size} differ: "
        f"{a[~same][:5]} != {e[~same][:5]} at {np.argwhere(~same)[:5].tolist()}"
    )


def _floating(x: Any) -> bool:
    dtype = x.dtype if hasattr(x, "dtype") else np.result_type(x)
    return bool(np.issubdtype(dtype, np.floating))


class _Emulator:
    def __init__(self, name: str) -> None:
        self.name = name

    def round(self, x: Any) -> np.ndarray:
        return reference_round(np.asarray(x, np.float32), self.name)

    def run(self, jaxpr: Any, consts: list[Any], args: list[tuple[Any, bool]]) -> list[Any]:
        env: dict[Any, tuple[Any, bool]] = {}

        def read(v: Any) -> tuple[Any, bool]:
            return (v.val, False) if isinstance(v, jex.Literal) else env[v]

        for var, c in zip(jaxpr.constvars, consts, strict=True):
            env[var] = (c, False)
        for var, a in zip(jaxpr.invars, args, strict=True):
            env[var] = a
        for eqn in jaxpr.eqns:
            outs = self.equation(eqn, [read(v) for v in eqn.invars])
            for var, out in zip(eqn.outvars, outs, strict=True):
                env[var] = out
        return [read(v) for v in jaxpr.outvars]

    def inline(self, sub: Any, ins: list[tuple[Any, bool]]) -> list[Any]:
        if isinstance(sub, jex.ClosedJaxpr):
            return self.run(sub.jaxpr, list(sub.consts), ins)
        return self.run(sub, [], ins)

    def equation(self, eqn: Any, ins: list[tuple[Any, bool]]) -> list[Any]:
        name, params = eqn.primitive.name, eqn.params
        if name == "scan":
            return self.scan(eqn, ins)
        if name in ("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"):
            sub = params.get("call_jaxpr", params.get("fun_jaxpr"))
            return self.inline(sub, ins)
        if "jaxpr" in params:  # a call: jit, closed_call, remat
            return self.inline(params["jaxpr"], ins)
        if any(k in params for k in ("branches", "body_jaxpr", "call_jaxpr")):
            raise NotImplementedError(f"the emulation has no rule for `{name}`")
        formatted = any(f and _floating(v) for v, f in ins)
        vals = [self.round(v) if formatted and _floating(v) else v for v, _ in ins]
        outs = eqn.primitive.bind(*vals, **params)
        outs = outs if eqn.primitive.multiple_results else [outs]
        return [
            (self.round(o), True) if formatted and _floating(o) else (np.asarray(o), False)
            for o in outs
        ]

    def scan(self, eqn: Any, ins: list[tuple[Any, bool]]) -> list[Any]:
        p = eqn.params
        (nc, nk), length = scan_counts(p), p["length"]
        consts, carry, xs = ins[:nc], ins[nc : nc + nk], ins[nc + nk :]
        ys = []
        steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
        for i in steps:
            outs = self.inline(p["jaxpr"], [*consts, *carry, *((v[i], f) for v, f in xs)])
            carry, y = outs[:nk], outs[nk:]
            ys.append(y)
        if p["reverse"]:
            ys.reverse()
        stacked = [
            (np.stack([y[j][0] for y in ys]), any(y[j][1] for y in ys))
            for j in range(len(eqn.outvars) - nk)
        ]
        return [*carry, *stacked]


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def emulate(f: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`f` evaluated as `precision.apply(f)` under compute format `name` should evaluate it.

    Each argument leaf that is a Tensor is given as its decoded values
    (`np.asarray(t)`) and counts as being in the format; other array leaves
    are raw float32; anything else is static. Returns numpy arrays.
    """

    def call(*args: Any) -> Any:
        from precision import Tensor  # only to recognise the leaves

        leaves, tree = jax.tree.flatten(args, is_leaf=lambda x: isinstance(x, Tensor))
        dynamic = [i for i, x in enumerate(leaves) if isinstance(x, Tensor) or _is_array(x)]
        values = [
            np.asarray(leaves[i], np.float32) if isinstance(leaves[i], Tensor) else leaves[i]
            for i in dynamic
        ]
        formatted = [isinstance(leaves[i], Tensor) for i in dynamic]

        def g(*dyn: Any) -> Any:
            full = list(leaves)
            for i, v in zip(dynamic, dyn, strict=True):
                full[i] = v
            return f(*jax.tree.unflatten(tree, full))

        closed, out_shape = jax.make_jaxpr(g, return_shape=True)(*values)
        outs = _Emulator(name).inline(closed, list(zip(values, formatted, strict=True)))
        return jax.tree.unflatten(jax.tree.structure(out_shape), [np.asarray(v) for v, _ in outs])

    return call
