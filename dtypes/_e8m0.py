"""`float8_e8m0fnu` (E8M0) as a format of its own: the OCP MX scale bytes.

The class needs only numpy and ml_dtypes; its operations are computed in its
codec, `_e8m0_codec` (encoding is one conversion, done by XLA), which
`Format`'s methods import on first use, so the format itself loads no JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from ._argument_checks import check_format_fields, refuse_scale_format_arguments
from ._format import Format
from ._scaling import Scaling, shape_of

__all__ = ["E8M0Format", "float8_e8m0fnu"]


@dataclasses.dataclass(frozen=True)
class E8M0Format(Format):
    """`float8_e8m0fnu`: the OCP MX scale format, an unsigned 8-bit power of two.

    Byte `b` holds `2**(b - 127)` (from 2**-127 to 2**127); 0xFF is NaN; there
    is no zero, sign or infinity. Encoding rounds to the nearest power of two
    exactly as `ml_dtypes.float8_e8m0fnu` 0.7 does (with no mantissa bits a tie,
    `1.5 * 2**k`, goes up, in the binade of 2**-127 too); NaN stays NaN. Zero,
    negative values, inf and values from 1.5 * 2**127 have no code: given eagerly they
    are refused (`FormatError`), traced they become NaN. A storage encoding: only
    `nearest_even` rounding, no scaling.

    Examples:
        >>> import numpy as np
        >>> enc = float8_e8m0fnu.encode(np.array([1.0, 0.25, 3.0], np.float32))
        >>> enc.data.view(np.uint8).tolist(), enc.decode().tolist()
        ([127, 125, 129], [1.0, 0.25, 4.0])
    """

    name: str = dataclasses.field(default="float8_e8m0fnu", kw_only=True, compare=False)

    kind: ClassVar[str] = "scale"
    _codec: ClassVar[str] = "_e8m0_codec"
    bits: ClassVar[int] = 8

    def __post_init__(self) -> None:
        check_format_fields(self, "E8M0Format()")
        if not self.name:
            object.__setattr__(self, "name", "float8_e8m0fnu")

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

    def nbytes(self, shape: tuple[int, ...], scaling: Scaling | None = None) -> int:
        """One byte a value."""
        refuse_scale_format_arguments(self, scaling, "nearest_even")
        return math.prod(shape_of(shape))

    def __repr__(self) -> str:
        return "E8M0Format()"


float8_e8m0fnu = E8M0Format()
"""float8_e8m0fnu: E8M0, the OCP MX scale format (powers of two 2**-127..2**127, NaN 0xFF)."""
