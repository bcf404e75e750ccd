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
from ._per_group import computed_once
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
    if t.size <= _UNROLLED:
        count = jnp.zeros(y.shape, jnp.int32)
        for tk in t.tolist():  # unrolled over the table, fused into one kernel
            count = count + (y > np.float32(tk)).astype(jnp.int32)
        return count
    return jnp.searchsorted(jnp.asarray(t), y, side="left").astype(jnp.int32)


def stochastic_index(fmt: CodebookFormat, y: jax.Array, u: jax.Array) -> jax.Array:
    """Index of the table entry below finite `y` or the one above it, the upper where
    the uniform `u` lies below `(y - a) / (b - a)` for the neighbours `a <= y < b` (past
    either end of the table, its last interval), as int32.

    A table of up to 33 entries finds the interval by comparisons unrolled over it,
    its ends chosen as they go (XLA:CPU's `searchsorted` and the two gathers took 2.9x
    the time of nf4's stochastic encode; the same indices); a larger one searches.
    """
    v = np.asarray(fmt._table(), np.float32)
    n = v.shape[0]
    if n - 1 > _UNROLLED:
        return _stochastic_index_searched(v, y, u)
    i = jnp.zeros(y.shape, jnp.int32)
    a = jnp.full(y.shape, v[0])
    b = jnp.full(y.shape, v[1])
    for k in range(1, n - 1):  # (the interval's lower end: the last entry at or below y)
        above = y >= v[k]
        i = i + above.astype(jnp.int32)
        a = jnp.where(above, v[k], a)
        b = jnp.where(above, v[k + 1], b)
    return _upper_with_probability(i, a, b, y, u)


def _stochastic_index_searched(v: np.ndarray, y: jax.Array, u: jax.Array) -> jax.Array:
    """`stochastic_index` for a table of any size: a search and two gathers."""
    table = jnp.asarray(v)
    i = jnp.clip(jnp.searchsorted(table, y, side="right") - 1, 0, v.shape[0] - 2)
    return _upper_with_probability(i.astype(jnp.int32), table[i], table[i + 1], y, u)


def _upper_with_probability(
    i: jax.Array, a: jax.Array, b: jax.Array, y: jax.Array, u: jax.Array
) -> jax.Array:
    """`i + 1` where `u` lies below `(y - a) / (b - a)` (correctly rounded), else `i`."""
    p = divide(y - a, b - a)
    return i + (u < p).astype(jnp.int32)


# The most thresholds a table's search is unrolled over (`nearest_index`, `stochastic_index`)
_UNROLLED = 32


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _encode_jit(
    fmt: CodebookFormat, scaling: Scaling, rounding: str, x: jax.Array, key: Any
) -> Encoded:
    scalar = x.ndim == 0
    xs = x.reshape(1) if scalar else x
    y, stored = _scaled(fmt, xs, scaling, rounding)
    y = lax.stop_gradient(y)
    if rounding == "stochastic":
        u = jax.random.uniform(key, y.shape, jnp.float32)
        # The indices made into a buffer of their own before the packing reads them: fused
        # into the packing's reduction, XLA:CPU computed them there without vectorising
        # (nf4 in blocks of 64, 2**20 values: 21.7 ms against 7.7; the same codes)
        idx = computed_once(lambda y, u: stochastic_index(fmt, y, u), y, u)
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
