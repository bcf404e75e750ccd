"""`precision.apply`: run any JAX function on Tensors under the precision rules.

`apply(f)` returns a function that flattens its arguments, stands each
Tensor in as its logical value (storage is decoded inside the compiled
function, at each op that uses it), traces `f` to a jaxpr, and evaluates
that jaxpr with `_interpreter.evaluate`. All of this happens inside one
`jax.jit` per static signature (tree structure, formats, scalings, shapes,
the declaration), so repeated eager calls neither retrace nor recompile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import dtypes
from dtypes import PrecisionTypeError

from .. import _jax_compat as compat
from .._codes_layout import swap_perm, swapped
from .._compute import Context, State, Stored, View
from .._context import FormatLike, resolve_format
from .._contract import ContractLike, as_contract
from .._errors import PrecisionError
from .._placement import check_devices
from .._policy import DEFAULT_FLOAT32_OPS, Policy, PolicyLike
from .._storage import (
    carries_gradient,
    compute_format,
    decode_encoded,
    encode_on_grid,
    encode_values,
    full_format,
    is_float,
    straight_through,
)
from .._tensor import Tensor
from ._interpreter import evaluate

__all__ = ["apply"]

_TENSOR, _ARRAY, _WEAK, _STATIC = 0, 1, 2, 3
_TWO_TENSORS = object()  # key tag of the two-Tensor fast path


def _concrete(x: Any) -> bool:
    """Whether `x` is a concrete JAX array (not a tracer, not numpy): decided per value,
    never cached, so a first call inside a trace changes nothing for later calls."""
    return isinstance(x, jax.Array) and not compat.is_tracer(x)


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


@functools.cache
def _positional_treedef(n: int) -> Any:
    return jax.tree_util.tree_structure(((0,) * n, {}))


def _static_key(leaf: Any) -> Any:
    if isinstance(leaf, slice):
        return ("slice", leaf.start, leaf.stop, leaf.step)
    try:
        hash(leaf)
    except TypeError:
        raise PrecisionTypeError(
            f"apply: argument leaf of type {type(leaf).__name__} is neither an array, a Tensor "
            "nor a hashable static value; pass arrays or hashable options"
        ) from None
    return (type(leaf), leaf)


# How one output leaf is rebuilt: None for a plain array, else the Tensor's
# pytree structure and its number of array leaves.
_Desc = tuple[Any, int]


class _Entry:
    """One compiled signature: the jitted evaluator and how to rebuild its outputs.

    `fn` is set by `_build`; `out_desc` and `out_tree` when `fn` first traces.
    """

    __slots__ = ("fn", "out_desc", "out_plain", "out_sig", "out_tree")
    fn: Callable[..., Any]
    out_desc: list[_Desc | None]
    out_sig: Any  # the single result's signature, cached at its first rebuild
    out_plain: tuple[Any, ...] | None  # (format, last, dtype) of an unscaled single result
    out_tree: Any  # a jax PyTreeDef (jaxlib ships no stub for it)

    def __init__(self) -> None:
        self.out_sig = None
        self.out_plain = None

    def rebuild(self, flat: list[Any]) -> Any:
        if self.out_tree.num_leaves == 1 and self.out_tree.num_nodes == 1:
            # a single result (every operator): no tree to rebuild
            desc = self.out_desc[0]
            if desc is None:
                return flat[0]
            if (plain := self.out_plain) is not None:
                # an unscaled result (eager operators): its storage is the one array
                fmt, last, dtype = plain
                t = Tensor._make(dtypes.Encoded(flat[0], None, fmt, None, last), dtype)
                t._signature = self.out_sig
                return t
            out = jax.tree_util.tree_unflatten(desc[0], flat)
            # the result's static signature is the same on every call: reuse it
            if self.out_sig is None:
                self.out_sig = out.signature()
                enc = out._encoded
                if len(flat) == 1 and enc.scaling is None and out._straight_through is None:
                    self.out_plain = (enc.format, enc._last, out._dtype)
            else:
                out._signature = self.out_sig
            return out
        leaves, at = [], 0
        for desc in self.out_desc:
            if desc is None:
                leaves.append(flat[at])
                at += 1
                continue
            tdef, n = desc
            leaves.append(jax.tree_util.tree_unflatten(tdef, flat[at : at + n]))
            at += n
        return jax.tree_util.tree_unflatten(self.out_tree, leaves)


def _storage_of(value: Any, state: State, dtype: np.dtype, ctx: Context) -> dtypes.Encoded:
    """The storage of one Tensor result: moved codes, the declared output, or its format."""
    if ctx.output is not None:
        fmt = ctx.output
        return encode_values(fmt, value, fmt.default_scaling())
    if state.stored is not None:
        enc = state.stored.enc
        scale = enc.scale
        if scale is not None and isinstance(enc.scaling, dtypes.PerTensor) and enc.shape:
            # as a fresh per-tensor encoding holds it
            return dtypes.Encoded(
                enc.data,
                scale.reshape((1,) * len(enc.shape)),
                enc.format,
                enc.scaling,
                enc.shape[-1] if enc.format.packed else None,
                tensor_scale=enc.tensor_scale,
                zero_point=enc.zero_point,
            )
        return enc
    fmt = state.format
    if fmt.is_full_precision and np.dtype(value.dtype) != fmt.container:
        return encode_values(full_format(dtype), value, None)
    if state.rounded is not None and state.rounded.value is value:
        # converted from what the walk rounded: the same bits, one rounding (`Rounded`)
        return encode_values(fmt, state.rounded.raw, None)
    return encode_on_grid(fmt, value)  # (a state's format holds its value on its grid)


def _build(
    f: Callable[..., Any],
    treedef: Any,
    kinds: list[int],
    leaves: list[Any],
    ctx: Context,
    diff: bool,
) -> _Entry:
    entry = _Entry()
    # each Tensor argument: its pytree structure (static) and number of arrays
    tensors = {}
    for i, leaf in enumerate(leaves):
        if kinds[i] == _TENSOR:
            tdef = jax.tree_util.tree_structure(leaf)
            tensors[i] = (tdef, tdef.num_leaves)  # type: ignore[attr-defined]  # no jaxlib stub
    statics = {i: leaf for i, leaf in enumerate(leaves) if kinds[i] == _STATIC}

    def run(*dyn: Any) -> Any:
        it = iter(dyn)
        values: list[Any] = []
        states: list[State | None] = []
        positions: list[int] = []
        for i, kind in enumerate(kinds):
            if kind == _STATIC:
                continue
            if kind == _TENSOR:
                tdef, n = tensors[i]
                t = jax.tree_util.tree_unflatten(tdef, [next(it) for _ in range(n)])
                value, state = _tensor_input(t)
                values.append(value)
                states.append(state)
            elif kind == _ARRAY:
                x = next(it)
                values.append(x)
                states.append(State(full_format(x.dtype), False) if is_float(x) else None)
            else:
                values.append(next(it))
                states.append(None)
            positions.append(i)

        def flat_f(*xs: Any) -> Any:
            full = [statics.get(i) for i in range(len(kinds))]
            for i, x in zip(positions, xs, strict=True):
                full[i] = x
            args, kwargs = jax.tree_util.tree_unflatten(treedef, full)
            return f(*args, **kwargs)

        closed, out_shape = jax.make_jaxpr(flat_f, return_shape=True)(*values)
        outs = evaluate(
            closed.jaxpr, list(closed.consts), list(zip(values, states, strict=True)), ctx
        )
        out_leaves, entry.out_tree = jax.tree_util.tree_flatten(out_shape)
        flat, entry.out_desc = _tensor_outputs(outs, out_leaves, ctx, diff)
        return flat

    # (lowered into a caller's program where JAX can: `compat.INLINED_AT_LOWERING`)
    entry.fn = jax.jit(run, inline=compat.INLINED_AT_LOWERING)
    return entry


def _tensor_input(t: Tensor) -> tuple[Any, State]:
    """A Tensor argument as the walk takes it: its value (the straight-through view while
    differentiated, else its decoded values) and its state."""
    enc, dtype = t.encoded, t.dtype
    fmt, scaling = enc.format, enc.scaling
    if t._straight_through is not None:
        if carries_gradient(fmt, scaling):
            return t._straight_through, State(fmt, True)
        return t._straight_through, State(full_format(dtype), True, None, fmt.name)
    # decoded (widened) where an op uses it; this eager value serves moves
    value = decode_encoded(enc, dtype)
    if scaling is None and fmt.kind == "float":  # a compute format
        stored = None if fmt.is_full_precision else Stored(enc, dtype)
        return value, State(fmt, True, stored)
    # storage: counts as its logical dtype
    state = State(full_format(dtype), True, Stored(enc, dtype), fmt.name)
    if t._layout is None:
        return value, state
    # codes held transposed: the logical value is a view of the held one, which a
    # quantized contraction reads as held; every other op sees the logical storage
    logical = State(state.format, True, Stored(swapped(enc), dtype), fmt.name)
    view = View(value, state, swap_perm(value.ndim))
    return value.swapaxes(-1, -2), logical._replace(view=view)


def _tensor_outputs(
    outs: list[tuple[Any, State | None]], out_leaves: list[Any], ctx: Context, diff: bool
) -> tuple[list[Any], list[_Desc | None]]:
    """The walk's outputs as arrays, and how to rebuild them: a floating output that
    descends from a Tensor becomes a Tensor's arrays (its pytree structure and number of
    arrays), any other output is itself (None)."""
    flat: list[Any] = []
    desc: list[_Desc | None] = []
    for (v, s), spec in zip(outs, out_leaves, strict=True):
        if s is None or not s.tensor or not is_float(v):
            flat.append(v)
            desc.append(None)
            continue
        dtype = np.dtype(spec.dtype)
        enc = _storage_of(v, s, dtype, ctx)
        st = None
        if diff and not carries_gradient(enc.format, enc.scaling):
            st = straight_through(dtype, v, enc)
        children, tdef = jax.tree_util.tree_flatten(Tensor._make(enc, dtype, st))
        flat.extend(children)
        desc.append((tdef, len(children)))
    return flat, desc


def _context(
    compute: FormatLike | None,
    policy: PolicyLike | None,
    contract: ContractLike | None = None,
    strict: Any = False,
) -> Context:
    """The declaration of one `apply` call, validated once, when it is made."""
    if policy is not None:
        if isinstance(policy, str):
            policy = Policy.parse(policy)
        if not isinstance(policy, Policy):
            raise PrecisionTypeError(
                f"apply: `policy` must be a precision.Policy or its string form such as "
                f'"params=float32,compute=bfloat16,output=float32", got {type(policy).__name__}'
            )
    fmt = None
    if compute is not None:
        fmt = resolve_format(compute)
    elif policy is not None:
        fmt = policy.compute
    if fmt is not None:
        fmt = compute_format(fmt, "apply")
    ops = frozenset() if policy is None else policy.float32_ops
    if policy is None and fmt is not None and not fmt.is_full_precision:
        ops = DEFAULT_FLOAT32_OPS
    if fmt is not None and fmt.is_full_precision:
        fmt, ops = None, frozenset()  # float32 compute is the undeclared default for storage
    output = None
    if policy is not None and policy.output != policy.compute:
        output = policy.output
    if not isinstance(strict, bool):
        raise PrecisionTypeError(f"apply: `strict` must be True or False, got {strict!r}")
    return Context(fmt, ops, output, as_contract(contract), strict)


def _top_level_floats(args: tuple[Any, ...], kwargs: dict[str, Any], n: int) -> set[int]:
    """Positions, among the leaves of `(args, kwargs)`, of the floats passed directly as
    arguments. Those are weak and traced (as `jax.jit` treats them); a float inside a
    container (an Equinox module's `Dropout(p=0.0)`, a dict of options) is static, as
    Equinox's filters treat it, so a module's configuration stays Python."""
    items = (*args, *(kwargs[k] for k in sorted(kwargs)))
    if not any(isinstance(a, float | np.floating) for a in items):
        return set()
    top, at = set(), 0
    for a in items:
        if isinstance(a, float | np.floating):
            top.add(at)
            at += 1
        else:
            at += len(jax.tree_util.tree_leaves(a, is_leaf=_is_tensor))
    if at != n:  # leaves counted differently (never expected): every float stays traced
        return set(range(n))
    return top


def _cached_call(
    f: Callable[..., Any], ctx: Context, cache: dict[Any, _Entry]
) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """How `apply(f)` runs any arguments: flattened, keyed by their static signature
    (tree, formats, shapes, static values, whether differentiated), evaluated by the
    program compiled once per key into `cache`, and rebuilt into Tensors.

    The wrapper's two-Tensor path for operators reads the same `cache` first."""

    def call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not kwargs and all(type(a) is Tensor for a in args):
            # Fast path (operators): positional Tensors need no tree walk.
            leaves, treedef = list(args), _positional_treedef(len(args))
        else:
            leaves, treedef = jax.tree_util.tree_flatten((args, kwargs), is_leaf=_is_tensor)
        kinds: list[int] = []
        parts: list[Any] = [treedef]
        dyn: list[Any] = []
        top = _top_level_floats(args, kwargs, len(leaves))
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor):
                kinds.append(_TENSOR)
                dyn.extend(jax.tree_util.tree_leaves(leaf))
                parts.append(leaf.signature())
            elif isinstance(leaf, jax.Array | np.ndarray) or compat.is_tracer(leaf):
                kinds.append(_ARRAY)
                dyn.append(leaf)
                parts.append((leaf.shape, leaf.dtype))
            elif isinstance(leaf, float | np.floating) and i in top:
                kinds.append(_WEAK)
                dyn.append(float(leaf))
                parts.append(_WEAK)
            else:
                kinds.append(_STATIC)
                parts.append(_static_key(leaf))
        if len(dyn) > 1:
            check_devices(leaves)
        diff = any(compat.is_differentiated(x) for x in dyn)
        parts.append(diff)
        key = tuple(parts)
        entry = cache.get(key)
        if entry is None:
            entry = cache[key] = _build(f, treedef, kinds, leaves, ctx, diff)
            if (
                len(leaves) == 2
                and kinds == [_TENSOR, _TENSOR]
                and len(dyn) == 2
                and not kwargs
                and not diff
            ):
                cache[(_TWO_TENSORS, id(key[1]), id(key[2]))] = entry
        try:
            flat = entry.fn(*dyn)
        except PrecisionError as err:
            # Raised while tracing, before anything ran: re-raise it plainly,
            # without the JAX-internal frames and notes the trace attached.
            raise type(err)(*err.args) from None
        return entry.rebuild(flat)

    return call


def apply(
    f: Callable[..., Any],
    *,
    compute: FormatLike | None = None,
    policy: PolicyLike | None = None,
    contract: ContractLike | None = None,
    strict: bool = False,
) -> Callable[..., Any]:
    """Make `f` (any JAX function) run on Tensors under the precision rules.

    The returned function accepts Tensors anywhere in its (pytree) arguments,
    plus raw arrays (full precision), Python floats and numpy scalars passed as
    arguments (weak: they adopt the format they meet; traced, so new values do
    not recompile), PRNG keys (passed through) and hashable static options
    (ints, strings, slices, and floats inside a container such as an Equinox
    module's `Dropout(p=0.0)`, as Equinox's filters treat them: part of the
    cache key). Inside `f` each Tensor is its logical value.

    Compute formats (unscaled floats: bfloat16, float16, tf32, fp8, float32)
    are arithmetic precisions: every floating result of an op on bfloat16
    inputs is rounded onto bfloat16's grid. Storage encodings (int8, int4,
    scaled fp8, MX blocks) are decoded where they are used, exactly, into the
    logical dtype, and results are not re-encoded: an int8 weight and a
    float32 bias meet freely. Two compute formats never mix silently.

    Args:
        f: a function of arrays, e.g. a model's apply function.
        compute: declare the compute format of every op (a name or format,
            `precision.FormatLike`): float32 values and decoded storage are
            brought to it at their first use; a Tensor in another reduced
            compute format still raises. Under a declared narrower format the
            ops of `precision.DEFAULT_FLOAT32_OPS` (softmax and normalisation
            statistics, losses, reductions) stay in float32.
        policy: a `precision.Policy` or its string (`precision.PolicyLike`,
            e.g. `"mixed_bfloat16"`): its `compute` is declared as above, its
            `float32_ops` replace the default list, and Tensor results are
            returned in its `output` format.
        contract: quantize every `dot_general` / `conv_general_dilated` at
            the contraction (`precision.ContractLike`): a format name
            (`"int8"`: W8A8 with per-row scales and int32 accumulation;
            `"float8_e4m3fn"`: fp8 with one scale per tensor) or a
            `precision.Contract` (forward and backward formats, tensorwise /
            rowwise / MX scaling). Results are rescaled into the compute
            format; gradients are straight-through. A contraction that cannot take the declared
            narrow path (MX blocks, a format XLA has no dot for) runs in
            float32 on the quantized values and warns once per call site
            (`PrecisionFallbackWarning`).
        strict: raise `PrecisionFallbackError` instead of that warning.

    Returns:
        The wrapped function.

    Raises:
        PrecisionMismatchError: two compute formats meet in one operation, or
            storage meets a narrower compute format without a declaration
            (raised before anything is computed).
        PrecisionFallbackError: with `strict=True`, a declared quantized
            contraction cannot take its narrow path.
        DeviceMismatchError: Tensors on different devices.

    Examples:
        >>> import jax.numpy as jnp
        >>> import precision
        >>> x = precision.Tensor([1.0, 2.0, 3.0]).to_reduced_precision("bfloat16")
        >>> y = precision.apply(lambda a: jnp.exp(a) / 3.0)(x)
        >>> y.format.name, y.numpy().tolist()
        ('bfloat16', [0.90625, 2.453125, 6.71875])
        >>> w = precision.Tensor([[1.0, -2.0], [0.5, 4.0]]).to_reduced_precision("int8")
        >>> out = precision.apply(lambda w, b: w @ jnp.ones(2) + b)(w, jnp.array([0.5, 0.5]))
        >>> out.format.name  # int8 weights and a float32 bias: float32 arithmetic
        'float32'
        >>> half = precision.apply(jnp.tanh, compute="bfloat16")(w)
        >>> half.format.name  # the int8 codes decoded into bfloat16 arithmetic
        'bfloat16'
        >>> precision.apply(jnp.sum, compute="bfloat16")(w).format.name  # sums stay float32
        'float32'
    """
    if not callable(f):
        raise PrecisionTypeError(
            f"precision.apply needs the function to run, got {type(f).__name__} {f!r:.60}; "
            "pass e.g. precision.apply(model.apply) or precision.apply(lambda w, x: x @ w)"
        )
    ctx = _context(compute, policy, contract, strict)
    cache: dict[Any, _Entry] = {}
    call = _cached_call(f, ctx, cache)

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not kwargs and len(args) == 2:
            a, b = args
            if (
                type(a) is Tensor
                and type(b) is Tensor
                and a._straight_through is None
                and b._straight_through is None
                and (ea := a._encoded).scale is None
                and (eb := b._encoded).scale is None
                and ea.tensor_scale is None
                and eb.tensor_scale is None
                and ea.zero_point is None
                and eb.zero_point is None
            ):
                # Fastest path (binary operators on unscaled Tensors): the key
                # is the two cached signatures, the arguments the two arrays.
                # (signatures are interned: equal ones are one object, ids stable)
                entry = cache.get(
                    (
                        _TWO_TENSORS,
                        id(a._signature or a.signature()),
                        id(b._signature or b.signature()),
                    )
                )
                if entry is not None:
                    da, db = ea.data, eb.data
                    # Only concrete JAX arrays take this path; traced data (inside
                    # jit, grad, vmap) and numpy leaves take the full one, which keys
                    # on differentiation and checks devices of abstract values.
                    if not _concrete(da) or not _concrete(db):
                        return call(args, kwargs)
                    if da.sharding is not db.sharding and da.sharding != db.sharding:
                        check_devices(args)
                    return entry.rebuild(entry.fn(da, db))
        return call(args, kwargs)

    return wrapper
