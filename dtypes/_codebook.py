"""Code-book formats: each code indexes a sorted table of values (NF4 built in).

A storage encoding: values are scaled per group so the group's absmax maps to
the table's largest magnitude, then each is replaced by the index of a table
entry, packed densely at `ceil(log2(len(values)))` bits. Decoding is a table
look-up times the group's scale.

Rounding to table entries:

- `nearest_even`: the nearest entry; a value exactly halfway between two
  neighbours goes to the one with the even index. The halfway points are
  computed exactly (as fractions, when the format is built) and the
  comparisons are made against their float32 neighbours, so the choice is
  exact for every float32.
- `stochastic`: between neighbours `a <= y <= b`, `b` with probability
  `(y - a) / (b - a)` (unbiased inside the table's range); values beyond the
  table go to its end entries.

Other modes have no meaning for a table that need not be a grid and are
refused.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _codec, _packing, _scale_format
from ._encoded import Encoded
from ._errors import FormatError, PrecisionTypeError, RoundingError, ScalingError
from ._formats import Format
from ._rounding import check_rounding
from ._scaling import PerBlock, PerTensor, Scaling

__all__ = ["CodebookFormat", "nf4"]

CODEBOOK_ROUNDINGS = ("nearest_even", "stochastic")


@dataclasses.dataclass(frozen=True)
class CodebookFormat(Format):
    """A format whose codes index `values`, a sorted table of float32 numbers.

    Args:
        values: the table (2 to 65536 distinct finite numbers, any order;
            kept sorted as float32).
        scaling: the default scaling (per-tensor absmax when omitted); a
            group's scale is `absmax / max(|values|)`.
        name: display name (default `codebook<n>`).

    Examples:
        >>> import numpy as np
        >>> fmt = CodebookFormat([-1.0, 0.0, 0.5, 1.0], name="tiny")
        >>> fmt.bits, fmt.values
        (2, (-1.0, 0.0, 0.5, 1.0))
        >>> enc = fmt.encode(np.array([0.2, 0.3, -2.0, 1.6], np.float32))
        >>> enc.decode().tolist(), enc.nbytes  # one byte of codes, a float32 scale
        ([0.0, 0.0, -2.0, 2.0], 5)
    """

    values: tuple[float, ...]
    scaling: Scaling | None = dataclasses.field(default=None, kw_only=True)
    name: str = dataclasses.field(default="", kw_only=True, compare=False)

    kind: ClassVar[str] = "codebook"

    def __post_init__(self):
        try:
            table = np.asarray(self.values, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise PrecisionTypeError(
                f"CodebookFormat needs a sequence of numbers, got {self.values!r}"
            ) from None
        table32 = np.unique(table.astype(np.float32))
        if not np.all(np.isfinite(table32)) or not 2 <= table32.size <= 1 << 16:
            raise FormatError(
                f"CodebookFormat needs 2 to 65536 distinct finite values, got {table.size} "
                f"({table32.size} distinct after rounding to float32); pass a table such as "
                "[-1.0, -0.5, 0.0, 0.5, 1.0]"
            )
        tiny = (table32 != 0) & (np.abs(table32) < np.float32(2.0**-126))
        if tiny.any():
            raise FormatError(
                f"CodebookFormat entries must be 0 or at least 2**-126 in magnitude, got the "
                f"float32 subnormal {float(table32[tiny][0])!r} (XLA on CPU reads subnormals as "
                "zero, so it could not be told apart from 0); scale the table up"
            )
        if np.max(np.abs(table32)) == 0:
            raise FormatError("a CodebookFormat table needs a nonzero entry to scale to")
        object.__setattr__(self, "values", tuple(float(v) for v in table32))
        if self.scaling is not None and not isinstance(self.scaling, Scaling):
            raise PrecisionTypeError(f"scaling must be a dtypes Scaling, got {self.scaling!r}")
        if not self.name:
            object.__setattr__(self, "name", f"codebook{len(self.values)}")

    # -- numbers ---------------------------------------------------------
    @property
    def bits(self) -> int:
        """Code width: `ceil(log2(len(values)))`."""
        return max(1, math.ceil(math.log2(len(self.values))))

    @property
    def container(self) -> np.dtype:
        return np.dtype(np.uint8)

    @property
    def code_bits(self) -> int:
        return self.bits

    @property
    def max(self) -> float:
        """Largest magnitude in the table (what a group's absmax maps to)."""
        return float(max(abs(v) for v in self.values))

    def default_scaling(self) -> Scaling:
        return self.scaling if self.scaling is not None else PerTensor()

    def _table(self) -> np.ndarray:
        return np.asarray(self.values, np.float32)

    def _thresholds(self) -> np.ndarray:
        """float32 t_k with: code > k exactly when y > t_k (nearest, ties to even)."""
        return _thresholds(self.values)

    # -- operations ------------------------------------------------------
    def encode(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> Encoded:
        """Encode `x` as packed table indices with per-group scales.

        Raises:
            RoundingError: a mode other than nearest_even/stochastic, or no key.
            NonFiniteError: NaN/inf given eagerly.
            ScalingError: a scaling that does not fit `x`.
        """
        x, scaling = _prepare(self, x, scaling, rounding, key)
        return _encode_jit(self, scaling, rounding, x, key)

    def decode(self, encoded: Encoded, dtype: Any = np.float32) -> jax.Array:
        """Table values times the group scales."""
        _check_encoded(self, encoded)
        return _decode_jit(self, encoded, jnp.dtype(dtype))

    def round(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> jax.Array:
        """`decode(encode(x))` as float32, straight-through for gradients."""
        return _codec.storage_round(self, scaling, rounding, x, key)

    def nbytes(self, shape: tuple[int, ...], scaling: Scaling | None = None) -> int:
        """Packed codes plus the scales, at the scale format's width."""
        shape = tuple(int(n) for n in shape)
        scaling = self.default_scaling() if scaling is None else scaling
        return _packed_nbytes(shape, self.code_bits) + _scale_format.scale_nbytes(scaling, shape)

    def __repr__(self) -> str:
        return f"CodebookFormat(<{len(self.values)} values>, name={self.name!r})"


@functools.lru_cache(maxsize=64)
def _thresholds(values: tuple[float, ...]) -> np.ndarray:
    """See `CodebookFormat._thresholds` (cached: exact rational arithmetic per entry)."""
    v = [Fraction(a) for a in values]
    out = []
    for k in range(len(v) - 1):
        mid = (v[k] + v[k + 1]) / 2  # exact
        upper_even = (k + 1) % 2 == 0
        # the largest float32 t with "y > t" meaning "y > mid" (or "y >= mid"
        # when the upper entry wins the tie)
        t = np.float32(float(mid))
        while Fraction(float(t)) > mid or (upper_even and Fraction(float(t)) == mid):
            t = np.nextafter(t, np.float32(-np.inf))
        while Fraction(float(np.nextafter(t, np.float32(np.inf)))) < mid or (
            not upper_even and Fraction(float(np.nextafter(t, np.float32(np.inf)))) == mid
        ):
            t = np.nextafter(t, np.float32(np.inf))
        out.append(t)
    return np.asarray(out, np.float32)


def _packed_nbytes(shape: tuple[int, ...], bits: int) -> int:
    lead = math.prod(shape[:-1]) if shape else 1
    return lead * _packing.packed_length(shape[-1] if shape else 1, bits)


def _prepare(fmt: Format, x: Any, scaling, rounding: str, key, modes=CODEBOOK_ROUNDINGS):
    """Shared eager checks of the storage encodings; returns (float32 x, scaling)."""
    check_rounding(rounding, key)
    if rounding not in modes:
        raise RoundingError(
            f"{fmt.name} rounds with {' or '.join(modes)}, got rounding={rounding!r}; "
            "the directed modes have no meaning for it"
        )
    x = _codec.as_float_array(x).astype(jnp.float32)
    scaling = fmt.default_scaling() if scaling is None else scaling
    if not isinstance(scaling, Scaling):
        raise PrecisionTypeError(
            f"scaling must be PerTensor(), PerAxis(axis) or PerBlock(size), got {scaling!r}"
        )
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
    if x.ndim:
        scaling.validate(x.shape)
    _codec._check_finite(x, fmt)
    return x, scaling


def _check_encoded(fmt: Format, enc: Any) -> None:
    if not isinstance(enc, Encoded):
        raise PrecisionTypeError(
            f"decode expects an Encoded, got {type(enc).__name__}; build one with "
            f"{fmt.name}.encode(x)"
        )
    if enc.format != fmt:
        raise FormatError(
            f"cannot decode a {enc.format.name} encoding as {fmt.name}; call enc.decode()"
        )


def _scaled(fmt, x: jax.Array, scaling: Scaling):
    """(flushed x times the group reciprocals, stored scales) for absmax scaling onto fmt.max."""
    x = _codec.flush_subnormals(x)
    scale, inv, pre = _codec._scales(x, fmt, scaling, fmt.max, 0)
    stored, _, inv, pre = _scale_format.narrow(x, scaling, scale, inv, pre, fmt.max, 0)
    return _codec._times_reciprocal(x, scaling, inv, pre), stored


def nearest_index(fmt: CodebookFormat, y: jax.Array) -> jax.Array:
    """Index of the nearest table entry (ties to the even index), as int32."""
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
    p = (y - a) / (b - a)
    u = jax.random.uniform(key, y.shape, jnp.float32)
    return (i + (u < p).astype(i.dtype)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _encode_jit(fmt: CodebookFormat, scaling: Scaling, rounding: str, x, key) -> Encoded:
    scalar = x.ndim == 0
    xs = x.reshape(1) if scalar else x
    y, stored = _scaled(fmt, xs, scaling)
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
def _decode_jit(fmt: CodebookFormat, enc: Encoded, dtype) -> jax.Array:
    codes = _unpack_codes(enc, fmt.code_bits).astype(jnp.int32)
    values = jnp.take(jnp.asarray(fmt._table()), codes, mode="clip")
    assert enc.scale is not None  # codebook codes are always scaled
    assert enc.scaling is not None
    scale = _scale_format.widen(enc.scale, None, enc.scaling, 0)
    if enc.shape:
        scale = enc.scaling.broadcast(scale, enc.shape)
    return (values * scale).astype(dtype)


# The NF4 table of QLoRA (Dettmers et al., 2023): the 16 values are quantiles
# of a standard normal distribution, scaled into [-1, 1], with an exact 0
# (8 positive levels from the quantiles in [0.5, 0.9677083], 7 negative).
NF4_VALUES = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)

nf4 = CodebookFormat(NF4_VALUES, scaling=PerBlock(64), name="nf4")
"""nf4: QLoRA's 4-bit normal-float code book, absmax scales per block of 64 (float32)."""
