"""`IntFormat`: symmetric integer codes with a scale per group, and their codec.

The class and its numbers need only numpy. The operations are computed in
its codec, `_int_codec`, which `Format`'s methods import on first use, so
building or looking up a format, as `import dtypes` does, loads no JAX;
`check` of a float16 or float32 numpy array is made here, without JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from ._argument_checks import (
    check_format_fields,
    check_scaling_field,
    refuse_non_finite,
    refuse_scaling,
    resolve_scaling,
)
from ._errors import FormatError
from ._format import Format
from ._scaling import PerTensor, Scaling

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
    _codec: ClassVar[str] = "_int_codec"

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
        check_format_fields(self, f"IntFormat({self.bits})")
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

    # -- operations: computed in `_int_codec` (see `Format`) ----------------
    def check(self, x: Any, *, scaling: Scaling | None = None) -> None:
        """Raise the error `encode(x, scaling=scaling)` would raise (see `Format.check`)."""
        if isinstance(x, np.ndarray) and x.dtype in (np.float16, np.float32):
            # the same checks, made without JAX (float64 goes to JAX, which may narrow it)
            resolved = resolve_scaling(self, scaling)
            assert resolved is not None  # an integer format always has a default scaling
            refuse_scaling(self, resolved, x.shape)
            refuse_non_finite(x, self)
            return
        super().check(x, scaling=scaling)

    def __repr__(self) -> str:
        scaling = f", scaling={self.scaling!r}" if self.scaling is not None else ""
        return f"IntFormat({self.bits}{scaling}, name={self.name!r})"
