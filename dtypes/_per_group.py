"""Per-group work: reductions over each group of a scaling, and per-group values made
once before an elementwise pass reads them.

The reductions (`group_absmax`, `max_bits`, `group_extreme`, `pairwise_sum`) give the same
numbers on every backend; how they are cut is the platform's (`lax.platform_dependent`,
so a program lowered for a GPU on a CPU machine gets the GPU's form): XLA:CPU vectorises
an integer reduction across rows but not along a long last axis, and a float one along a
short last axis, so there groups are reduced in stages or as floats. `per_group` keeps
XLA:CPU from repeating a per-group computation for every element that reads it. The
scale rules that use them are in `_scale_rules`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _ieee
from ._encode_input_checks import numeric_array
from ._errors import PrecisionTypeError
from ._ieee import is_finite, nan_where
from ._scaling import PerAxis, PerBlock, PerTensor, Scaling

__all__ = [
    "Reduction",
    "absmax_made_once",
    "computed_once",
    "group_absmax",
    "group_extreme",
    "group_sizes",
    "max_bits",
    "pairwise_sum",
    "per_group",
    "traced_once",
]


def group_absmax(x: jax.Array, scaling: Scaling) -> jax.Array:
    """Per-group max(|x|), NaN for a group that holds NaN or ±inf, 0 for a subnormal one.

    For float32 one max over the magnitude bits does all three: finite
    magnitudes order as their bits do, and inf and NaN lie above every finite
    one, so the group's largest magnitude bits are its absmax, or say that it
    holds NaN or inf. The max (`max_bits`) is an integer one, or on XLA:CPU over
    short blocks a float one after NaN's bits are lowered to inf's: neither can
    drop a NaN (XLA:CPU's vectorised float max may), and the input is read once:
    a separate search for NaN and inf would cost a second pass over it. A
    subnormal absmax reads as 0, as a backend that flushes subnormals sees it.
    """
    # Scales are treated as constants by autodiff (straight-through): the
    # gradient of decode(encode(x)) is 1, not the sensitivity of the
    # rounding error to the group's absmax.
    x = lax.stop_gradient(x)
    if x.dtype == jnp.float32:
        return _absmax_of(max_bits(_magnitude_bits(x), scaling))
    # float64 under x64 (its own subnormals kept); `initial=0` gives an empty group
    # absmax 0, hence scale 1 like an all-zero group
    absmax = scaling.group_reduce(
        jnp.abs(x), lambda a, axes: jnp.max(a, axis=axes, keepdims=True, initial=0.0)
    )
    # (read from the bits of its float32 value: past float32's range is inf there)
    poison = scaling.group_reduce(
        ~is_finite(x.astype(jnp.float32)), lambda a, axes: jnp.any(a, axis=axes, keepdims=True)
    )
    return nan_where(poison, absmax.astype(jnp.float32)).astype(absmax.dtype)


def _magnitude_bits(x: jax.Array) -> jax.Array:
    """float32 `x`'s bits with the sign cleared (uint32)."""
    bits: jax.Array = lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0x7FFFFFFF)
    return bits


def _absmax_of(top: jax.Array) -> jax.Array:
    """The absmax a group's largest magnitude bits `top` give (see `group_absmax`)."""
    top = jnp.where(top < jnp.uint32(0x00800000), jnp.uint32(0), top)
    return nan_where(top >= jnp.uint32(0x7F800000), _ieee.from_bits(top))


def absmax_made_once(x: jax.Array, scaling: Scaling, make: Callable[[jax.Array], Any]) -> Any:
    """`per_group(make, group_absmax(x, scaling))`: per-group values made from the
    absmax (float32), each once.

    On XLA:CPU, where the absmax of long groups is reduced in stages (`_staged`), the
    stages run in a conditional of their own and the last step in the one that makes
    `make`'s values:

    - The stages' conditional takes `x` as its operand, so `x` is read from a buffer.
      An `x` computed just before (an activation: the previous layer's rescaled
      product, bias and ReLU) is computed once into it, a buffer its other readers
      share (the backward pass keeps it anyway); fused into the reduction instead, it
      was computed again for every element in a loop XLA:CPU does not vectorise: 78-129
      us against 8 for the stage of a 256 x 1024 activation in the W8A8 step of
      `benchmarks/peers.py`'s MLP, which takes 0.987-0.989x the time (the same bits).
    - The second conditional writes out the last stage's result as the reduce-window
      of `_staged` would, and what remains of the reduction is a few elements a group,
      read where the values are made: one conditional makes the scale, reciprocal and
      mask of an int8 per-row encode where two did (`scales`), and the MLP's PTQ
      forward took 0.98-0.99x the time. The lanes left of a row are compared as floats
      (`_max_bits_cpu`), which XLA:CPU vectorises: 11-12 us against 23-25 for the
      integer max over 2048 rows.

    Both conditionals read one predicate, taken from `x` (`_always`): the W8A8 training
    step of that MLP traced in 0.81 s of CPU against 0.90 with a predicate each, five
    kernels fewer, its time and bits the same.
    """

    make = traced_once(make)

    def whole(x: jax.Array) -> Any:
        return per_group(make, group_absmax(x, scaling).astype(jnp.float32))

    if isinstance(scaling, PerAxis):
        kept = scaling.kept(x.ndim)
    elif isinstance(scaling, PerTensor):
        kept = ()
    else:  # (blocks of at most 32 are reduced at once, longer ones reshaped after)
        return whole(x)
    axes = tuple(d for d in range(x.ndim) if d not in kept)
    if x.dtype != jnp.float32 or not x.size or _as_floats(axes, x.shape):
        return whole(x)  # (reduced at once: `_max_bits_cpu`)
    shape = scaling.scale_shape(x.shape)  # (the absmax's: one per group, reduced axes kept)
    outputs = jax.eval_shape(make, jax.ShapeDtypeStruct(shape, x.dtype))
    if all(leaf.size <= 1 for leaf in jax.tree_util.tree_leaves(outputs)):
        return whole(x)  # (one value a group made as it is: see `per_group`)

    def cpu(x: jax.Array) -> Any:
        x = lax.stop_gradient(x)
        cut: dict[str, Any] = {}

        def stages(x: jax.Array) -> jax.Array:
            partial, cut["rest"], cut["staged"] = _stages(jnp.max, _magnitude_bits(x), axes)
            return partial

        jax.eval_shape(stages, x)  # (whether a stage runs: the shape decides)
        if not cut["staged"]:
            return whole(x)
        rest = cut["rest"]

        def made(partial: jax.Array) -> Any:
            # (what is left is small: lanes compared as floats, or one plain reduction)
            return make(_absmax_of(_max_bits_cpu(partial, rest).reshape(shape)))

        always = _always(x)
        return _held(traced_once(made), always, _held(traced_once(stages), always, x))

    return lax.platform_dependent(x, cpu=cpu, default=whole)


def max_bits(mag: jax.Array, scaling: Scaling) -> jax.Array:
    """Per-group max of float32 magnitude bits `mag` (uint32, sign cleared; 0 for an
    empty group), shaped like the scales; a group holding NaN gives at least inf's bits
    (NaN's own or inf's), so `>= 0x7F800000` says it holds NaN or inf.

    On XLA:CPU groups along a short last axis (blocks of at most 32) compare the bits
    as floats, the max spelled as a select: the float comparison over such an axis
    vectorises where the integer max does not (2**21 values in blocks of 32: 0.44 ms
    against 1.05-1.25), while across rows, as `_staged` reduces longer groups, the
    integer max is the faster (per row of 1024: 0.24 ms against 0.67). NaN bits are
    first lowered to inf's, with an integer min, so no NaN enters the comparison (a
    vectorised float max may drop one); the magnitudes of
    non-NaN floats order as their bits do, so the float max is the integer max, except
    among subnormals, which a CPU flushing them may compare as zeros: the result is
    then another subnormal or 0, and every caller takes a subnormal absmax as 0.
    """

    def cpu(m: jax.Array) -> jax.Array:
        return scaling.group_reduce(m, _max_bits_cpu)

    out: jax.Array = lax.platform_dependent(
        mag, cpu=cpu, default=lambda m: group_extreme(m, scaling, jnp.max)
    )
    return out


def _max_bits_cpu(m: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """`max_bits`' reduction on XLA:CPU: a short last axis as floats, others staged."""
    if not _as_floats(axes, m.shape):
        return _staged(jnp.max, m, axes)
    f = lax.bitcast_convert_type(jnp.minimum(m, jnp.uint32(0x7F800000)), jnp.float32)
    # The max spelled as a select: XLA:CPU hands a plain float max to a library kernel
    # that cannot take the lowering above with it, so the lowered values were first
    # written out whole (a temporary the size of the input, page-faulted afresh on
    # some calls: 0.59-1.45 ms for 2**21 values in blocks of 32); this one fuses the
    # lowering into the reduction (0.44 ms). No NaN reaches it.
    top = lax.reduce(f, jnp.float32(0), _larger, (m.ndim - 1,))
    return lax.bitcast_convert_type(top, jnp.uint32)[..., None]


def _as_floats(axes: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether `_max_bits_cpu` reduces these axes as floats at once (a short last axis)
    rather than in integer stages."""
    return tuple(axes) == (len(shape) - 1,) and shape[-1] <= _LANES


def _larger(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.where(a > b, a, b)


def group_extreme(values: jax.Array, scaling: Scaling, reduce: Reduction) -> jax.Array:
    """Per-group `reduce` (`jnp.max` or `jnp.min`) of integer `values` with 0 among them,
    shaped like the scales.

    The same integers on every backend; how the reduction is cut is the
    platform's (`lax.platform_dependent`, so a program lowered for a GPU on a
    CPU machine gets the GPU's form): XLA:CPU vectorises an integer reduction
    over a short last axis but not over a long one or across rows, so there the
    groups are reduced in stages of at most 32 consecutive elements
    (`_staged`); elsewhere one reduction.
    """
    zero = jnp.zeros((), values.dtype)

    def direct(m: jax.Array) -> jax.Array:
        return scaling.group_reduce(
            m, lambda a, axes: reduce(a, axis=axes, keepdims=True, initial=zero)
        )

    def staged(m: jax.Array) -> jax.Array:
        return scaling.group_reduce(m, functools.partial(_staged, reduce))

    out: jax.Array = lax.platform_dependent(values, cpu=staged, default=direct)
    return out


Reduction = Callable[..., jax.Array]
_LANES = 32  # the longest last axis XLA:CPU reduces well (64: 4x slower)
_STAGE_INNER = 8  # rows reduced at a time across a kept last axis wider than the lanes
_SMALL = 1 << 14  # elements left that one plain reduction finishes quickly
_SMALL_ACROSS_ROWS = 1 << 17  # the same, for a reduction across rows of a kept wide axis


def _staged(reduce: Reduction, a: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """`reduce(a, axes, keepdims=True, initial=0)` of integer `a`, in stages XLA:CPU runs
    fast.

    XLA:CPU vectorises a reduction across rows (elementwise, one vector per row) but
    not along a long last axis. So a reduced last axis longer than 32 is first cut
    into rows of 32 *lanes* (`(n / 32, 32)`): every stage then reduces at most 32 rows
    across the lanes (8 across a kept last axis wider than that) and is materialized
    (`_materialized`: XLA would otherwise fuse the stages back into one loop that
    recomputes each inner stage for every element of the next). Once what is left is
    small, one reduction finishes it, the lanes included (across rows of a kept wide
    last axis, where that reduction vectorises too, small is 2**17 elements). Zero
    padding changes nothing: 0 is among the values reduced anyway."""
    partial, rest, staged = _stages(reduce, a, axes)
    if staged:
        partial = _materialized(partial)
    out = reduce(partial, axis=rest, initial=jnp.zeros((), a.dtype)) if rest else partial
    return out.reshape(tuple(1 if i in axes else n for i, n in enumerate(a.shape)))


def _stages(
    reduce: Reduction, a: jax.Array, axes: tuple[int, ...]
) -> tuple[jax.Array, tuple[int, ...], bool]:
    """`_staged`'s reduction cut before its last step: (what its stages leave, the axes
    of it left to reduce, whether any stage ran). The stages before the last are
    materialized; the last one's result is for the caller to write out (`_staged`
    through a reduce-window, `absmax_made_once` as a conditional's result)."""
    zero = jnp.zeros((), a.dtype)
    left = sorted(axes)
    lanes = bool(left) and left[-1] == a.ndim - 1 and a.shape[-1] > _LANES and a.size > _SMALL
    if lanes:  # the last axis as (rows, lanes); the rows reduce in stages, the lanes last
        a = _split_axis(a, a.ndim - 1, _LANES)
        left[-1] = a.ndim - 2
    # (the W8A8 training step of benchmarks/peers.py's MLP, whose weights' absmax is then
    # finished from one stage in the scales' conditional: 0.99x the time of two stages)
    small = _SMALL if lanes or a.shape[-1] <= _LANES else _SMALL_ACROSS_ROWS
    staged = False
    while left and a.size > small:
        if staged:
            a = _materialized(a)  # (XLA:CPU would fuse the next stage into this one)
        d = left[-1]
        if d == a.ndim - 1:  # a reduced last axis of at most 32 (no lanes were cut)
            a = reduce(a, axis=-1, initial=zero)
            left.pop()
        else:
            stage = _LANES if lanes or a.shape[-1] <= _LANES else _STAGE_INNER
            if a.shape[d] <= stage:
                a = reduce(a, axis=d, initial=zero)
                left.pop()
                left = [i if i < d else i - 1 for i in left]
            else:
                a = reduce(_split_axis(a, d, stage), axis=d + 1)
        staged = bool(left or lanes)
    if lanes:
        left.append(a.ndim - 1)
    return a, tuple(left), staged


def _split_axis(a: jax.Array, d: int, size: int) -> jax.Array:
    """`a` with axis `d` zero-padded to a multiple of `size` and split into
    (length / size, size) at `d`, `d + 1`."""
    n = a.shape[d]
    pad = -n % size
    if pad:
        widths = [(0, 0)] * a.ndim
        widths[d] = (0, pad)
        a = jnp.pad(a, widths)
    return a.reshape((*a.shape[:d], (n + pad) // size, size, *a.shape[d + 1 :]))


def pairwise_sum(a: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """Sum over `axes` (dims kept) by pairwise halving, in one fixed order.

    For n non-negative float32 terms the relative error is at most
    ceil(log2 n) * 2**-24 (a plain float32 reduction's bound grows with n),
    and the order, hence the result, is the same on every backend.
    """
    keep = [i for i in range(a.ndim) if i not in axes]
    moved = jnp.transpose(a, keep + list(axes))
    lead = moved.shape[: len(keep)]
    n = math.prod(moved.shape[len(keep) :])
    out_shape = tuple(1 if i in axes else a.shape[i] for i in range(a.ndim))
    if n == 0:
        return jnp.zeros(out_shape, a.dtype)
    flat = moved.reshape((*lead, n))
    while flat.shape[-1] > 1:
        m = flat.shape[-1]
        half = m // 2
        summed = flat[..., :half] + flat[..., half : 2 * half]
        flat = jnp.concatenate([summed, flat[..., 2 * half :]], axis=-1) if m % 2 else summed
    return flat.reshape(out_shape)


def per_group(make: Callable[..., Any], *inputs: jax.Array) -> Any:
    """`make(*inputs)`: per-group values (an array, or a tuple of arrays and Nones),
    each computed once before an elementwise pass reads it per element.

    XLA:CPU fuses a cheap per-group computation into the elementwise kernel that
    broadcasts it, and so repeats it for every element of the group: a reciprocal's
    correctly rounded division (`_ieee.divide`, a few dozen operations) would then
    cost more than all the rest of an encode. So the values are made by
    `computed_once`, in a conditional of their own, and read from its buffers. Values
    of one element each are made as they are: a loop computes them once anyway (not
    one fused into the first level of a pairwise sum, whose slices keep XLA:CPU from
    hoisting it: `mean_abs` makes its one value with `computed_once`). Each
    value of one call is made in a kernel of its own there: where one reads another's
    costly making (a zero point reads its reciprocal), make the first in a call of its
    own, or the making is repeated for the second.
    (They were once passed through an identity reduce-window instead: a copy of every
    value, as costly as the division itself for 65,536 blocks; int8 per block of 32
    0.82x the time, int2's `round` per block 0.83x, MX 0.9x, the same bits.)
    """
    make = traced_once(make)
    outputs = jax.eval_shape(make, *inputs)
    if all(leaf.size <= 1 for leaf in jax.tree_util.tree_leaves(outputs)):
        return make(*inputs)
    return computed_once(make, *inputs)


def traced_once(make: Callable[..., Any]) -> Callable[..., Any]:
    """`make`, traced once for all the calls of it with the same argument shapes.

    A per-group computation is asked for its shapes (`jax.eval_shape`), then traced in
    each branch of `lax.platform_dependent` (`computed_once`: the CPU's conditional and
    every other platform's plain call): four traces of the same code, and these are
    the costliest to trace of an encode (a correctly rounded division is a hundred
    operations, each a `jnp` call). As a `jax.jit` function it is traced at its first
    call and the others reuse that trace; the program compiled is the same (XLA inlines
    the call)."""
    if getattr(make, _MARK, False):
        return make
    traced = jax.jit(make)
    setattr(traced, _MARK, True)
    return traced


_MARK = "_dtypes_traced_once"  # (set on the functions `traced_once` returns)


def computed_once(make: Callable[..., Any], *inputs: jax.Array) -> Any:
    """`make(*inputs)` (a pytree of arrays), computed into buffers of its own on XLA:CPU.

    XLA:CPU takes a computation with one large input as free to repeat: it fuses it
    into every kernel that reads its result, each of which then computes it again,
    and an optimization barrier does not last until its fusion pass. A conditional is
    never fused into, so on a CPU `make` runs inside one whose predicate is always
    true but not known to be by XLA (it is read from the bits of an input), and its
    results are read from the conditional's buffers. `make` runs there whole: a branch
    that only passed values through would copy them into its result (the buffers of a
    conditional's result are its own). Other platforms (`lax.platform_dependent`: the
    platform lowered for) compute `make(*inputs)` as it is and fuse as they see fit (a
    GPU's conditional would wait for its predicate on the host).

    For libraries that build on `dtypes`: `precision` quantizes each operand of a
    quantized contraction this way, so that its codes and scales are made once however
    many kernels read them.

    Examples:
        >>> import jax.numpy as jnp
        >>> import dtypes
        >>> float(dtypes.computed_once(lambda a: a * 2, jnp.ones(4))[0])
        2.0
    """
    if not callable(make):
        raise PrecisionTypeError(
            f"computed_once: `make` must be a function of the inputs, got "
            f"{type(make).__name__} {make!r:.40}; for example computed_once(lambda a: a * 2, x)"
        )
    inputs = tuple(numeric_array(x, f"computed_once: input {i}") for i, x in enumerate(inputs))
    if not any(x.size for x in inputs):  # (nothing to read a predicate from)
        return make(*inputs)
    make = traced_once(make)

    def held(*xs: jax.Array) -> Any:
        return _held(make, _always(*xs), *xs)

    return lax.platform_dependent(*inputs, cpu=held, default=make)


def _always(*xs: jax.Array) -> jax.Array:
    """A predicate true for every value of the inputs that XLA cannot tell is: read from
    the bits of the first element of the first non-empty input."""
    probe = jnp.real(next(x for x in xs if x.size).ravel()[0])
    bits = lax.bitcast_convert_type(probe.astype(jnp.float32), jnp.uint32)
    always: jax.Array = (bits | jnp.uint32(1)) != 0
    return always


def _held(make: Callable[..., Any], always: jax.Array, *xs: jax.Array) -> Any:
    """`make(*xs)` inside a conditional whose predicate `always` is true (see
    `computed_once`), on XLA:CPU."""
    made: list[Any] = []

    def once(*xs: jax.Array) -> Any:
        out = make(*xs)
        shape = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
        made.append(jax.tree_util.tree_map(shape, out))
        return out

    def never(*xs: jax.Array) -> Any:
        # zeros shaped like `once`'s result, traced first; traced again only if not
        shapes = made[0] if made else jax.eval_shape(make, *xs)
        return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    return lax.cond(always, once, never, *xs)


_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _materialized(a: jax.Array) -> jax.Array:
    """`a` itself, through an identity reduce-window (the max of each element's bits and
    a zero): XLA:CPU fuses neither a reduce-window into its consumers nor its operand
    into it, so `a` is computed once, into a buffer of its own. (An optimization
    barrier does not last until XLA:CPU's fusion pass.)"""
    uint = _UINT[a.dtype.itemsize]
    bits = lax.bitcast_convert_type(a, uint)[..., None]
    padded = jnp.pad(bits, [(0, 0)] * (bits.ndim - 1) + [(0, 1)])
    window = (1,) * (bits.ndim - 1) + (2,)
    out = lax.reduce_window(padded, uint(0), lax.max, window, window, "VALID")
    return lax.bitcast_convert_type(out[..., 0], a.dtype)


def group_sizes(scaling: Scaling, shape: tuple[int, ...]) -> jnp.ndarray:
    """Number of real (unpadded) elements in each group, shaped like the scale.

    Counted with Python integers from the static shape (a float32 sum of ones
    stops counting at 2**24), then given as float32.
    """
    shape = tuple(shape)
    scale_shape = scaling.scale_shape(shape)
    total = math.prod(shape)
    if isinstance(scaling, PerBlock) and shape:
        a = scaling._axis(len(shape))
        n = shape[a]
        size = scaling._block(n)
        counts = np.full(scale_shape[a], size, np.float64)  # one block is one group
        if counts.size and n % size:
            counts[-1] = n % size
        bshape = [1] * len(shape)
        bshape[a] = scale_shape[a]
        counts = np.broadcast_to(counts.reshape(bshape), scale_shape)
    else:
        groups = math.prod(scale_shape)
        counts = np.full(scale_shape, total // groups if groups else 0, np.float64)
    return jnp.asarray(counts.astype(np.float32))
