"""`float8_e8m0fnu` (E8M0) as a format of its own: the OCP MX scale bytes.

Its codec is one conversion, done by XLA (bit-identical to ml_dtypes); JAX is
imported by the methods on first use, so the format itself loads no JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import ml_dtypes
import numpy as np

from ._errors import FormatError, RoundingError, ScalingError
from ._format import Format, shape_of
from ._scaling import Scaling

if TYPE_CHECKING:
    import jax

    from ._encoded import Encoded

__all__ = ["E8M0Format", "float8_e8m0fnu"]


@dataclasses.dataclass(frozen=True)
class E8M0Format(Format):
    """`float8_e8m0fnu`: the OCP MX scale format, an unsigned 8-bit power of two.

    Byte `b` holds `2**(b - 127)` (from 2**-127 to 2**127); 0xFF is NaN; there
    is no zero, sign or infinity. Encoding rounds to the nearest power of two
    exactly as `ml_dtypes.float8_e8m0fnu` does (with no mantissa bits a tie,
    `1.5 * 2**k`, goes up); NaN stays NaN. Zero, negative values, inf and
    values from 1.5 * 2**127 have no code: given eagerly they are refused
    (`FormatError`), traced they become NaN. A storage encoding: only `nearest_even`
    rounding, no scaling.

    Examples:
        >>> import numpy as np
        >>> enc = float8_e8m0fnu.encode(np.array([1.0, 0.25, 3.0], np.float32))
        >>> enc.data.view(np.uint8).tolist(), enc.decode().tolist()
        ([127, 125, 129], [1.0, 0.25, 4.0])
    """

    name: str = dataclasses.field(default="float8_e8m0fnu", kw_only=True, compare=False)

    kind: ClassVar[str] = "scale"
    bits: ClassVar[int] = 8

    @property
    def container(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = np.dtype(ml_dtypes.float8_e8m0fnu)
        return dtype

    @property
    def max(self) -> float:
        """Largest value, 2**127."""
        return 2.0**127

    @property
    def min_normal(self) -> float:
        """Smallest value, 2**-127."""
        return 2.0**-127

    def encode(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> Encoded:
        """Encode `x` into E8M0 bytes (see the class docstring for the rounding)."""
        from ._encoded import Encoded
        from ._inputs import as_float_array

        _storage_args(self, scaling, rounding)
        x = as_float_array(x)
        _refuse_unrepresentable(x)
        return Encoded(_to_e8m0()(x), None, self, None)

    def decode(self, encoded: Encoded, dtype: Any = np.float32) -> jax.Array:
        """Values of E8M0 bytes: byte b is 2**(b - 127), 0xFF is NaN.

        Into float32 the values are built from their bits (byte 0, 2**-127, is a
        float32 subnormal, which a conversion may flush on one backend and keep
        on another); other dtypes convert.
        """
        import jax.numpy as jnp
        from jax import lax

        from ._codec import check_decodable

        check_decodable(self, encoded, dtype)
        if jnp.dtype(dtype) != jnp.float32:
            return encoded.data.astype(jnp.dtype(dtype))
        byte = lax.bitcast_convert_type(encoded.data, jnp.uint8).astype(jnp.uint32)
        bits = jnp.where(byte == 0, jnp.uint32(0x00400000), byte << 23)
        bits = jnp.where(byte == 0xFF, jnp.uint32(0x7FC00000), bits)
        return lax.bitcast_convert_type(bits, jnp.float32)

    def round(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> jax.Array:
        """`decode(encode(x))` in float32, straight-through for gradients."""
        from . import _codec

        return _codec.storage_round(self, scaling, rounding, x, key)

    def nbytes(self, shape: tuple[int, ...], scaling: Scaling | None = None) -> int:
        """One byte a value."""
        _storage_args(self, scaling, "nearest_even")
        return math.prod(shape_of(shape))

    def check(self, x: Any, *, scaling: Scaling | None = None) -> None:
        """Raise what `encode` would raise for `x`: a scaling, or (eagerly) a value that
        is not NaN and would become NaN (zero, negative, inf, from 1.5 * 2**127)."""
        from ._inputs import as_float_array

        _storage_args(self, scaling, "nearest_even")
        _refuse_unrepresentable(as_float_array(x))

    def __repr__(self) -> str:
        return "E8M0Format()"


@functools.cache
def _to_e8m0() -> Callable[[jax.Array], jax.Array]:
    """The jitted conversion into E8M0 bytes (built on first use: it needs JAX)."""
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda x: x.astype(jnp.float8_e8m0fnu))


def _refuse_unrepresentable(x: jax.Array) -> None:
    """Refuse, eagerly, values E8M0 would turn into NaN: it holds positive powers of two
    only (NaN itself has a code and stays NaN). Traced values encode as documented."""
    from ._inputs import is_tracer

    if is_tracer(x):
        return
    v = np.asarray(x, np.float64)
    bad = ~np.isnan(v) & ~((v > 0) & (v < 1.5 * 2.0**127))
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), v.shape) if v.ndim else ()
        raise FormatError(
            f"float8_e8m0fnu holds only positive powers of two (2**-127 to 2**127), so "
            f"{int(bad.sum())} of {v.size} values would become NaN silently (the first, "
            f"{float(v[first])!r}, at index {tuple(int(i) for i in first)}); it is a scale "
            "format: use it as a scaling's scale_format (e.g. PerBlock(32, "
            "power_of_two=True, scale_format='float8_e8m0fnu')), or encode these values "
            "in a value format such as 'float8_e4m3fn'"
        )


def _storage_args(fmt: Format, scaling: Scaling | None, rounding: str) -> None:
    if scaling is not None:
        raise ScalingError(
            f"{fmt.name} is a scale format and takes no scaling of its own, got {scaling}; "
            "name it as a scaling's scale_format instead, e.g. "
            "PerBlock(32, power_of_two=True, scale_format='float8_e8m0fnu')"
        )
    if rounding != "nearest_even":
        raise RoundingError(
            f"{fmt.name} rounds only to nearest (rounding='nearest_even'), got {rounding!r}: "
            "its scales come from the OCP MX rule, which picks the power of two itself"
        )


float8_e8m0fnu = E8M0Format()
"""float8_e8m0fnu: E8M0, the OCP MX scale format (powers of two 2**-127..2**127, NaN 0xFF)."""
