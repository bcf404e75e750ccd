"""`float8_e8m0fnu` (E8M0) as a format of its own: the OCP MX scale bytes."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from . import _codec
from ._codec import as_float_array
from ._encoded import Encoded
from ._errors import PrecisionTypeError, RoundingError, ScalingError
from ._formats import Format
from ._scaling import Scaling

__all__ = ["E8M0Format", "float8_e8m0fnu"]


@dataclasses.dataclass(frozen=True)
class E8M0Format(Format):
    """`float8_e8m0fnu`: the OCP MX scale format, an unsigned 8-bit power of two.

    Byte `b` holds `2**(b - 127)` (from 2**-127 to 2**127); 0xFF is NaN; there
    is no zero, sign or infinity. Encoding rounds to the nearest power of two
    exactly as `ml_dtypes.float8_e8m0fnu` does (with no mantissa bits a tie,
    `1.5 * 2**k`, goes up); zero, negative values and NaN become NaN, values
    past 2**127 NaN as well. A storage encoding: only `nearest_even`
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
    def container(self) -> np.dtype:
        return np.dtype(ml_dtypes.float8_e8m0fnu)

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
        _storage_args(self, scaling, rounding)
        return Encoded(_to_e8m0(as_float_array(x)), None, self, None)

    def decode(self, encoded: Encoded, dtype: Any = np.float32) -> jax.Array:
        """Values of E8M0 bytes (2**-127 is a float32 subnormal: decode to float64 to keep it)."""
        return encoded.data.astype(jnp.dtype(dtype))

    def round(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> jax.Array:
        """`decode(encode(x))` in float32, straight-through for gradients."""
        return _codec.storage_round(self, scaling, rounding, x, key)

    def nbytes(self, shape: tuple[int, ...], scaling: Scaling | None = None) -> int:
        """One byte a value."""
        _storage_args(self, scaling, "nearest_even")
        return math.prod(int(n) for n in shape)

    def __repr__(self) -> str:
        return "E8M0Format()"


@jax.jit
def _to_e8m0(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float8_e8m0fnu)


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


def check_scaling_type(scaling: Any) -> None:
    """Refuse a scaling that is not a `Scaling` (shared by the storage-only formats)."""
    if scaling is not None and not isinstance(scaling, Scaling):
        raise PrecisionTypeError(
            f"scaling must be PerTensor(), PerAxis(axis) or PerBlock(size), got {scaling!r}"
        )


float8_e8m0fnu = E8M0Format()
"""float8_e8m0fnu: E8M0, the OCP MX scale format (powers of two 2**-127..2**127, NaN 0xFF)."""
