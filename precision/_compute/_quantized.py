"""Quantization at the contraction: W8A8 and fp8 (`apply(f, contract=...)`).

When a call declares a `Contract`, `contraction_rule` hands every floating
`dot_general` / `conv_general_dilated` to `quantized_contraction`. Both
operands are quantized at that point, with current (absmax) scales, and the
contraction runs on the narrow values:

- **Layout.** Each operand is viewed as a matrix of *rows* by *summed*
  elements: rows are its non-contracting indices (batch and free dims of a
  `dot_general`; the batch dim of a convolution's input, the output-feature
  dim of its kernel), the summed part is everything the contraction adds
  over (for a convolution the feature dim last, so MX blocks run along
  channels). `"rowwise"` gives each row one scale (per token for
  activations, per output channel for weights), `"tensorwise"` one scale in
  all, `"mx"` one E8M0 scale per 32 consecutive summed elements. The codes
  and scales are exactly `fmt.encode(rows, scaling=...)` of `dtypes` on that
  matrix (`PerTensor()`, `PerAxis(0)`, OCP `PerBlock(32)`); where one
  `PerTensor` / `PerAxis` / `PerBlock` groups the operand like its rows, it
  is encoded in place instead (the same groups, so the same codes), since a
  transpose feeding the encode makes its reductions strided.
- **Tensorwise or rowwise, integer or fp8** (W8A8, fp8 per tensor / per
  row): scales are constant along the summed dims, so they factor out of the
  sum: the narrow codes themselves go to the dot (`s8 x s8 -> s32`,
  `f8 x f8 -> f32` via `preferred_element_type`), then one rescale,
  `(acc * scale_a) * scale_b`. No quantize -> dequantize round trip feeds a
  float dot: XLA:GPU deletes such round trips where excess precision is
  allowed, and an H100 then ran the "fp8" contraction as a float32 GEMM. An
  integer storage operand whose scales factor out (an int8 weight `PerAxis`
  on its output channel), or an fp8 one stored in the forward format, is
  used as stored; it is not re-quantized.
- **MX blocks** (scales vary along the sum) and formats without a
  dot-capable container: operands are dequantized from their bits (the
  `dtypes` decode, which no simplifier can undo) and contract in float32.
  JAX offers no block-scaled matmul that XLA lowers for these layouts, so
  this is an emulation, with the fp8 rounding but not the fp8 speed.
- **Gradients** (custom vjp): straight-through the quantization. The
  cotangent, quantized to `Contract.backward` when one is declared (per
  tensor / per row of the output / MX blocks along its last dim, by the
  same `scaling`), contracts with the forward operands: the two backward
  GEMMs of the fp8 HYBRID recipe. Per tensor (one scale each, which factors
  out of every sum) and with an fp8 `backward`, those take the fp8 codes
  themselves (`f8e5m2 x f8e4m3 -> f32`, exact accumulation: they sum over the
  batch or the output features); otherwise the dequantized operands, in
  float32. Residuals are the narrow codes and scales, never float32 copies.

NaN and inf in an operand make its group's scale NaN (the `dtypes` rule),
so they reach exactly the outputs that row (or the whole tensor, per
tensor) feeds, and never disappear.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeGuard

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import jaxpr_as_fun

import dtypes

from .._storage import decode_storage
from ._explain_notes import emitted, gpu_slow_path
from ._fallback import fall_back
from ._int_operands import codes, dot_operands, kept_scale
from ._operand_layouts import Layout, grad_layout, layouts, out_scale, scaling_for
from ._rules import Val, computed_at_use, decode_at_use, in_compute_format, rounded_outputs
from ._state import Context, State, Stored
from ._transposed_operands import through_views

__all__ = ["dequantize", "quantize", "quantized_contraction"]

# An integer operand as its contraction takes it: (codes, scale over its kept dims).
_IntOperand = tuple[jax.Array, jax.Array]
# What one contraction reuses as stored: integer codes of each operand, or its encoding
# when stored in the forward format itself.
_Ext = tuple[_IntOperand | None, _IntOperand | None, dtypes.Encoded | None, dtypes.Encoded | None]


def quantize(x: jax.Array, layout: Layout, fmt: dtypes.Format, scaling: str) -> dtypes.Encoded:
    """The operand encoded in `fmt` by rows (codes and scales exactly as `dtypes` makes them).

    The encoding is of the operand as it is laid out when `layout.direct(scaling)`
    groups it like its rows (the same groups, so the same codes and scales), else of
    its (rows, summed) matrix.
    """
    x = x.astype(jnp.float32)
    direct = layout.direct(scaling)
    if direct is None:
        x, direct = layout.rows(x), scaling_for(scaling)
    if _native_float(fmt, direct):
        return _encode_native_float(x, fmt, direct)
    return fmt.encode(x, scaling=direct)


def _native_float(fmt: dtypes.Format, scaling: dtypes.Scaling) -> TypeGuard[dtypes.FloatFormat]:
    """fp8 with a native container and float32 absmax scales (tensorwise, rowwise)."""
    native = fmt.native_dtype if isinstance(fmt, dtypes.FloatFormat) else None
    return (
        native is not None
        and native.itemsize == 1
        and not scaling.power_of_two
        and scaling.scale_format == "float32"
        and isinstance(scaling, dtypes.PerTensor | dtypes.PerAxis)
    )


def _encode_native_float(
    x: jax.Array, fmt: dtypes.FloatFormat, scaling: dtypes.Scaling
) -> dtypes.Encoded:
    """`fmt.encode(x, scaling=scaling)`: for fp8 `dtypes` rounds with one saturating
    convert into the container (one fused elementwise op, what an fp8 GEMM's
    producer should be)."""
    return fmt.encode(x, scaling=scaling)


def _code_values(codes: jax.Array, fmt: dtypes.Format) -> jax.Array:
    """float32 values of a quantized operand's codes, before their scales.

    Integer codes convert exactly. fp8 codes convert on XLA:CPU and are read from their
    bits elsewhere (`dtypes`' decode): XLA:GPU deletes a chain of float converts where
    excess precision is allowed, its default (its `SimplifyFPConversions` pass), so the
    codes of float32 values quantized in the same program would widen back into the
    unquantized values, and the backward pass would contract other operands than every
    other backend's (`tests/precision/test_gpu_programs.py` reads the CUDA programs).
    """
    if not jnp.issubdtype(codes.dtype, jnp.floating):
        return codes.astype(jnp.float32)

    def from_bits(c: jax.Array) -> jax.Array:
        return fmt.decode(dtypes.Encoded(c, None, fmt, None), np.float32)

    values: jax.Array = lax.platform_dependent(
        codes, cpu=lambda c: c.astype(jnp.float32), default=from_bits
    )
    return values


def dequantize(enc: dtypes.Encoded, layout: Layout, scaling: str) -> jax.Array:
    """Float32 values of a quantized operand (`quantize(x, layout, fmt, scaling)`), in
    its own layout: what the backward pass contracts with, and the forward
    operands of MX blocks (through the `dtypes` decode, built from bits).
    """
    if (
        isinstance(enc.scaling, dtypes.PerTensor | dtypes.PerAxis)
        and enc.scale is not None
        and enc.scale.dtype == np.float32
        and _native_fp8(enc.format)
    ):
        scale = enc.scale.reshape(()) if enc.scale.size == 1 else enc.scale
        values = _code_values(enc.data, enc.format) * scale
    else:
        values = enc.decode(np.float32)
    return values if layout.direct(scaling) is not None else layout.back(values)


def _int_stored(
    stored: Stored | None, layout: Layout, forward: dtypes.Format
) -> _IntOperand | None:
    """(codes, kept-dim scale) of an integer storage operand whose scales factor out and
    whose codes fit the declared format (int4 codes serve an int8 contraction, not the
    other way round). The codes stay in the operand's own layout: XLA:CPU gives its int8
    kernel a stored array as it is, and upcasts a transposed copy to s32."""
    if stored is None:
        return None
    enc = stored.enc
    fmt = enc.format
    usable_int = (
        isinstance(fmt, dtypes.IntFormat)
        and fmt.kind == "int"
        and (forward.kind == "int" and fmt.bits <= forward.bits)
    )
    usable_float = fmt == forward and _native_fp8(fmt)  # stored in the forward fp8 itself
    if not (usable_int or usable_float) or enc.scale is None or enc.scaling is None:
        return None
    scale = kept_scale(enc, layout.summed, list(layout.kept))
    if scale is None:
        return None
    return (codes(stored) if usable_int else enc.data), scale


def _zero_cotangent(x: Any) -> Any:
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


def quantized_contraction(eqn: Any, vals: list[Val], ctx: Context, state: State) -> list[Val]:
    """The declared quantized contraction of one equation (see the module docstring)."""
    spec = ctx.contract
    op = eqn.primitive.name
    fmt, scaling = spec.forward, spec.scaling
    params = dict(eqn.params)
    # Narrow codes to the dot where the scales factor out of the sum; else dequantized
    # from their bits into a float32 dot (the module docstring says why).
    integer = scaling != "mx" and (fmt.kind == "int" or _native_fp8(fmt))
    if op == "dot_general" and integer:
        # A transposed operand is taken where it lies, its dims moved (see
        # `_transposed_operands`): the same codes, quantized in the weight's own layout,
        # and a weight stored (out, in) and used as `x @ w.T` reaches the dot as stored,
        # its contracting dim last, as a GPU's fp8 and int8 GEMMs take it.
        vals, params["dimension_numbers"] = through_views(vals, params["dimension_numbers"])
    (a, sa), (b, sb) = vals
    stored_a = sa.stored if sa is not None else None
    stored_b = sb.stored if sb is not None else None
    la, lb = layouts(
        eqn, a.shape, b.shape, params["dimension_numbers"] if op == "dot_general" else None
    )
    if not integer:
        fall_back(eqn, ctx, _why_no_narrow_dot(fmt, scaling))

    # Operands: float values brought to the compute format, or storage used as stored.
    # Integer codes reach the dot as the encode fusion (or the storage) made them:
    # XLA:CPU hands such operands to its s8 x s8 -> s32 kernel, but upcasts a
    # transposed copy of codes to s32.
    ext_a = _int_stored(stored_a, la, fmt) if integer else None
    ext_b = _int_stored(stored_b, lb, fmt) if integer else None
    # Codes that cannot be quantized in place (several kept dims out of order) are
    # contracted as quantized, kept dims first, with the dimension numbers moved.
    moved_a = ext_a is None and la.direct(scaling) is None and not la.in_order
    moved_b = ext_b is None and lb.direct(scaling) is None and not lb.in_order
    moved_a, moved_b = op == "dot_general" and moved_a, op == "dot_general" and moved_b
    same_a = not integer and stored_a is not None and stored_a.enc.format == fmt
    same_b = not integer and stored_b is not None and stored_b.enc.format == fmt
    if stored_a is not None and ext_a is None and not same_a:
        a = decode_at_use(stored_a, b)  # decoded next to its use, then quantized
    if stored_b is not None and ext_b is None and not same_b:
        b = decode_at_use(stored_b, a)
    a, b = in_compute_format([(a, sa), (b, sb)], state)
    own_a = stored_a.enc if same_a and stored_a is not None else None
    own_b = stored_b.enc if same_b and stored_b is not None else None
    plan = _QuantizedContraction(
        eqn,
        params,
        fmt,
        scaling,
        spec.backward,
        integer,
        _Side(la, moved_a, same_a, _packed_last(own_a), a.dtype),
        _Side(lb, moved_b, same_b, _packed_last(own_b), b.dtype),
        spec.fast_accumulation,
        spec.backward_operands == "original",
    )
    if integer:
        _note_gpu_path((la, ext_a is not None), (lb, ext_b is not None), plan)
    out = _straight_through(plan)(a, b, (ext_a, ext_b, own_a, own_b))
    return rounded_outputs(op, [out], state)


def _packed_last(enc: dtypes.Encoded | None) -> int | None:
    """The logical last-dim length of a packed encoding (None otherwise)."""
    return enc.shape[-1] if enc is not None and enc.format.packed else None


@dataclasses.dataclass(frozen=True, eq=False)
class _Side:
    """How one operand reaches a quantized contraction (static)."""

    layout: Layout
    moved: bool  # quantized kept dims first, contracted with moved dimension numbers
    same: bool  # stored in the forward format itself: its encoding is used as stored
    last: int | None  # that encoding's packed last-dim length
    dtype: Any  # the operand's dtype, which its cotangent takes

    def dims(self, contracting: Any, batch: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The operand's (contracting, batch) dims of a `dot_general` as it reaches the
        dot: when `moved`, those of its kept dims first, then its summed dims."""
        if not self.moved:
            return tuple(contracting), tuple(batch)
        k = len(self.layout.kept)
        return tuple(range(k, k + len(self.layout.summed))), tuple(range(len(batch)))


@dataclasses.dataclass(frozen=True, eq=False)
class _QuantizedContraction:
    """What one quantized contraction computes, decided while tracing its equation:
    the contraction (`eqn` with `params`), the formats, and how each operand is taken.

    `integer`: the narrow codes themselves go to the dot (tensorwise or rowwise scales,
    an integer or native fp8 format); otherwise both operands are dequantized and
    contract in float32.
    """

    eqn: Any
    params: dict[str, Any]
    fmt: dtypes.Format
    scaling: str
    backward: dtypes.Format | None
    integer: bool
    a: _Side
    b: _Side
    fast_accumulation: bool = True
    original: bool = False  # the backward dots take the operands as given
    # each operand's quantization as traced, by (side, shape, dtype): see `_quantized`
    traced: dict[Any, Any] = dataclasses.field(default_factory=dict, repr=False)

    def bind_f32(self, x: jax.Array, y: jax.Array) -> jax.Array:
        """The contraction of float operands, accumulated in float32."""
        f32_params = {**self.params, "preferred_element_type": np.dtype(np.float32)}
        out: jax.Array = self.eqn.primitive.bind(x, y, **f32_params)
        return out

    def operands(
        self, a: jax.Array, b: jax.Array, ext: _Ext, *, once: bool = True
    ) -> tuple[Any, Any]:
        """The narrow operands (codes and scales), never float copies; with `once`, an
        operand quantized here is quantized in buffers of its own (`_computed_once`)."""
        ea, eb, sta, stb = ext
        return self._operand(a, self.a, ea, sta, once), self._operand(b, self.b, eb, stb, once)

    def _operand(
        self,
        x: jax.Array,
        side: _Side,
        codes: _IntOperand | None,
        own: dtypes.Encoded | None,
        once: bool,
    ) -> Any:
        if once and codes is None and own is None:
            return _computed_once(lambda x: self._quantized(x, side), x)
        return self.operand(x, side, codes, own)

    def _quantized(self, x: jax.Array, side: _Side) -> Any:
        """`operand(x, side)` for an operand quantized here, traced once per shape.

        JAX traces a custom VJP's function and its forward pass apart, and their traces
        do not share its cache (the abstract mesh context differs between them), so
        each operand's encode, the costliest part of a trace, was traced twice. The
        first trace is kept as a jaxpr and the second replays it."""
        key = (side is self.a, x.shape, x.dtype, getattr(x, "weak_type", False))
        if key not in self.traced:

            def quantize(x: jax.Array) -> Any:
                return self.operand(x, side, None, None)

            closed, shapes = jax.make_jaxpr(quantize, return_shape=True)(x)
            self.traced[key] = (closed, jax.tree_util.tree_structure(shapes))
        closed, tree = self.traced[key]
        return jax.tree_util.tree_unflatten(tree, jaxpr_as_fun(closed)(x))

    def operand(
        self, x: jax.Array, side: _Side, codes: _IntOperand | None, own: dtypes.Encoded | None
    ) -> Any:
        """One narrow operand: (codes, kept-dim scale) for an integer or fp8 dot, else an
        encoding; `codes` or `own` when it is used as stored."""
        if self.integer:
            if codes is not None:
                return codes
            return _int_rows(x, side.layout, self.fmt, self.scaling, side.moved)
        return own if side.same else quantize(x, side.layout, self.fmt, self.scaling)

    def values(self, q: Any, side: _Side) -> jax.Array:
        """Float32 values of a quantized operand (what the backward pass contracts with)."""
        layout = side.layout
        if self.integer:
            int_codes: jax.Array
            row_scale: jax.Array
            int_codes, row_scale = q
            values = _code_values(int_codes, self.fmt)
            if not side.moved:
                return values * layout.spread(row_scale)
            rows = row_scale.reshape(row_scale.shape + (1,) * len(layout.summed))
            return layout.unmoved(values * rows)
        if side.same:
            return decode_storage(q.format, q.data, q.scale, q.scaling, side.last, np.float32)
        return dequantize(q, layout, self.scaling)

    def forward(self, qa: Any, qb: Any) -> jax.Array:
        """The contraction of the quantized operands, in the equation's output dtype."""
        eqn, params = self.eqn, self.params
        out_dtype = eqn.outvars[0].aval.dtype
        if self.integer:
            acc_type = np.dtype(np.int32) if self.fmt.kind == "int" else np.dtype(np.float32)
            (ca, ka), (cb, kb) = qa, qb
            iparams = {**params, "preferred_element_type": acc_type}
            if self.fmt.kind != "int":
                # Stated on every fp8 dot, so a default matmul precision of the caller's
                # cannot change it: DEFAULT is what enables XLA:GPU's fast fp8 accumulation.
                level = lax.Precision.DEFAULT if self.fast_accumulation else lax.Precision.HIGHEST
                iparams["precision"] = (level, level)
            if eqn.primitive.name == "dot_general":
                iparams["dimension_numbers"] = self.code_dims()
                ca, cb = dot_operands(ca, cb, iparams["dimension_numbers"])
            emitted(ca.dtype, cb.dtype)
            acc: jax.Array = eqn.primitive.bind(ca, cb, **iparams)
            oa, ob = out_scale(eqn, acc.ndim, ka, kb, self.a.layout, self.b.layout)
            return ((acc.astype(jnp.float32) * oa) * ob).astype(out_dtype)
        va, vb = self.values(qa, self.a), self.values(qb, self.b)
        return self.bind_f32(va, vb).astype(out_dtype)

    def code_dims(self) -> Any:
        """A `dot_general`'s dimension numbers as its operands' codes are laid out."""
        (lc, rc), (lbatch, rbatch) = self.params["dimension_numbers"]
        (lc, lbatch), (rc, rbatch) = self.a.dims(lc, lbatch), self.b.dims(rc, rbatch)
        return (lc, rc), (lbatch, rbatch)

    @property
    def fp8_gradients(self) -> bool:
        """Whether the gradient dots take fp8 operands too: fp8 codes scaled per tensor
        (the only scales that factor out of the gradients' sums as well), a cotangent
        declared in a format XLA contracts natively, and a `dot_general`."""
        return (
            self.integer
            and not self.original
            and self.fmt.kind != "int"
            and self.scaling == "tensorwise"
            and self.backward is not None
            and _native_fp8(self.backward)
            and self.eqn.primitive.name == "dot_general"
        )

    def fp8_grads(self, qa: Any, qb: Any, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Both cotangents from fp8 dots: the cotangent's codes (in `backward`, one scale)
        with each forward operand's codes, accumulated in float32 without cuBLASLt's
        fast mode (the gradients sum over the batch or the output features), then the
        two scalar scales."""
        assert self.backward is not None  # (`fp8_gradients`)
        g8, sg = _int_rows(g, grad_layout(self.eqn, g.shape), self.backward, "tensorwise", False)
        (ca, sa), (cb, sb) = qa, qb
        sg, sa, sb = sg.reshape(()), sa.reshape(()), sb.reshape(())
        precision = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
        f32 = np.dtype(np.float32)
        (dims_a, perm_a), (dims_b, perm_b) = _gradient_dots(ca.ndim, cb.ndim, self.code_dims())
        da = lax.dot_general(g8, cb, dims_a, precision, preferred_element_type=f32)
        db = lax.dot_general(ca, g8, dims_b, precision, preferred_element_type=f32)
        da = jnp.transpose(da, perm_a) * sg * sb
        db = jnp.transpose(db, perm_b) * sa * sg
        if self.a.moved:
            da = self.a.layout.unmoved(da)
        if self.b.moved:
            db = self.b.layout.unmoved(db)
        return da, db

    def backward_grads(self, qa: Any, qb: Any, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Cotangents of both operands: `g` (quantized to `backward` when declared)
        contracted with the forward operands, as fp8 codes (`fp8_gradients`) or
        dequantized in float32.

        Each dequantized operand is made where its dot uses it (`computed_at_use`, the
        predicate read from `g`): scheduled freely, XLA:CPU decoded every layer's
        operands at the start of the backward pass and held them all (a training step
        of two transformer blocks took 37 MB of temporaries instead of 24, past the
        size glibc reuses between calls: 9,500 page faults a step)."""
        g = g.astype(jnp.float32)
        if self.fp8_gradients:
            da, db = self.fp8_grads(qa, qb, g)
            return da.astype(self.a.dtype), db.astype(self.b.dtype)
        if self.backward is not None:
            gl = grad_layout(self.eqn, g.shape)
            g = dequantize(quantize(g, gl, self.backward, self.scaling), gl, self.scaling)
        if self.original:  # `qa`, `qb` are the operands as given
            va, vb = jnp.asarray(qa, jnp.float32), jnp.asarray(qb, jnp.float32)
        else:
            va = computed_at_use(lambda q: self.values(q, self.a), qa, g)
            vb = computed_at_use(lambda q: self.values(q, self.b), qb, g)
        _, vjp = jax.vjp(self.bind_f32, va, vb)
        da, db = vjp(g)
        return da.astype(self.a.dtype), db.astype(self.b.dtype)


def _gradient_dots(a_ndim: int, b_ndim: int, dims: Any) -> tuple[Any, Any]:
    """For `out = dot_general(a, b, dims)`, the dimension numbers of the dots that give
    the cotangents of `a` (`g` with `b`) and of `b` (`a` with `g`), each with the
    permutation that puts its result in its operand's dim order."""
    (lc, rc), (lb, rb) = (tuple(map(tuple, d)) for d in dims)
    nb = len(lb)
    a_free = [d for d in range(a_ndim) if d not in lc and d not in lb]
    b_free = [d for d in range(b_ndim) if d not in rc and d not in rb]
    g_a = tuple(range(nb, nb + len(a_free)))  # the cotangent's dims: batch, a's, b's
    g_b = tuple(range(nb + len(a_free), nb + len(a_free) + len(b_free)))
    g_batch = tuple(range(nb))
    # g with b: sums b's free dims; the result is batch, a's free dims, b's summed dims
    to_a = [*lb, *a_free, *(lc[rc.index(d)] for d in sorted(rc))]
    # a with g: sums a's free dims; the result is batch, a's summed dims, b's free dims
    to_b = [*rb, *(rc[lc.index(d)] for d in sorted(lc)), *b_free]
    return (
        (((g_b, tuple(b_free)), (g_batch, rb)), [to_a.index(d) for d in range(a_ndim)]),
        (((tuple(a_free), g_a), (lb, g_batch)), [to_b.index(d) for d in range(b_ndim)]),
    )


def _straight_through(
    plan: _QuantizedContraction,
) -> Callable[[jax.Array, jax.Array, _Ext], jax.Array]:
    """`plan`'s contraction of (a, b, what is used as stored), straight-through the
    quantization for gradients; its residuals are the narrow operands."""

    @jax.custom_vjp
    def contract(a: jax.Array, b: jax.Array, ext: _Ext) -> jax.Array:
        return plan.forward(*plan.operands(a, b, ext))

    def contract_fwd(
        a: jax.Array, b: jax.Array, ext: _Ext
    ) -> tuple[jax.Array, tuple[Any, Any, _Ext]]:
        if plan.original:  # the operands as given are the residuals (see `_computed_once`)
            return plan.forward(*plan.operands(a, b, ext, once=False)), (a, b, ext)
        qa, qb = plan.operands(a, b, ext)
        return plan.forward(qa, qb), (qa, qb, ext)

    def contract_bwd(res: tuple[Any, Any, _Ext], g: jax.Array) -> tuple[jax.Array, jax.Array, Any]:
        qa, qb, ext = res  # (the operands as given, with `original`)
        da, db = plan.backward_grads(qa, qb, g)
        return da, db, jax.tree_util.tree_map(_zero_cotangent, ext)

    contract.defvjp(contract_fwd, contract_bwd)
    return contract


def _note_gpu_path(
    a: tuple[Layout, bool], b: tuple[Layout, bool], plan: _QuantizedContraction
) -> None:
    """For `explain`: what keeps a narrow dot off a GPU's fast GEMM path, given each
    operand's layout and whether it reaches the dot as stored.

    Before Blackwell, cuBLASLt's fp8 and int8 GEMMs take both operands with the
    summed dims minor (A row-major, B column-major). A stored operand laid out
    otherwise is transposed by XLA before the GEMM, a pass over the weight at every
    call (a computed operand is written in the layout the GEMM wants by the fusion
    that quantizes it). fp8 without fast accumulation runs at a lower rate.
    """
    why = [
        f"operand {name} {layout.shape} is stored with its summed dim(s) "
        f"{list(layout.summed)} not last: a GPU transposes it before the GEMM at every call "
        '(convert it with layout="transposed", or store it (out, in) and contract `x @ w.T`)'
        for name, (layout, stored) in (("a", a), ("b", b))
        if stored and layout.summed != tuple(range(len(layout.kept), len(layout.shape)))
    ]
    if plan.fmt.kind != "int" and not plan.fast_accumulation:
        why.append("fast accumulation is off (`Contract(fast_accumulation=False)`)")
    if why:
        gpu_slow_path("; ".join(why))


def _computed_once(quantized: Callable[[jax.Array], Any], x: jax.Array) -> Any:
    """`quantized(x)` (a quantized operand's arrays), computed in buffers of their own on
    a CPU (`dtypes.computed_once`: inside a conditional XLA cannot fuse into).

    Differentiated, the codes have two users: the forward dot and the backward pass's
    decode (`codes x scale`). XLA:CPU fused the whole encode a second time into that
    decode, reading the float32 operand again instead of the one-byte codes (the W8A8
    training step of `benchmarks/peers.py`'s transformer blocks: 11% of its time). Not
    differentiated, an operand computed just before (an activation: the previous
    layer's rescale, bias and ReLU) was made twice, fused into the absmax reduction and
    again into the encode; as the conditional's operand it is written out once and read
    twice (the W8A8 PTQ forward of that benchmark's MLP: 0.96-0.97x the time,
    interleaved A/B runs). Under `backward_operands="original"` the codes have one
    user, and that rule's training step does not use the conditional (with it:
    0.99-1.01x, no gain). An identity reduce-window copy of a large operand is slower
    than the repeat.
    """
    return dtypes.computed_once(quantized, x)


def _why_no_narrow_dot(fmt: dtypes.Format, scaling: str) -> str:
    if scaling == "mx":
        return (
            "MX blocks have a scale for every 32 summed elements, which does not factor out "
            "of the sum, and XLA offers no block-scaled matmul for them"
        )
    return (
        f"XLA has no dot for {fmt.name} operands (the narrow dots are int8 codes, "
        "float8_e4m3fn and float8_e5m2)"
    )


def _native_fp8(fmt: dtypes.Format) -> bool:
    """An 8-bit float format whose container XLA contracts natively (f8e4m3fn, f8e5m2)."""
    native = fmt.native_dtype if isinstance(fmt, dtypes.FloatFormat) else None
    return native is not None and native in (np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2))


def _int_rows(
    x: jax.Array, layout: Layout, fmt: dtypes.Format, scaling: str, moved: bool
) -> _IntOperand:
    """(codes, scale over its kept dims) of a float operand; the codes in the operand's
    layout, or with `moved` its kept dims first and summed dims last."""
    enc = quantize(x, layout, fmt, scaling)
    unpacked = codes(enc)  # int4 and int2 codes are packed in their encoding
    if layout.direct(scaling) is not None:
        data = unpacked  # quantized in place
    elif moved:
        data = unpacked.reshape(layout.kept_shape + layout.summed_shape)
    else:
        data = layout.back(unpacked)  # a reshape when the layout is in order
    assert enc.scale is not None  # a quantized operand always has its scales
    return data, layout.row_scale(enc.scale)
