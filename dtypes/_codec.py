"""What the codecs of the different format classes share, and nothing else.

Each format class encodes, decodes, rounds and checks in its own codec
module (`_float_codec`, `_int_codec`, `_codebook_codec`, `_asymmetric_codec`,
`_e8m0_codec`), which `Format`'s methods call; this one holds the pieces two
or more of them use: packing codes into an `Encoded` and back, the argument
checks of `decode`, multiplying codes by their stored scales, the two
straight-through derivatives of `round`, and the `round` and `check` of the
storage encodings (code books, zero-point integers, E8M0). Nothing here asks
which kind of format it has been given.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from . import _packing, _scale_storage
from ._argument_checks import resolve_scaling
from ._encode_input_checks import any_equal_now, as_float_array, check_finite, is_tracer
from ._encoded import Encoded, format_of
from ._errors import FormatError, PrecisionTypeError, RoundingError, ScalingError
from ._format import Format
from ._ieee import times_scale, to_float32
from ._scaling import Scaling, two_level

__all__ = [
    "RoundWithMask",
    "check_decodable",
    "check_storage",
    "dequantize",
    "pack_encoded",
    "prepare_storage",
    "storage_round",
    "storage_scaling",
    "straight_through_round",
    "unpack_codes",
]

RoundWithMask = Callable[[Any, Any, str, jax.Array, Any], tuple[jax.Array, jax.Array]]
"""`f(fmt, scaling, rounding, x, key) -> (rounded x, mask)`: values and where gradients pass."""


def pack_encoded(
    codes: jax.Array, scale: jax.Array | None, fmt: Format, scaling: Scaling | None
) -> Encoded:
    """An `Encoded` holding `codes` packed densely at `fmt.code_bits` bits each."""
    if codes.ndim == 0:
        return Encoded(_packing.pack(codes.reshape(1), fmt.code_bits), scale, fmt, scaling, None)
    return Encoded(_packing.pack(codes, fmt.code_bits), scale, fmt, scaling, codes.shape[-1])


def unpack_codes(fmt: Format, enc: Encoded, *, signed: bool) -> jax.Array:
    """The codes of `enc` in its logical shape (unpacked when `fmt` packs them)."""
    data = enc.data
    if fmt.packed:
        n = enc.shape[-1] if enc.shape else 1
        data = _packing.unpack(data, fmt.code_bits, n, signed=signed)
        data = data.reshape(enc.shape)
    return data


def check_decodable(fmt: Format, enc: Any, dtype: Any = np.float32) -> None:
    """Refuse to decode anything but a whole `Encoded` of `fmt` into a float dtype.

    Statically: an `Encoded` of this format holding `fmt.container` data, with
    the scales (shaped as its scaling gives them) and zero points its format
    needs. Eagerly, also what no encoder writes (a hand-built encoding): a
    negative, zero or infinite scale and the symmetric integer code past the
    range (int8's -128), which `save` refuses as well. A NaN scale (E8M0's
    0xFF) is what a traced encode writes for a group holding NaN or inf: that
    group decodes as NaN.
    """
    if not isinstance(enc, Encoded):
        raise PrecisionTypeError(
            f"decode expects an Encoded, got {type(enc).__name__}; build one with "
            f"{fmt.name}.encode(x)"
        )
    if format_of(enc) != fmt:
        raise FormatError(
            f"cannot decode a {enc.format.name} encoding as {fmt.name}; "
            f"call enc.decode() or {enc.format.name}.decode(enc)"
        )
    _check_arrays(fmt, enc)
    if enc.data.dtype == jax.dtypes.float0:
        raise PrecisionTypeError(
            f"this {fmt.name} encoding holds float0 data: it is a gradient that "
            "jax.grad(..., allow_int=True) made for stored integer codes, which have none. "
            "Differentiate float32 values instead: those the codes were made from, or the "
            "decoded ones (precision.to_full_precision of a Tensor)"
        )
    if np.dtype(enc.data.dtype) != fmt.container:
        raise PrecisionTypeError(
            f"a {fmt.name} encoding holds {fmt.container} data, got {enc.data.dtype}; "
            f"build it with {fmt.name}.encode(x)"
        )
    _check_float_dtype(fmt, dtype)
    scaling = enc.scaling
    if scaling is not None and not isinstance(scaling, Scaling):
        raise PrecisionTypeError(
            f"a {fmt.name} encoding's scaling is a Scaling or None, got {type(scaling).__name__} "
            f"{scaling!r:.60}; build it with {fmt.name}.encode(x)"
        )
    if scaling is None and fmt.default_scaling() is not None:
        raise FormatError(
            f"a {fmt.name} encoding needs its scaling, got scaling=None; build it with "
            f"{fmt.name}.encode(x)"
        )
    if scaling is None and enc.scale is not None:
        raise FormatError(
            f"an unscaled {fmt.name} encoding holds no scales, got scales of shape "
            f"{tuple(enc.scale.shape)}; build it with {fmt.name}.encode(x), or pass the "
            "scaling they belong to"
        )
    if scaling is not None:
        # a 0-d value is one group of one, whatever the scaling's axis
        got = None if enc.scale is None else tuple(enc.scale.shape)
        want = tuple(scaling.scale_shape(enc.shape)) if enc.shape else got
        one = got is not None and math.prod(got) == 1 and math.prod(want or ()) == 1
        if got is None or (got != want and not one):  # (one scale may be held as a scalar)
            raise FormatError(
                f"a {fmt.name} encoding under {scaling} needs scales of shape {want}, got "
                f"{'none' if got is None else got}; build it with {fmt.name}.encode(x)"
            )
    _check_tensor_scale(fmt, enc)
    if fmt.kind == "uint" and enc.zero_point is None:
        raise FormatError(
            f"a {fmt.name} encoding needs its zero points; build it with {fmt.name}.encode(x)"
        )
    _check_values(fmt, enc)


def _check_arrays(fmt: Format, enc: Encoded) -> None:
    """Each array an encoding holds is an array (a hand-built one may hold anything)."""
    arrays = ("data", "scale", "tensor_scale", "zero_point")
    for name, value in zip(arrays, enc.tree_flatten()[0], strict=True):
        if (value is not None or name == "data") and not isinstance(value, jax.Array | np.ndarray):
            raise PrecisionTypeError(
                f"a {fmt.name} encoding holds arrays, got {type(value).__name__} {value!r:.60} "
                f"as its {name}; build it with {fmt.name}.encode(x) or dtypes.from_codes"
            )


def _check_tensor_scale(fmt: Format, enc: Encoded) -> None:
    """A two-level encoding holds its float32 tensor scale (one, or one per layer of a
    stack: `tensor_scale_fits`); no other encoding holds one."""
    ts, want = enc.tensor_scale, two_level(enc.scaling)
    if ts is None and not want:
        return
    if ts is None or not want or enc.scaling is None:
        raise FormatError(
            f"a {fmt.name} encoding under {enc.scaling} "
            + ("needs its float32 tensor scale, got none" if want else "holds no tensor scale")
            + f"; build it with {fmt.name}.encode(x)"
        )
    if np.dtype(ts.dtype) != np.float32 or not enc.scaling.tensor_scale_fits(
        tuple(ts.shape), enc.shape
    ):
        raise FormatError(
            f"a {fmt.name} encoding of shape {enc.shape} needs a float32 tensor scale of shape "
            f"() (or one per layer, as {tuple(enc.shape[:1]) + (1,) * (len(enc.shape) - 1)}), "
            f"got {ts.dtype}{tuple(ts.shape)}; build it with {fmt.name}.encode(x)"
        )
    if not is_tracer(ts):
        t = np.asarray(ts)
        bad = (np.signbit(t) | (t == 0) | np.isinf(t)) & ~np.isnan(t)
        if bad.any():
            raise FormatError(
                f"a {fmt.name} encoding holds a tensor scale no encoder writes (negative, zero "
                f"or inf: {t.reshape(-1)[int(np.argmax(bad.reshape(-1)))]!r}); build it with "
                f"{fmt.name}.encode(x)"
            )


def _check_float_dtype(fmt: Format, dtype: Any) -> None:
    try:
        dt = np.dtype(dtype)
        floating = dtype is not None and bool(jnp.issubdtype(dt, jnp.floating))
    except TypeError:
        floating = False
    if floating and dt == np.float64 and not jax.config.read("jax_enable_x64"):
        raise PrecisionTypeError(
            f"{fmt.name} cannot decode into float64 while JAX is 32-bit (it would give "
            "float32 with a warning); set jax.config.update('jax_enable_x64', True) first, or "
            "decode into float32"
        )
    if not floating:
        raise PrecisionTypeError(
            f"{fmt.name} decodes into a floating dtype (float32, float64, bfloat16, float16), "
            f"got dtype={dtype!r}; the codes themselves are enc.data"
        )


def _check_values(fmt: Format, enc: Encoded) -> None:
    """The eager value checks of `check_decodable` (skipped for traced arrays)."""
    if enc.scale is not None and not is_tracer(enc.scale):
        scale = np.asarray(enc.scale)
        if scale.dtype == np.dtype(ml_dtypes.float8_e8m0fnu):
            bad = np.zeros(scale.shape, bool)  # 0xFF (NaN) is a NaN group's scale
        else:
            wide = scale.astype(np.float32)
            # int1's scale is a mean of |x|: 0 for an all-zero group
            zero_ok = fmt.kind == "int" and getattr(fmt, "binary", False)
            zero_ok = zero_ok or enc.tensor_scale is not None  # NVFP4 e4m3 block scales
            # a NaN scale is what a traced encode writes for a group holding NaN/inf:
            # decoding gives that group NaN, visibly; none of these is ever written
            bad = np.isinf(wide) | (np.signbit(wide) & ~np.isnan(wide))
            bad |= (wide == 0) & (not zero_ok)
        if bad.any():
            first = scale.reshape(-1)[int(np.argmax(bad.reshape(-1)))]
            raise FormatError(
                f"a {fmt.name} encoding holds {int(bad.sum())} scale(s) no encoder writes "
                f"(negative, zero or inf; the first: {first!r}); build it with "
                f"{fmt.name}.encode(x)"
            )
    if fmt.kind == "int" and fmt.code_bits > 1 and not is_tracer(enc.data):
        low = -(2 ** (fmt.code_bits - 1))
        if any_equal_now(enc.data, low, fmt.code_bits if fmt.packed else 8):
            raise FormatError(
                f"a {fmt.name} encoding holds the code {low}, which symmetric encoders never "
                f"write (codes are within ±{-low - 1}); build it with {fmt.name}.encode(x)"
            )


def dequantize(codes: jax.Array, enc: Encoded, offset: int, dtype: Any) -> jax.Array:
    """`codes` (values, for unscaled floats) times `enc`'s stored scales, as `dtype`.

    `offset` is log2 of the implicit scale of the elements, folded into E8M0
    scale bytes (MXINT8: 6; 0 for every other format).
    """
    float32 = np.dtype(dtype) == np.float32
    if enc.scale is None:
        return to_float32(codes) if float32 else codes.astype(dtype)
    assert enc.scaling is not None  # a scale comes with its scaling
    shape = enc.shape
    scale = _scale_storage.widen(enc.scale, enc.tensor_scale, enc.scaling, offset)
    scale = scale if shape else scale.reshape(())
    if shape:
        scale = enc.scaling.broadcast(scale, shape)
    # A NaN scale (a group that held NaN or inf) decodes its group as NaN: selected
    # as bits, not left to a product that flags assuming no NaN may drop (`_ieee`).
    floats = jnp.issubdtype(codes.dtype, jnp.floating)
    values = to_float32(codes) if floats else codes.astype(jnp.float32)
    return times_scale(values, scale).astype(dtype)


def straight_through_round(round_with_mask: RoundWithMask) -> Callable[..., jax.Array]:
    """A format's `round` from `round_with_mask`: jitted, with a straight-through
    derivative masked where clipped.

    The rounding itself has derivative 0 almost everywhere; the derivative
    used is 1 where the mask is true (the value was representable) and 0
    where it was clipped to the format's range.
    """

    @functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
    def round_ste(fmt: Any, scaling: Any, rounding: str, x: jax.Array, key: Any) -> jax.Array:
        return round_with_mask(fmt, scaling, rounding, x, key)[0]

    @round_ste.defjvp
    def _jvp(
        fmt: Any, scaling: Any, rounding: str, primals: Any, tangents: Any
    ) -> tuple[jax.Array, jax.Array]:
        x, key = primals
        tx = tangents[0]
        y, mask = round_with_mask(fmt, scaling, rounding, x, key)
        return y, jnp.where(mask, tx, jnp.zeros_like(tx)).astype(y.dtype)

    return jax.jit(round_ste, static_argnums=(0, 1, 2))


def storage_round(
    fmt: Format, x: Any, scaling: Scaling | None, rounding: str, key: Any
) -> jax.Array:
    """`round` of the storage encodings: `fmt.decode(fmt.encode(x))` with the
    straight-through derivative (`x` checked as `encode` checks it, before it
    meets the derivative rule)."""
    return _round_trip_straight_through(fmt, scaling, rounding, as_float_array(x), key)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _round_trip_straight_through(
    fmt: Format, scaling: Scaling | None, rounding: str, x: jax.Array, key: Any
) -> jax.Array:
    """`fmt.decode(fmt.encode(x))` with the straight-through derivative.

    Code books, asymmetric integers and E8M0 hold codes that carry no gradient
    of their own; without this rule `round` would pass a zero gradient silently.
    """
    enc = fmt.encode(x, scaling=scaling, rounding=rounding, key=key)
    # float64 input gives float64 (`result_dtype`); the codes themselves hold no more
    return fmt.decode(enc, fmt.result_dtype(x.dtype, scaling))


@_round_trip_straight_through.defjvp
def _round_trip_straight_through_jvp(
    fmt: Format, scaling: Scaling | None, rounding: str, primals: Any, tangents: Any
) -> tuple[jax.Array, jax.Array]:
    x, key = primals
    y = _round_trip_straight_through(fmt, scaling, rounding, x, key)
    return y, tangents[0].astype(y.dtype)


def prepare_storage(
    fmt: Format,
    x: Any,
    scaling: Scaling | None,
    rounding: str,
    key: Any,
    modes: tuple[str, ...],
) -> tuple[jax.Array, Scaling]:
    """The eager checks of the absmax-scaled storage encodings; returns (float32 x, scaling).

    Code books and zero-point integers keep absmax scales (no power-of-two
    rule, no E8M0 or two-level e4m3 scales) and round with `modes` only.
    """
    if rounding not in modes:
        raise RoundingError(
            f"{fmt.name} rounds with {' or '.join(modes)}, got rounding={rounding!r}; "
            "the directed modes have no meaning for it"
        )
    x = as_float_array(x).astype(jnp.float32)
    scaling = storage_scaling(fmt, scaling)
    if x.ndim:
        scaling.validate(x.shape)
    check_finite(x, fmt)
    return x, scaling


def storage_scaling(fmt: Format, scaling: Scaling | None) -> Scaling:
    """The scaling of a code-book or zero-point encoding, checked (absmax scales only)."""
    scaling = resolve_scaling(fmt, scaling)
    assert scaling is not None  # a storage encoding has a default scaling
    if scaling.scale_format in ("float8_e8m0fnu", "float8_e4m3fn"):
        raise ScalingError(
            f"{fmt.name} keeps absmax scales; store them as float32, bfloat16 or float16, "
            f"not {scaling.scale_format}"
        )
    if scaling.power_of_two:
        raise ScalingError(
            f"{fmt.name} scales map each group onto its codes exactly (no power-of-two rule); pass "
            f"{type(scaling).__name__} without power_of_two=True"
        )
    return scaling


def check_storage(fmt: Format, x: Any, scaling: Scaling | None) -> None:
    """`check` of the code-book and zero-point encodings: what `prepare_storage`
    checks (the scaling, its fit, finite values) except the rounding mode,
    which `check` is not given."""
    x = as_float_array(x)
    resolved = storage_scaling(fmt, scaling)
    if x.ndim:
        resolved.validate(x.shape)
    check_finite(x, fmt)
