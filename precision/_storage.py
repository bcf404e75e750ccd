"""The one bridge between `precision` and `dtypes`: roles, encode, decode, round.

Everything `precision` needs to know about a format goes through here, so the
Tensor, the rules and the checkpoint code never reach into `dtypes` internals.

A format plays one of two *roles* (docs/design.md §4, "Storage and compute"):

- a **compute** format is an unscaled float format (bfloat16, float16, tf32,
  float8 without a scale, custom `FloatFormat`s, and float32/float64):
  arithmetic can happen in it, each result rounded onto its grid;
- a **storage** encoding is any integer format (always scaled) and any scaled
  float encoding (fp8 per tensor, MX blocks, ...): values at rest, decoded
  exactly into the logical dtype where they are used.

It also says where storage lives on devices: the sharding of a scale given its
data's (`scale_sharding`) and of a tensor scale (`replicated`), used by
`Tensor.to_device` and `precision.device_put`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

import dtypes

from ._errors import FormatError, PrecisionError
from ._jax_compat import is_differentiated

__all__ = [
    "Role",
    "carries_gradient",
    "check_placement",
    "compute_format",
    "converts_by_rounding",
    "decode_encoded",
    "decode_storage",
    "decoder",
    "encode_on_grid",
    "encode_values",
    "encoder",
    "full_format",
    "guarded_encoder",
    "is_float",
    "is_placement",
    "needs_straight_through",
    "replicated",
    "role",
    "round_nearest",
    "scale_sharding",
    "straight_through",
]

Role = Literal["compute", "storage"]


def full_format(dtype: Any) -> dtypes.Format:
    """The format a floating numpy dtype is itself (float32 -> dtypes.float32)."""
    return dtypes.get(np.dtype(dtype).name)


def role(fmt: dtypes.Format, scaling: dtypes.Scaling | None) -> Role:
    """`"compute"` for unscaled float formats, `"storage"` for every other encoding.

    Examples:
        >>> import dtypes
        >>> role(dtypes.bfloat16, None), role(dtypes.int8, dtypes.PerTensor())
        ('compute', 'storage')
    """
    return "compute" if fmt.kind == "float" and scaling is None else "storage"


def compute_format(fmt: dtypes.Format, where: str) -> dtypes.Format:
    """`fmt` if arithmetic can be done in it (an unscaled float format), else a
    `FormatError` saying what a storage encoding is for and what to declare."""
    if fmt.kind == "float" and fmt.default_scaling() is None:
        return fmt
    raise FormatError(
        f"{where}: compute={fmt.name!r} is a storage encoding, not an arithmetic precision: "
        "integer and scaled formats hold values at rest and are decoded where they are used; "
        f'declare an unscaled float format, e.g. compute="bfloat16"; keep parameters in '
        f"{fmt.name} with params={fmt.name!r}, or quantize contractions with "
        f"contract={fmt.name!r}"
    )


def is_float(x: Any) -> bool:
    """Whether `x` holds floating values (PRNG keys and other extended dtypes do not)."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        dt = np.asarray(x).dtype
    return bool(jax.dtypes.issubdtype(dt, jnp.floating))


def decode_storage(
    fmt: dtypes.Format,
    data: Any,
    scale: Any,
    scaling: dtypes.Scaling | None,
    last: int | None,
    dtype: Any,
    tensor_scale: Any = None,
    zero_point: Any = None,
) -> jax.Array:
    """Logical values from storage arrays (the one decode every path shares)."""
    if scale is None and tensor_scale is None and zero_point is None:
        if not fmt.packed and data.dtype != np.uint8 and fmt.kind == "float":
            out: jax.Array = data if data.dtype == dtype else data.astype(dtype)
            return out
    enc = dtypes.Encoded(
        data, scale, fmt, scaling, last, tensor_scale=tensor_scale, zero_point=zero_point
    )
    return fmt.decode(enc, dtype)


def decode_encoded(enc: dtypes.Encoded, dtype: Any) -> jax.Array:
    """`decode_storage` of an `Encoded`."""
    last = enc.shape[-1] if (enc.format.packed and enc.shape) else None
    return decode_storage(
        enc.format, enc.data, enc.scale, enc.scaling, last, dtype, enc.tensor_scale, enc.zero_point
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _reduce_precision(x: jax.Array, mantissa_bits: int, top: float) -> jax.Array:
    return jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=mantissa_bits)


@_reduce_precision.defjvp
def _reduce_precision_jvp(
    mantissa_bits: int, top: float, primals: tuple[Any, ...], tangents: tuple[Any, ...]
) -> tuple[jax.Array, jax.Array]:
    (x,), (t,) = primals, tangents
    # straight-through, zero where the value overflowed (as `Format.round`)
    return _reduce_precision(x, mantissa_bits, top), jnp.where(jnp.abs(x) <= top, t, 0)


def round_nearest(fmt: dtypes.Format, x: Any) -> Any:
    """`fmt.round(x)` (unscaled, nearest-even), fast where possible.

    For IEEE-style formats with float32's 8 exponent bits (bfloat16, tf32, and
    custom `FloatFormat(8, m)`), rounding float32 values is mantissa rounding
    only, which XLA's `reduce_precision` does in one fused op with the same
    bits as the integer rounding of `dtypes` (checked bit for bit in the
    tests; the format's subnormals are float32 subnormals, which it keeps).
    Formats with fewer exponent bits are not given to it: on CPU it flushes
    their subnormals to zero.
    """
    if fmt.is_full_precision:
        return x
    if (
        isinstance(fmt, dtypes.FloatFormat)
        and fmt.exponent_bits == 8
        and not fmt.finite
        and not fmt.saturate
        and 0 < fmt.mantissa_bits < 23
        and np.dtype(getattr(x, "dtype", np.float64)) == np.float32
    ):
        return _reduce_precision(x, fmt.mantissa_bits, fmt.max)
    return fmt.round(x)


def encode_values(
    fmt: dtypes.Format,
    x: Any,
    scaling: dtypes.Scaling | None,
    rounding: str = "nearest_even",
    key: Any = None,
) -> dtypes.Encoded:
    """`dtypes.Encoded` storing `x` in `fmt` (no validation: `Format.check` is the one).

    Unscaled float formats round with `fmt.round` and cast to the container:
    the cast of an on-grid value is exact, and `fmt.round` is straight-through,
    so the conversion is differentiable. A bfloat16, float16 or float8 container
    takes `x` itself in the nearest mode (`_cast_stored`): its conversion is the same
    rounding, one pass instead of two (the same value for every float32, the same
    bits but for a float16 NaN's payload, `tests/precision/test_storage_casts.py`),
    with the same straight-through derivative. Scaled and integer formats go
    through `fmt.encode`, whose integer codes carry no gradient.
    """
    if carries_gradient(fmt, scaling):  # (unscaled native floats: rounded, then cast)
        if fmt.is_full_precision and np.dtype(x.dtype) == fmt.container:
            return dtypes.Encoded(x, None, fmt, None)
        if rounding == "nearest_even" and converts_by_rounding(fmt, x):
            return dtypes.Encoded(_cast_stored(fmt, x), None, fmt, None)
        if rounding == "nearest_even":
            y = round_nearest(fmt, x)
        else:
            y = fmt.round(x, rounding=rounding, key=key)
        return dtypes.Encoded(y.astype(fmt.container), None, fmt, None)
    return fmt.encode(x, scaling=scaling, rounding=rounding, key=key)


def encode_on_grid(fmt: dtypes.Format, x: Any) -> dtypes.Encoded:
    """`encode_values(fmt, x, None)` for an `x` already on the grid of `fmt` (a walk's
    value in the state of that format): where the container holds the value itself,
    its cast, exact for a value on the grid. Rounding it again would give the same
    bits, but XLA does not see that and computes the rounding twice (for float16 on a
    CPU, a whole second pass over the result)."""
    if carries_gradient(fmt, None) and not fmt.is_full_precision:
        cast = dtypes.astype if _byte_float(fmt, x) else lambda v, d: v.astype(d)
        return dtypes.Encoded(cast(x, fmt.container), None, fmt, None)
    return encode_values(fmt, x, None)


def converts_by_rounding(fmt: dtypes.Format, x: Any) -> bool:
    """Whether `fmt` keeps float32 `x` in a narrow float container of its own (bfloat16,
    float16, the float8s: its grid is the format's), whose conversion (`dtypes.astype`)
    is the format's nearest rounding in one pass: a rounding and then a cast had XLA
    compute two (bfloat16 1.08-1.15x the plain cast's time against 0.91x, one thread;
    float16 1.4x against 1.0x)."""
    container = np.dtype(fmt.container)
    narrow = container.itemsize < 4 and container.kind in "fV"  # (ml_dtypes' kind is V)
    float32 = np.dtype(getattr(x, "dtype", np.float64)) == np.float32
    return narrow and float32 and isinstance(fmt, dtypes.FloatFormat) and not fmt.saturate


def _byte_float(fmt: dtypes.Format, x: Any) -> bool:
    """Whether `fmt` keeps float32 `x` in a one-byte float container of its own (the
    float8 formats), which `dtypes.astype` converts into fastest."""
    return converts_by_rounding(fmt, x) and np.dtype(fmt.container).itemsize == 1


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _cast_stored(fmt: dtypes.Format, x: jax.Array) -> jax.Array:
    """float32 `x` in `fmt`'s narrow float container (`converts_by_rounding`): the
    conversion rounds to nearest even as `round_nearest` does, in one pass; NaN is
    written as `dtypes.astype` writes it (a quiet NaN of its sign; float16 keeps the
    payload's top bits, as `fmt.encode` does)."""
    return dtypes.astype(x, fmt.container)


@_cast_stored.defjvp
def _cast_stored_jvp(
    fmt: dtypes.Format, primals: tuple[Any, ...], tangents: tuple[Any, ...]
) -> tuple[jax.Array, jax.Array]:
    (x,), (t,) = primals, tangents
    # `Format.round`'s straight-through derivative: zero where the value overflowed
    inside = jnp.abs(x) <= np.float32(fmt.max)
    return _cast_stored(fmt, x), jnp.where(inside, t, jnp.zeros_like(t)).astype(fmt.container)


def carries_gradient(fmt: dtypes.Format, scaling: dtypes.Scaling | None) -> bool:
    """Whether storage in `fmt` can carry a gradient itself (unscaled native floats)."""
    return fmt.kind == "float" and scaling is None and fmt.container != np.uint8


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def straight_through(dtype: Any, x: Any, enc: dtypes.Encoded) -> jax.Array:
    """The decoded storage `enc`, with the straight-through derivative towards `x`.

    Integer codes cannot carry a gradient, so the derivative of a conversion
    is defined here, at the point where the codes are read: the value is
    exactly `decode(enc)`; its derivative is 1, or 0 where a power-of-two
    encoding clipped `x` (the clipped straight-through estimator, as
    `Format.round`).
    """
    return decode_encoded(enc, dtype)


@straight_through.defjvp
def _straight_through_jvp(
    dtype: Any, primals: tuple[Any, ...], tangents: tuple[Any, ...]
) -> tuple[jax.Array, jax.Array]:
    x, enc = primals
    y = decode_encoded(enc, dtype)
    t = tangents[0].astype(y.dtype)
    fmt, scaling = enc.format, enc.scaling
    if scaling is not None and scaling.power_of_two and not getattr(fmt, "binary", False):
        # the multipliers of the codes as float32 (E8M0 bytes widened, MXINT8's
        # implicit element scale folded in)
        scale = enc.group_scales()
        top = fmt.max + (0.5 if fmt.kind == "int" else 0.0)
        bound = scaling.broadcast(scale, x.shape) * np.float32(top) if x.ndim else scale * top
        t = jnp.where(jnp.abs(x) <= bound, t, jnp.zeros_like(t))
    return y, t


def needs_straight_through(x: Any, fmt: dtypes.Format, scaling: dtypes.Scaling | None) -> bool:
    """Whether a conversion of `x` must keep a differentiable view of its source.

    Only while `x` is being differentiated: a Tensor made under `jit` alone
    holds exactly its storage (honest bytes, the same pytree as eagerly).
    """
    return not carries_gradient(fmt, scaling) and is_differentiated(x)


@functools.cache
def encoder(
    fmt: dtypes.Format, scaling: dtypes.Scaling | None, rounding: str
) -> Callable[[Any, Any], dtypes.Encoded]:
    """A jitted `x, key -> Encoded` for one static encoding (eager calls of
    the bit-level rounding would otherwise dispatch dozens of small ops)."""
    return jax.jit(lambda x, key: encode_values(fmt, x, scaling, rounding, key))


@functools.cache
def guarded_encoder(
    fmt: dtypes.Format, scaling: dtypes.Scaling | None, rounding: str
) -> Callable[[Any, Any], dtypes.Encoded]:
    """`encoder`, for a traced value that is not being differentiated now.

    Such a Tensor holds its codes alone (honest bytes). If the surrounding
    trace is differentiated later (`jax.grad(jax.jit(loss))`), the codes would
    pass a gradient of zero silently; the derivative rule refuses instead.
    """

    @jax.custom_jvp
    def enc(x: Any, key: Any) -> dtypes.Encoded:
        return encode_values(fmt, x, scaling, rounding, key)

    @enc.defjvp
    def _refuse(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> Any:
        raise PrecisionError(
            f"a conversion to {fmt.name} made inside a traced function is being differentiated "
            "from outside that trace (e.g. jax.grad(jax.jit(loss))): integer and scaled codes "
            "carry no gradient, and the straight-through estimator is attached only when the "
            "conversion itself is differentiated; put the differentiation inside: "
            "jax.jit(jax.grad(loss))"
        )

    return jax.jit(enc)


@functools.cache
def decoder(dtype: Any) -> Callable[[dtypes.Encoded], jax.Array]:
    """A jitted `Encoded -> values` (one compiled kernel per storage layout)."""
    return jax.jit(lambda enc: decode_encoded(enc, dtype))


# -- where storage lives: the shardings of a Tensor's parts ------------------


def is_placement(x: Any) -> bool:
    """Whether `x` is where storage can go: a device or a sharding."""
    return isinstance(x, jax.Device | jax.sharding.Sharding)


def check_placement(target: Any, what: str) -> None:
    """Refuse a placement that is not a device or sharding (a name such as "cpu")."""
    if not is_placement(target):
        raise dtypes.PrecisionTypeError(
            f"{what}: {target!r:.60} is not a device or sharding; pass one of jax.devices() "
            "(e.g. jax.devices()[0]) or a jax.sharding.Sharding"
        )


def replicated(target: Any) -> Any:
    """The replicated counterpart of a placement (itself for a single device)."""
    if isinstance(target, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(target.mesh, jax.sharding.PartitionSpec())
    return target


def scale_sharding(target: Any, data: Any, scale: Any) -> Any:
    """A sharding for `scale` consistent with `target` for `data`."""
    if not isinstance(target, jax.sharding.NamedSharding):
        return target
    spec = list(target.spec) + [None] * (data.ndim - len(target.spec))
    out: list[Any] = []
    for dim, name in enumerate(spec[: scale.ndim]):
        if name is None or scale.shape[dim] == 1:
            out.append(None)
            continue
        names = name if isinstance(name, tuple) else (name,)
        n = int(np.prod([target.mesh.shape[a] for a in names]))
        out.append(name if scale.shape[dim] % n == 0 else None)
    return jax.sharding.NamedSharding(target.mesh, jax.sharding.PartitionSpec(*out))
