"""`dot_general` and `conv_general_dilated`: where codes are used and where values are.

The choice is made in one function, `contraction_rule`, with a reason for
each branch:

1. Two integer storage operands whose scales factor out of the sum take the
   exact path: int32 accumulation of the codes, then one rescale. Exact and
   the narrow hardware path (an `s8 x s8 -> s32` dot).
2. Otherwise storage operands are decoded *at the contraction*; on CPU inside
   a conditional on the other operand, so XLA cannot hoist every layer's
   decode to the start of the program (8 unrolled int4 layers would
   otherwise hold every float32 weight at once).
3. Compute-format operands (bfloat16, float16, fp8) go to XLA in their
   native container with float32 accumulation where the backend has fast
   kernels (GPU/TPU; bfloat16 dots on CPUs with AMX when
   `PRECISION_CPU_BF16_DOTS=1`); elsewhere the values, already on the
   format's grid, are multiplied in float32 (products of two values of at
   most 12 significant bits are exact in float32, so both paths keep the
   contract: exact products, float32 accumulation). tf32 multiplies at
   HIGHEST precision. A float32 operand is rounded into the compute format at
   the contraction, like a decode: rounding every weight first held them all
   at once and cost time (docs/benchmarks.md, "Models": ResNet-18 under
   bfloat16 compute).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dtypes

from .._storage import is_float
from ._explain_notes import emitted, explained_backend, note, observe, settle
from ._int_operands import codes, dot_operands, kept_scale
from ._quantized import quantized_contraction
from ._rules import Val, op_state, operands_at_use, rounded_outputs
from ._state import Context, Stored

__all__ = ["contraction_rule"]


@functools.cache
def _cpu_native_formats() -> frozenset[str]:
    """Formats whose own dot `apply` hands to XLA's CPU backend: none by default.

    With `PRECISION_CPU_BF16_DOTS=1` in the environment (read once), bfloat16
    dots go to XLA's bfloat16 kernel, which uses the processor's AMX tiles
    where it has them: 1.3 TFLOP/s against 0.23 for float32 at 2048x2048 on a
    2-core Xeon with `amx_bf16` (benchmarks/accelerator.py); without AMX it is
    slower than float32. It is opt-in because its sums come in another order
    than the float32 path's, so results would change with the processor.
    """
    if os.environ.get("PRECISION_CPU_BF16_DOTS", "") == "1":
        return frozenset({"bfloat16"})
    return frozenset()


def _native_container(op: str, fmt: dtypes.Format) -> np.dtype | None:
    """The narrow container of a compute format that XLA contracts as it is, if any."""
    if not isinstance(fmt, dtypes.FloatFormat):
        return None
    native = fmt.native_dtype
    if native is None or fmt.is_full_precision or native.itemsize >= 4:
        return None
    return native


# Containers a GPU's or TPU's dot writes its result in (float8 results are not asked for:
# no accelerator run has checked a dot that writes float8)
_NARROW_RESULTS = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


def _cpu_container(op: str, native: np.dtype | None) -> np.dtype | None:
    """The container XLA:CPU contracts a compute format's operands in: float32 (None)
    unless bfloat16 dots are opted in (XLA's bfloat16 convolutions on CPU are no faster
    than float32's)."""
    if native is not None and op == "dot_general" and native.name in _cpu_native_formats():
        return native
    return None


def _transposed_as_itself(round_: Callable[[jax.Array], jax.Array], t: jax.Array) -> jax.Array:
    """`round_(t)`, which JAX takes for a linear map whose transpose is `round_` again.

    A tangent must be built from operations JAX can transpose. `custom_linear_solve`
    with the identity as its matrix is one whose solve (and transposed solve) we choose:
    the rounding. `reduce_precision` is linear to JAX in the same way, but flushes the
    subnormals of formats with fewer exponent bits than float32's.
    """
    rounded: jax.Array = lax.custom_linear_solve(
        lambda v: v, t, solve=lambda _, b: round_(b), transpose_solve=lambda _, b: round_(b)
    )
    return rounded


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _narrow_gradient(fmt: dtypes.FloatFormat, x: jax.Array) -> jax.Array:
    """`x`, whose tangents (and so, transposed, its cotangents) are rounded to `fmt`.

    A contraction in a narrow compute format (bfloat16, float16, a float8) on a GPU or
    TPU is differentiated as its narrow dot: the cotangent entering the gradient dots is
    converted to the format and their results are written in it. The float32 dot that
    stands for it on XLA:CPU rounds the same two values through this identity, so that
    the gradients are the same numbers on every platform. The rounding is exact
    (float16's and float8's subnormals included) and no backend can skip it: a GPU
    deletes a float32 -> float16 -> float32 convert pair, not this.
    """
    return x


@_narrow_gradient.defjvp
def _narrow_gradient_jvp(
    fmt: dtypes.FloatFormat, primals: tuple[Any, ...], tangents: tuple[Any, ...]
) -> Any:
    (x,), (t,) = primals, tangents
    if np.dtype(t.dtype) == fmt.native_dtype:  # held in the format: on its grid already
        rounded = t
    elif fmt == dtypes.bfloat16:  # float32's exponent range: one fused op, linear to JAX
        rounded = lax.reduce_precision(t, exponent_bits=8, mantissa_bits=7)
    else:
        rounded = _transposed_as_itself(fmt.round, t)
    return _narrow_gradient(fmt, x), rounded


def _float_contraction(
    eqn: Any,
    vals: list[Val],
    state: Any,
    native: np.dtype | None,
    *,
    narrow_result: bool = False,
    gradients: dtypes.FloatFormat | None = None,
) -> jax.Array:
    """The contraction of `vals` in their compute format, its operands in `native` (with
    float32 sums) or in float32 (None), made where they are used.

    With `narrow_result` the dot writes its result in `native` itself: the float32 sums
    rounded once to nearest-even, the very rounding `rounded_outputs` applies next (so
    that one finds every value already on its grid), and half the bytes written. With
    `gradients` the cotangent into the contraction and the cotangents out of it are
    rounded to that format (`_narrow_gradient`): what the format's dot's own derivative
    does, made explicit so that a float32 dot standing for it does the same and no
    backend can skip it (a convert pair may be deleted; these roundings are not).
    """
    a, b = operands_at_use(vals, state, native)
    if gradients is not None:
        a, b = _narrow_gradient(gradients, a), _narrow_gradient(gradients, b)
    params = dict(eqn.params)
    wanted = eqn.outvars[0].aval.dtype
    if native is not None:
        params["preferred_element_type"] = native if narrow_result else wanted
    elif state.format == dtypes.tf32:
        params["precision"] = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
    out: jax.Array = eqn.primitive.bind(a, b, **params)
    if narrow_result:
        out = out.astype(wanted)
    if gradients is not None:  # in float32: the narrow cotangent is then made from it
        out = _narrow_gradient(gradients, out)
    return out


def contraction_rule(eqn: Any, vals: list[Val], ctx: Context) -> list[Val]:
    out = _contraction(eqn, vals, ctx)
    observe(out[0][0])  # for `explain(..., measure_error=True)`; else nothing
    return out


def _contraction(eqn: Any, vals: list[Val], ctx: Context) -> list[Val]:
    op = eqn.primitive.name
    state = op_state(op, vals, ctx)
    if state is None:
        with note(eqn, vals, "plain JAX (no Tensor operand)"):
            return [(eqn.primitive.bind(*(v for v, _ in vals), **eqn.params), None)]
    if ctx.contract is not None and op not in ctx.float32_ops:
        with note(eqn, vals, f"quantized at the contraction: {ctx.contract.describe()}"):
            return quantized_contraction(eqn, vals, ctx, state)
    with note(eqn, vals, ""):
        (a, sa), (b, sb) = vals
        stored_a = sa.stored if sa is not None else None
        stored_b = sb.stored if sb is not None else None
        if op == "dot_general" and stored_a is not None and stored_b is not None:
            exact = _integer_dot(eqn, a, b, stored_a, stored_b)
            if exact is not None:
                settle(
                    f"exact integer dot: {stored_a.enc.format.name} x "
                    f"{stored_b.enc.format.name} codes, int32 sums, one rescale"
                )
                return rounded_outputs(op, [exact], state)
        # Narrow containers go to the dot where the backend has fast kernels for them:
        # decided by the platform the program is lowered for, not the machine tracing it.
        native = _native_container(op, state.format)
        on_cpu = _cpu_container(op, native)
        backend = explained_backend()  # explain's words only; None when it is not recording
        if backend is not None:
            here = on_cpu if backend == "cpu" else native
            settle(_float_path(vals, state, here))
            if here is not None:
                emitted(here, here)
        pair = [(a, sa), (b, sb)]
        # bfloat16 and float16 results come out of the GPU's and TPU's dots in their
        # format: their float32 sums rounded to nearest-even, as `rounded_outputs` rounds
        # them; and every path of a contraction in a narrow format differentiates as that
        # format's dot does
        narrow = native is not None and native in _NARROW_RESULTS
        fmt = state.format
        grads = fmt if native is not None and isinstance(fmt, dtypes.FloatFormat) else None
        if on_cpu == native:
            out = _float_contraction(eqn, pair, state, native, gradients=grads)
        else:
            out = _per_platform(
                cpu=lambda: _float_contraction(eqn, pair, state, on_cpu, gradients=grads),
                default=lambda: _float_contraction(
                    eqn, pair, state, native, narrow_result=narrow, gradients=grads
                ),
            )
        return rounded_outputs(op, [out], state)


def _per_platform(cpu: Callable[[], jax.Array], default: Callable[[], jax.Array]) -> jax.Array:
    """`lax.platform_dependent(cpu=cpu, default=default)` whose backward pass chooses its
    platform again instead of receiving the forward's choice.

    Differentiated, a plain `platform_dependent` passes its platform index to the backward
    pass as a residual. Across a `jit` boundary (`apply`'s own, or a caller's nested one)
    the index is then no constant in the backward function, the conditional holding the
    transposed contractions survives until after XLA:CPU has put its convolutions in the
    form its fast kernels take, and the weight-gradient convolution ran 16-28x slower (the
    demo's bf16-mixed step: 360 ms against 22). Under a checkpoint the backward pass
    recomputes the choice where it is used (a constant there). The residuals are then
    the contraction's operands as they enter it: on the CPU what they were before; on a
    GPU or TPU their float32 values, which the backward pass converts again into the
    narrow container (an elementwise convert XLA fuses into the dot), instead of narrow
    copies."""
    chosen: Callable[[], jax.Array] = jax.checkpoint(
        lambda: lax.platform_dependent(cpu=cpu, default=default), prevent_cse=False
    )
    return chosen()


def _float_path(vals: list[Val], state: Any, native: np.dtype | None) -> str:
    """How the operands of a float contraction reach its dot, in words (`explain`)."""
    fmt = state.format
    parts = []
    for v, s in vals:
        stored = s.stored if s is not None else None
        if stored is not None:
            parts.append(f"{stored.enc.format.name} decoded at use into {fmt.name}")
        elif is_float(v) and not fmt.is_full_precision and (s is None or s.format != fmt):
            parts.append(f"{'float32' if s is None else s.format.name} rounded into {fmt.name}")
        else:
            parts.append(f"{fmt.name if s is None else s.format.name} as is")
    if native is not None:
        dot = f"{np.dtype(native).name} dot, float32 sums"
    elif fmt == dtypes.tf32:
        dot = "float32 dot at highest precision (tf32 products)"
    else:
        dot = "float32 dot"
    return f"{dot}: " + "; ".join(parts)


def _integer_dot(eqn: Any, a: jax.Array, b: jax.Array, ea: Stored, eb: Stored) -> jax.Array | None:
    """Exact int32 accumulation of the codes, then one rescale, when both
    operands are integer storage whose scales factor out.

    The codes' products and their sum are exact in int32 (|sum| <= K * qmax**2);
    the result then differs from a float32 product of the decoded values only
    by float32 rounding. Gradients are those of the float32 product (the codes
    carry none), through a custom jvp.
    """
    fa, fb = ea.enc.format, eb.enc.format
    if fa.kind != "int" or fb.kind != "int":
        return None
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = tuple(lc), tuple(rc), tuple(lb), tuple(rb)
    l_free = [d for d in range(a.ndim) if d not in lc and d not in lb]
    r_free = [d for d in range(b.ndim) if d not in rc and d not in rb]
    sa = kept_scale(ea.enc, lc, [*lb, *l_free])
    sb = kept_scale(eb.enc, rc, [*rb, *r_free])
    if sa is None or sb is None:
        return None
    nb = len(lb)
    sa = sa.reshape(sa.shape + (1,) * len(r_free))
    sb = sb.reshape(sb.shape[:nb] + (1,) * len(l_free) + sb.shape[nb:])
    dims = eqn.params["dimension_numbers"]
    out_dtype = eqn.outvars[0].aval.dtype

    @jax.custom_jvp
    def exact(
        a: jax.Array, b: jax.Array, ca: jax.Array, cb: jax.Array, sa: jax.Array, sb: jax.Array
    ) -> jax.Array:
        operands = dot_operands(ca, cb, dims)
        emitted(*(x.dtype for x in operands))
        acc = lax.dot_general(*operands, dims, preferred_element_type=jnp.int32)
        return (acc.astype(jnp.float32) * sa * sb).astype(out_dtype)

    @exact.defjvp
    def _jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        a, b = primals[:2]
        ta, tb = tangents[:2]
        bind = functools.partial(eqn.primitive.bind, **eqn.params)
        return exact(*primals), bind(ta, b) + bind(a, tb)

    return exact(a, b, codes(ea), codes(eb), sa, sb)
