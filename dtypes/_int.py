"""`IntFormat`: symmetric integer codes with a scale per group, and their codec.

The class and its numbers need only numpy. The operations are computed in
`_int_codec`, which the methods import on first use, so building or looking
up a format, as `import dtypes` does, loads no JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ._arguments import check_scaling_field, refuse_non_finite, refuse_scaling, resolve_scaling
from ._errors import FormatError
from ._format import Format
from ._scaling import PerTensor, Scaling

if TYPE_CHECKING:
    import jax

    from ._encoded import Encoded

__all__ = ["IntFormat"]


@dataclasses.dataclass(frozen=True)
class IntFormat(Format):
    """A symmetric integer format with a float32 scale per group.

    Codes lie in `[-qmax, qmax]` with `qmax = 2**(bits-1) - 1`; a value is
    `code * scale`. 4-, 2- and 1-bit codes are packed into bytes.

    `bits=1` is a *binary* format: codes are ±1 (`sign(x)`, with 0 mapping to
    +1) and the scale is `mean(|x|)` of the group, as in XNOR-style binary
    networks. This is not ml_dtypes' `int1`, whose two values are {-1, 0}.

    Examples:
        >>> IntFormat(4).qmax, IntFormat(4).nbytes((1024, 1024))
        (7, 524292)
    """

    bits: int
    scaling: Scaling | None = dataclasses.field(default=None, kw_only=True)
    name: str = dataclasses.field(default="", kw_only=True, compare=False)

    kind: ClassVar[str] = "int"

    def __post_init__(self) -> None:
        check_scaling_field(self, self.scaling)
        if (
            not isinstance(self.bits, int)
            or isinstance(self.bits, bool)
            or self.bits not in (1, 2, 4, 8)
        ):
            raise FormatError(
                f"IntFormat({self.bits!r}) is not supported: bits must be 8, 4, 2 or 1; "
                "pass e.g. IntFormat(8)"
            )
        if not self.name:
            object.__setattr__(self, "name", f"int{self.bits}")

    @property
    def qmax(self) -> int:
        """Largest code magnitude (1 for the binary int1)."""
        return 1 if self.bits == 1 else (1 << (self.bits - 1)) - 1

    @property
    def binary(self) -> bool:
        """True for the ±1 `int1` format."""
        return self.bits == 1

    @property
    def max(self) -> float:
        """Largest code (values are `code * scale`)."""
        return float(self.qmax)

    @property
    def container(self) -> np.dtype:
        return np.dtype(np.int8) if self.bits == 8 else np.dtype(np.uint8)

    @property
    def code_bits(self) -> int:
        return self.bits

    @property
    def top_exponent(self) -> int:
        """floor(log2(qmax)): the power-of-two scale rule's exponent of the largest code.

        Also log2 of the implicit scale an E8M0 scale byte folds in (MXINT8's
        elements are `code / 64`, so 6 for int8); 0 for the binary int1.
        """
        return 0 if self.binary else math.floor(math.log2(self.qmax))

    def default_scaling(self) -> Scaling:
        return self.scaling if self.scaling is not None else PerTensor()

    # -- operations: computed in `_int_codec`, imported on first use --------
    def encode(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> Encoded:
        """Encode `x` (see `Format.encode`): codes and a float32 scale per group."""
        from . import _int_codec

        return _int_codec.encode(self, x, scaling, rounding, key)

    def check(self, x: Any, *, scaling: Scaling | None = None) -> None:
        """Raise the error `encode(x, scaling=scaling)` would raise (see `Format.check`)."""
        if isinstance(x, np.ndarray) and x.dtype in (np.float16, np.float32):
            # the same checks, made without JAX (float64 goes to JAX, which may narrow it)
            resolved = resolve_scaling(self, scaling)
            assert resolved is not None  # an integer format always has a default scaling
            refuse_scaling(self, resolved, x.shape)
            refuse_non_finite(x, self)
            return
        from . import _int_codec

        _int_codec.check(self, x, scaling)

    def decode(self, encoded: Encoded, dtype: Any = np.float32) -> jax.Array:
        """Logical values of `encoded` (`code * scale`) as a `dtype` array."""
        from . import _int_codec

        return _int_codec.decode(self, encoded, dtype)

    def round(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> jax.Array:
        """Snap `x` onto its group's grid of `code * scale` (see `Format.round`)."""
        from . import _int_codec

        return _int_codec.fake_quantize(self, x, scaling, rounding, key)

    def __repr__(self) -> str:
        scaling = f", scaling={self.scaling!r}" if self.scaling is not None else ""
        return f"IntFormat({self.bits}{scaling}, name={self.name!r})"
