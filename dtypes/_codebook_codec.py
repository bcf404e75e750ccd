"""encode / decode / round / check of `CodebookFormat`s: table indices, in jnp.

See `_codebook` for the rounding rules (nearest or stochastic). `Format`'s
methods import this module on first use. `round` and `check` are those every
storage encoding shares (`_codec.storage_round`, `_codec.check_storage`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _codec, _packing, _scale_storage
from ._encoded import Encoded
from ._ieee import divide, times_scale
from ._rounding_modes import CODEBOOK_ROUNDINGS
from ._scale_rules import flush_subnormals, scales, times_reciprocal
from ._scaling import Scaling

if TYPE_CHECKING:
    from ._codebook import CodebookFormat

__all__ = ["check", "decode", "encode", "nearest_index", "round", "stochastic_index"]


def encode(
    fmt: CodebookFormat, x: Any, scaling: Scaling | None, rounding: str, key: Any
) -> Encoded:
    """`fmt.encode(x, ...)`: the storage encodings' checks, then one compiled kernel."""
    xs, resolved = _codec.prepare_storage(fmt, x, scaling, rounding, key, CODEBOOK_ROUNDINGS)
    encoded: Encoded = _encode_jit(fmt, resolved, rounding, xs, key)
    return encoded


def decode(fmt: CodebookFormat, enc: Encoded, dtype: Any = np.float32) -> jax.Array:
    """`fmt.decode(enc, dtype)`: the argument checks, then one compiled kernel."""
    _codec.check_decodable(fmt, enc, dtype)
    values: jax.Array = _decode_jit(fmt, enc, jnp.dtype(dtype))
    return values


# decode(encode(x)) with the straight-through derivative, and encode's checks alone:
# what every storage encoding does
round = _codec.storage_round
check = _codec.check_storage


def _scaled(
    fmt: CodebookFormat, x: jax.Array, scaling: Scaling, rounding: str
) -> tuple[jax.Array, jax.Array]:
    """(flushed x times the group reciprocals, stored scales) for absmax scaling onto fmt.max."""
    scale, inv, pre, _ = scales(x, scaling, fmt.max, 0)
    stored, _, inv, pre = _scale_storage.narrow(x, scaling, scale, inv, pre, fmt.max, 0)
    return times_reciprocal(x, scaling, inv, pre, rounding=rounding, signed_zero=False), stored


def nearest_index(fmt: CodebookFormat, y: jax.Array) -> jax.Array:
    """Index of the nearest table entry (ties to the even index), as int32.

    A subnormal `y` counts as zero on every backend (flushed here, as XLA:CPU's
    arithmetic reads it), and no threshold is subnormal (`_thresholds`).
    """
    y = flush_subnormals(y)
    t = fmt._thresholds()
    if t.size <= 32:
        count = jnp.zeros(y.shape, jnp.int32)
        for tk in t.tolist():  # unrolled over the table, fused into one kernel
            count = count + (y > np.float32(tk)).astype(jnp.int32)
        return count
    return jnp.searchsorted(jnp.asarray(t), y, side="left").astype(jnp.int32)


def stochastic_index(fmt: CodebookFormat, y: jax.Array, key: jax.Array) -> jax.Array:
    v = jnp.asarray(fmt._table())
    n = v.shape[0]
    i = jnp.clip(jnp.searchsorted(v, y, side="right") - 1, 0, n - 2)
    a, b = v[i], v[i + 1]
    p = divide(y - a, b - a)
    u = jax.random.uniform(key, y.shape, jnp.float32)
    return (i + (u < p).astype(i.dtype)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _encode_jit(
    fmt: CodebookFormat, scaling: Scaling, rounding: str, x: jax.Array, key: Any
) -> Encoded:
    scalar = x.ndim == 0
    xs = x.reshape(1) if scalar else x
    y, stored = _scaled(fmt, xs, scaling, rounding)
    y = lax.stop_gradient(y)
    if rounding == "stochastic":
        idx = stochastic_index(fmt, y, key)
    else:
        idx = nearest_index(fmt, y)
    codes = idx.astype(jnp.uint16 if fmt.code_bits > 8 else jnp.uint8)
    data = _pack_codes(codes, fmt.code_bits)
    return Encoded(
        data,
        stored.reshape(()) if scalar else stored,
        fmt,
        scaling,
        None if scalar else x.shape[-1],
    )


def _pack_codes(codes: jax.Array, bits: int) -> jax.Array:
    if bits == 8:
        return codes.astype(jnp.uint8)
    return _packing.pack(codes, bits)


def _unpack_codes(enc: Encoded, bits: int) -> jax.Array:
    shape = enc.shape
    if bits == 8:
        return enc.data
    n = shape[-1] if shape else 1
    return _packing.unpack(enc.data, bits, n, signed=False).reshape(shape)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _decode_jit(fmt: CodebookFormat, enc: Encoded, dtype: Any) -> jax.Array:
    codes = _unpack_codes(enc, fmt.code_bits).astype(jnp.int32)
    values = jnp.take(jnp.asarray(fmt._table()), codes, mode="clip")
    assert enc.scale is not None  # codebook codes are always scaled
    assert enc.scaling is not None
    scale = _scale_storage.widen(enc.scale, None, enc.scaling, 0)
    if enc.shape:
        scale = enc.scaling.broadcast(scale, enc.shape)
    return times_scale(values, scale).astype(dtype)
