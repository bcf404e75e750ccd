"""The precision rules: one table keyed by primitive name.

Every value the interpreter handles carries a *state*: `None` for a weak value
(a Python scalar, a constant made inside the function, anything derived only
from those) or for a non-floating value, else a `State` naming the format the
value lives in. A rule receives `(value, state)` pairs for one equation and
returns them for its outputs; the default rule is: all formatted inputs share
one format (else `PrecisionMismatchError`), weak inputs adopt it, the
primitive runs on the logical values, and each floating output is rounded
onto the format's grid.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dtypes

from ._errors import PrecisionMismatchError
from ._jax_compat import bind_eqn
from ._tensor import carries_gradient, round_nearest

__all__ = [
    "RULES",
    "State",
    "adopt",
    "codes_of",
    "common_state",
    "fit_scaling",
    "integer_codes",
    "join",
    "round_to",
    "rule_for",
]


class State(NamedTuple):
    """Where a floating value lives: its format, the scaling valid for its shape,
    and whether it descends from a Tensor (else from a raw array argument)."""

    format: dtypes.Format
    scaling: dtypes.Scaling | None
    tensor: bool


Val = tuple[Any, State | None]


def dtype_of(x: Any) -> np.dtype:
    dt = getattr(x, "dtype", None)
    return np.dtype(dt) if dt is not None else np.asarray(x).dtype


def is_float(x: Any) -> bool:
    return bool(jnp.issubdtype(dtype_of(x), jnp.floating))


def _name(state: State) -> str:
    return state.format.name


def mismatch(op: str, a: State, b: State) -> PrecisionMismatchError:
    """The error for two formats meeting in one operation."""
    if not a.tensor or not b.tensor:
        arr, ten = (a, b) if not a.tensor else (b, a)
        return PrecisionMismatchError(
            f"cannot combine a full-precision {_name(arr)} array and a {_name(ten)} tensor in "
            f"`{op}`: a raw array argument is full precision and formats never mix silently; "
            f'wrap it explicitly, e.g. precision.Tensor(x).to_reduced_precision("{_name(ten)}"), '
            "or convert the tensor with t.to_full_precision()"
        )
    return PrecisionMismatchError(
        f"cannot combine {_name(a)} and {_name(b)} tensors in `{op}`; convert one explicitly, "
        f'e.g. b.to_reduced_precision("{_name(a)}") or a.to_full_precision()'
    )


def join(op: str, a: State | None, b: State | None) -> State | None:
    """The common state of two values, or raise when their formats differ."""
    if a is None:
        return b
    if b is None:
        return a
    if a.format != b.format:
        raise mismatch(op, a, b)
    return a if a.tensor or not b.tensor else a._replace(tensor=True)


def common_state(op: str, vals: list[Val]) -> tuple[State | None, tuple[int, ...]]:
    """(shared state of the floating inputs, shape of the first formatted input)."""
    state, shape = None, ()
    for v, s in vals:
        if s is None or not is_float(v):
            continue
        if state is None:
            state, shape = s, np.shape(v)
        else:
            state = join(op, state, s)
    return state, shape


def fit_scaling(
    scaling: dtypes.Scaling | None, in_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> dtypes.Scaling | None:
    """The scaling an output keeps: the input's when shapes agree, else per-tensor."""
    if scaling is None or isinstance(scaling, dtypes.PerTensor) or in_shape == out_shape:
        return scaling
    return dtypes.PerTensor(power_of_two=scaling.power_of_two)


def round_to(value: Any, state: State) -> Any:
    """`value` snapped onto the state's format (identity for full precision)."""
    fmt = state.format
    if fmt.is_full_precision or not is_float(value):
        return value
    return round_nearest(fmt, value, state.scaling)


def adopt(value: Any, state: State | None) -> Any:
    """A weak value meeting `state` takes its format.

    Like a Python scalar meeting a narrow JAX array, a weak value is rounded
    onto an unscaled float format's grid. A scaled format has no single grid a
    lone constant could be put on, so weak values stay as they are there.
    """
    if state is None or state.scaling is not None or state.format.kind != "float":
        return value
    if state.format.is_full_precision or not is_float(value):
        return value
    return round_nearest(state.format, jnp.asarray(value))


# Ops whose floating outputs are input elements moved, selected or negated:
# an element keeps its exact value, so a value on the format's grid stays on
# it (rounding would be the identity) and, for scaled formats, re-scaling
# waits until a Tensor is finally stored.
MOVES = frozenset(
    {
        "reshape",
        "transpose",
        "broadcast_in_dim",
        "squeeze",
        "expand_dims",
        "slice",
        "dynamic_slice",
        "dynamic_update_slice",
        "gather",
        "concatenate",
        "rev",
        "copy",
        "copy_p",
        "select_n",
        "pad",
        "neg",
        "abs",
        "max",
        "min",
        "reduce_max",
        "reduce_min",
        "cummax",
        "cummin",
        "sort",
        "stop_gradient",
        "sharding_constraint",
        "device_put",
        "optimization_barrier",
        "clamp",
    }
)

# Ops that map a value on a binary float grid to a value on the same grid
# (integers below 2**(mantissa+1) are on every such grid, larger grid values
# are integers already); for unscaled float formats rounding is the identity.
GRID_PRESERVING = frozenset({"sign", "floor", "ceil", "round", "reduce_precision"})


def default_rule(eqn, vals: list[Val]) -> list[Val]:
    op = eqn.primitive.name
    state, in_shape = common_state(op, vals)
    if state is None:
        return [(o, None) for o in bind_eqn(eqn, *(v for v, _ in vals))]
    inputs = [adopt(v, state) if s is None else v for v, s in vals]
    outs = bind_eqn(eqn, *inputs)
    result = _finish(op, outs, state, in_shape)
    if op in CODE_MOVES and state.format.kind == "int":
        _track_moved_codes(vals, result)
    return result


# Moves of one operand whose result holds a subset of its elements, unchanged:
# a per-tensor integer encoding stays valid with the same scale, so the codes
# can move instead of being re-quantized (gather is left out: its fill mode can
# produce values that are not codes).
CODE_MOVES = frozenset(
    {
        "reshape",
        "transpose",
        "broadcast_in_dim",
        "squeeze",
        "expand_dims",
        "slice",
        "dynamic_slice",
        "rev",
        "copy",
        "copy_p",
        "neg",
        "abs",
        "reduce_max",
        "reduce_min",
        "stop_gradient",
        "sharding_constraint",
    }
)


def _track_moved_codes(vals: list[Val], result: list[Val]) -> None:
    registry = _CODES.get()
    floats = [v for v, _ in vals if is_float(v)]
    if registry is None or len(floats) != 1:
        return
    src = registry.get(id(floats[0]))
    if src is None or src[0] is not floats[0] or not isinstance(src[3], dtypes.PerTensor):
        return
    for o, _ in result:
        if is_float(o):
            registry[id(o)] = (o, None, src[2].reshape(()), src[3])


def codes_of(entry: tuple) -> Any:
    """The integer codes of a registered value (recovered exactly from value / scale:
    a code times its scale divided by the scale rounds back to the code)."""
    value, codes, scale, scaling = entry[:4]
    if codes is not None:
        return codes
    full = scaling.broadcast(scale, value.shape) if value.ndim else scale
    return jnp.rint(value / full).astype(jnp.int8)


def _finish(op: str, outs: list[Any], state: State, in_shape) -> list[Val]:
    result = []
    for o in outs:
        if not is_float(o):
            result.append((o, None))
            continue
        s = state._replace(scaling=fit_scaling(state.scaling, in_shape, np.shape(o)))
        if _keeps_grid(op, s, o):
            result.append((o, s))
        else:
            result.append((_round_and_register(o, s), s))
    return result


def _round_and_register(value: Any, state: State) -> Any:
    """`round_to(value, state)`, remembering its encoding for formats that need one.

    Integer, scaled and code-stored formats keep their storage in an encoding
    (codes and scales) rather than in a container cast. The encoding that the
    rounding itself computed is registered with the rounded value, so a Tensor
    result reuses it instead of quantizing the rounded value a second time (XLA
    merges the two identical quantizations), and an integer dot that consumes
    the value can accumulate its codes exactly.
    """
    rounded = round_to(value, state)
    registry = _CODES.get()
    fmt = state.format
    if registry is None or fmt.is_full_precision or carries_gradient(fmt, state.scaling):
        return rounded
    enc = fmt.encode(lax.stop_gradient(value), scaling=state.scaling)
    registry[id(rounded)] = (rounded, None, enc.scale, enc.scaling, enc)
    return rounded


def _keeps_grid(op: str, state: State, out: Any) -> bool:
    if op in MOVES:
        return True
    if op == "convert_element_type":
        # Widening to float32/float64 is exact; every format's grid fits in float32.
        return dtype_of(out).itemsize >= 4
    return op in GRID_PRESERVING and state.scaling is None and state.format.kind == "float"


@functools.cache
def _cpu_native_formats() -> frozenset[str]:
    """Formats whose own dot `apply` hands to XLA's CPU backend: none by default.

    With `PRECISION_CPU_BF16_DOTS=1` in the environment (read once), bfloat16
    dots go to XLA's bfloat16 kernel, which uses the processor's AMX tiles
    where it has them: 1.3 TFLOP/s against 0.23 for float32 at 2048x2048 on a
    2-core Xeon with `amx_bf16` (benchmarks/accelerator.py); without AMX it is
    slower than float32. It is opt-in because its sums come in another order
    than the float32 path's, so results would change with the processor (on
    digits, the demo's bf16-pure rows swap places by one test image).
    """
    if os.environ.get("PRECISION_CPU_BF16_DOTS", "") == "1":
        return frozenset({"bfloat16"})
    return frozenset()


def _native_path(op: str, fmt: dtypes.Format, state: State) -> np.dtype | None:
    """The container to hand XLA's contraction directly, if the format has one and it is fast."""
    if fmt.kind != "float" or state.scaling is not None:
        return None
    native = fmt.native_dtype
    if native is None or fmt.is_full_precision or native.itemsize >= 4:
        return None
    if jax.default_backend() == "cpu" and (
        op != "dot_general" or native.name not in _cpu_native_formats()
    ):
        return None  # (XLA's bfloat16 convolutions on CPU are no faster than float32's)
    return native


def contraction_rule(eqn, vals: list[Val]) -> list[Val]:
    """dot_general / conv_general_dilated: accumulate in the logical dtype.

    On GPU/TPU (and for bfloat16 dots on CPU with `PRECISION_CPU_BF16_DOTS=1`)
    the narrow container goes to XLA as it is, with `preferred_element_type`
    set to the logical dtype. On CPU the inputs, already decoded to float32,
    are multiplied in float32 (the default on CPU); products of
    two values of at most 12 significant bits are exact in float32, so both
    paths keep the same contract: exact products, float32 accumulation. tf32 inputs are on the
    tf32 grid already, so a float32 product at HIGHEST precision emulates it.
    """
    op = eqn.primitive.name
    state, in_shape = common_state(op, vals)
    if state is None or state.format.is_full_precision:
        return default_rule(eqn, vals)
    a, b = (adopt(v, state) if s is None else v for v, s in vals)
    if op == "dot_general" and state.format.kind == "int":
        exact = _integer_dot(eqn, a, b)
        if exact is not None:
            return _finish(op, [exact], state, in_shape)
    out_dtype = eqn.outvars[0].aval.dtype
    native = _native_path(op, state.format, state)
    params = dict(eqn.params)
    if native is not None:
        a, b = a.astype(native), b.astype(native)
        params["preferred_element_type"] = out_dtype
    elif state.format == dtypes.tf32:
        params["precision"] = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    out = eqn.primitive.bind(a, b, **params)
    return _finish(op, [out], state, in_shape)


# -- exact integer accumulation ------------------------------------------------------
# Integer codes of the Tensor arguments of the current evaluation, keyed by the
# id of their decoded value (the value itself is kept too, so the id stays
# unique while the entry lives). Filled by the interpreter, read by dot_general.
_CODES: contextvars.ContextVar[dict[int, tuple] | None] = contextvars.ContextVar(
    "precision_codes", default=None
)


@contextlib.contextmanager
def integer_codes(registry: dict[int, tuple]):
    """Make `registry` visible to rules: id(value) -> (value, codes, scale, scaling[,
    encoding]), codes None where they are recovered from value / scale, encoding
    the `dtypes.Encoded` a Tensor result can store as it is."""
    token = _CODES.set(registry)
    try:
        yield
    finally:
        _CODES.reset(token)


def _scale_factor(value, scale, scaling, contract: tuple[int, ...], keep_order) -> Any | None:
    """The operand's scales as a function of its kept dims, or None if they vary
    along a contracted dim (then they do not factor out of the sum)."""
    ndim = value.ndim
    if isinstance(scaling, dtypes.PerAxis | dtypes.PerBlock) and scaling.axis % ndim in contract:
        return None
    full = scaling.broadcast(scale, value.shape) if ndim else scale
    for d in sorted(contract, reverse=True):
        full = lax.index_in_dim(full, 0, axis=d, keepdims=False)
    kept = [d for d in range(ndim) if d not in contract]
    return jnp.transpose(full, [kept.index(d) for d in keep_order])


def _integer_dot(eqn, a, b):
    """Exact int32 accumulation of the codes, then one rescale, when both
    operands are integer-format Tensor arguments whose scales factor out.

    The codes' products and their sum are exact in int32 (|sum| <= K * qmax**2);
    the result then differs from a float32 product of the decoded values only
    by float32 rounding. Gradients are those of the float32 product (the codes
    carry none), through a custom jvp.
    """
    registry = _CODES.get() or {}
    ea, eb = registry.get(id(a)), registry.get(id(b))
    if ea is None or eb is None or ea[0] is not a or eb[0] is not b:
        return None
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = tuple(lc), tuple(rc), tuple(lb), tuple(rb)
    l_free = [d for d in range(a.ndim) if d not in lc and d not in lb]
    r_free = [d for d in range(b.ndim) if d not in rc and d not in rb]
    sa = _scale_factor(a, ea[2], ea[3], lc, [*lb, *l_free])
    sb = _scale_factor(b, eb[2], eb[3], rc, [*rb, *r_free])
    if sa is None or sb is None:
        return None
    nb = len(lb)
    sa = sa.reshape(sa.shape + (1,) * len(r_free))
    sb = sb.reshape(sb.shape[:nb] + (1,) * len(l_free) + sb.shape[nb:])
    dims = eqn.params["dimension_numbers"]
    out_dtype = eqn.outvars[0].aval.dtype

    @jax.custom_jvp
    def exact(a, b, ca, cb, sa, sb):
        acc = lax.dot_general(ca, cb, dims, preferred_element_type=jnp.int32)
        return (acc.astype(jnp.float32) * sa * sb).astype(out_dtype)

    @exact.defjvp
    def _jvp(primals, tangents):
        a, b = primals[:2]
        ta, tb = tangents[:2]
        bind = functools.partial(eqn.primitive.bind, **eqn.params)
        return exact(*primals), bind(ta, b) + bind(a, tb)

    return exact(a, b, codes_of(ea), codes_of(eb), sa, sb)


RULES: dict[str, Callable[[Any, list[Val]], list[Val]]] = {
    "dot_general": contraction_rule,
    "conv_general_dilated": contraction_rule,
}


def rule_for(name: str) -> Callable[[Any, list[Val]], list[Val]]:
    """The rule of a primitive (the default one unless the table names it)."""
    return RULES.get(name, default_rule)
