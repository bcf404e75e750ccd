"""Codes held transposed: a weight's storage in the layout a GPU's GEMM reads.

cuBLASLt's fp8 GEMMs and cuBLAS's int8 ones (before Blackwell) take both operands
with the summed dimension last ("TN"). A Flax or Haiku kernel is shaped
`(in, out)` and contracted as `x @ w`: its summed dimension is first, so XLA:GPU
transposes the whole weight before every GEMM. `layout="transposed"` holds the
codes (and their scales) with the last two axes swapped: the Tensor is still
`(in, out)` to every user and every rule, and a quantized contraction reads the
codes as held (`_compute/_transposed_operands.py`), so no transpose precedes the
GEMM (`tests/precision/test_gpu_programs.py` reads the CUDA program).

Only what reaches those GEMMs is held so: one-byte codes (int8, the fp8 formats)
with one scale per tensor or per axis. The logical arrays of such an
encoding are its held arrays with the last two axes swapped back (`swapped`),
a move of bytes, so every other operation sees the Tensor as it would without the
layout; results of operations are held in the logical layout. Converting a Tensor to the
encoding it already has, with another layout, moves its codes (`laid_out`): no re-encoding.
"""

from __future__ import annotations

from typing import Any, Literal

import dtypes

from ._errors import PrecisionTypeError

__all__ = [
    "TRANSPOSED",
    "Layout",
    "check_layout",
    "encoded_transposed",
    "held_axis",
    "held_placement",
    "held_scaling",
    "held_shape",
    "laid_out",
    "swap_perm",
    "swapped",
    "swaps_last_two",
]

Layout = Literal["transposed"] | None
TRANSPOSED: Literal["transposed"] = "transposed"


def check_layout(
    layout: Any, fmt: dtypes.Format, scaling: dtypes.Scaling | None, shape: tuple[int, ...]
) -> Layout:
    """`layout` as given, once it is known to hold an encoding of `fmt`, `scaling`, `shape`."""
    if layout is None:
        return None
    if layout != TRANSPOSED:
        raise PrecisionTypeError(
            f"layout={layout!r:.40} is not a layout: pass layout='transposed' to hold the codes "
            "with the last two axes swapped (the layout GPU GEMMs read), or None"
        )
    if len(shape) < 2:
        raise dtypes.ShapeError(
            f"layout='transposed' swaps the last two axes; a Tensor of shape {shape} has "
            f"{len(shape)}: hold a matrix (or a stack of them) so, or pass layout=None"
        )
    if fmt.is_full_precision or fmt.packed or fmt.bits != 8 or fmt.kind not in ("int", "float"):
        raise dtypes.FormatError(
            f"layout='transposed' holds one-byte codes that a GPU GEMM reads (int8, "
            f"float8_e4m3fn, float8_e5m2); {fmt.name} is not one: use one of those, or "
            "layout=None"
        )
    if not isinstance(scaling, dtypes.PerTensor | dtypes.PerAxis):
        what = "no scale" if scaling is None else scaling.describe()
        raise dtypes.ScalingError(
            f"layout='transposed' holds codes with one scale per tensor or per axis; {what} "
            f"({fmt.name}) is not that: pass scaling=dtypes.PerTensor() or "
            "dtypes.PerAxis(axis), or layout=None"
        )
    return TRANSPOSED


def swap_perm(ndim: int) -> tuple[int, ...]:
    """The permutation of `ndim` axes that swaps the last two (its own inverse)."""
    return (*range(ndim - 2), ndim - 1, ndim - 2)


def held_axis(axis: int, ndim: int) -> int:
    """Where axis `axis` (of `ndim`, from 0) lies once the last two are swapped, and back."""
    return swap_perm(ndim)[axis]


def held_shape(shape: tuple[Any, ...]) -> tuple[Any, ...]:
    """`shape` with its last two axes swapped (the held shape of a logical one, and back)."""
    return tuple(shape[i] for i in swap_perm(len(shape)))


def held_scaling(scaling: dtypes.Scaling | None, ndim: int) -> dtypes.Scaling | None:
    """`scaling` of an `ndim` tensor with its last two axes swapped (and back): a
    per-axis scale along the last axis is along the one before it once held so."""
    if not isinstance(scaling, dtypes.PerAxis):
        return scaling
    # each axis counted as it was given, from the front or (negative) from the back
    axes = tuple(held_axis(a % ndim, ndim) - ndim * (a < 0) for a in scaling.axes)
    return type(scaling)(
        axes[0] if len(axes) == 1 else axes,
        scale_format=scaling.scale_format,
        power_of_two=scaling.power_of_two,
    )


def swapped(enc: dtypes.Encoded) -> dtypes.Encoded:
    """`enc` with the last two axes of its codes and scales swapped (and its scaling's):
    the logical encoding of a held one, and the held encoding of a logical one."""
    shape = enc.data.shape
    scale = enc.scale
    if scale is not None and getattr(scale, "ndim", 0) == len(shape):
        scale = scale.swapaxes(-1, -2)
    return dtypes.Encoded(
        enc.data.swapaxes(-1, -2), scale, enc.format, held_scaling(enc.scaling, len(shape))
    )


def held_placement(where: Any, shape: tuple[int, ...]) -> Any:
    """A device or sharding given for the logical `shape`, as it places the held arrays: a
    `NamedSharding`'s spec with its last two entries swapped; a device as it is."""
    import jax  # (placing arrays: JAX is loaded already)

    if isinstance(where, jax.Device | jax.sharding.SingleDeviceSharding):
        return where
    if not isinstance(where, jax.sharding.NamedSharding):
        raise PrecisionTypeError(
            f"a Tensor held with layout='transposed' is placed by a device or a "
            f"NamedSharding (its spec read along the logical axes, {shape}); got "
            f"{type(where).__name__}"
        )
    spec = (*where.spec, *(None,) * (len(shape) - len(where.spec)))
    return jax.sharding.NamedSharding(where.mesh, jax.sharding.PartitionSpec(*held_shape(spec)))


def encoded_transposed(
    x: Any, fmt: dtypes.Format, scaling: dtypes.Scaling | None, rounding: str, key: Any
) -> dtypes.Encoded:
    """The held encoding of logical values `x` under `layout="transposed"`: `x` with its
    last two axes swapped, encoded with the scaling's axes swapped too (the same codes
    and scales as `x`'s own encoding, held the other way)."""
    # (JAX's side, imported here: checkpoints read the layout without loading JAX)
    from ._jax_compat import is_tracer
    from ._storage import encoder, guarded_encoder, needs_straight_through

    if needs_straight_through(x, fmt, scaling):
        raise PrecisionTypeError(
            f"layout='transposed' holds a weight at rest; this {fmt.name} conversion is "
            "being differentiated: convert outside of jax.grad (the stored weights), or "
            "pass layout=None"
        )
    fmt.check(x, scaling=scaling)  # (a refusal names the value where it lies logically)
    held = x.swapaxes(-1, -2)
    along = held_scaling(scaling, x.ndim)
    encode = guarded_encoder if is_tracer(held) else encoder
    enc: dtypes.Encoded = encode(fmt, along, rounding)(held, key)
    return enc


def swaps_last_two(axes: tuple[Any, ...], ndim: int) -> bool:
    """Whether `transpose(*axes)` (checked; empty: reversed) swaps the last two axes of an
    `ndim` Tensor and keeps the others."""
    perm = tuple(int(a) % ndim for a in axes) if axes else tuple(range(ndim))[::-1]
    return perm == swap_perm(ndim)


def laid_out(
    enc: dtypes.Encoded,
    held: Layout,
    at_rest: bool,
    x: Any,
    fmt: dtypes.Format,
    scaling: dtypes.Scaling | None,
    conversion: tuple[str, Any],
    layout: Any,
) -> tuple[dtypes.Encoded, Layout] | None:
    """`to_reduced_precision(fmt, scaling, layout=layout)` of the Tensor whose logical values
    are `x`, held as `enc` in layout `held` (`at_rest`: not differentiated): the encoding and
    its layout, or None where neither side has a layout (the plain encode's case).

    A Tensor already in `fmt` with `scaling` only moves its codes into the new layout;
    anything else is encoded from `x` (`conversion`: the rounding mode and key)."""
    ndim = len(x.shape)
    same = (
        at_rest
        and enc.format == fmt
        and _canonical(held_scaling(enc.scaling, ndim) if held else enc.scaling, ndim)
        == _canonical(scaling, ndim)
    )
    if layout is None:
        return (swapped(enc), None) if held is not None and same else None
    checked = check_layout(layout, fmt, scaling, tuple(x.shape))
    if same:
        return (enc if held is not None else swapped(enc)), checked
    return encoded_transposed(x, fmt, scaling, *conversion), checked


def _canonical(scaling: dtypes.Scaling | None, ndim: int) -> Any:
    """`scaling` with its axes counted from the front (PerAxis(-1) of a matrix is PerAxis(1));
    one naming an axis the tensor lacks as it is, equal to no fitted scaling (the encode
    that follows refuses it)."""
    if not isinstance(scaling, dtypes.PerAxis) or any(not -ndim <= a < ndim for a in scaling.axes):
        return scaling
    axes = tuple(a % ndim for a in scaling.axes)
    return (type(scaling), axes, scaling.scale_format, scaling.power_of_two)
