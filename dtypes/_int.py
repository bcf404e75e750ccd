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
    is_numeric,
    refuse_non_finite,
    refuse_scaling,
    resolve_scaling,
)
from ._errors import FormatError, PrecisionTypeError, ShapeError
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

    # -- the absmax rule in numpy, on the host ---------------------------------
    # The same float32 operations as the compiled encode, for a caller that converts
    # whole checkpoints in numpy without JAX (the command line): `host_rule` says
    # when an encode is this rule, `host_absmax` for which absmaxes, and
    # `host_codes` and `host_scales` compute it. tests/dtypes/test_int_host.py holds
    # them to `encode` bit for bit.

    #: Group absmaxes (besides 0) for which `host_codes` gives `encode`'s codes: inside
    #: it the scale rule takes none of its special paths (flushed, subnormal,
    #: near-overflow or prescaled scales), and a product `x * (qmax / absmax)` that
    #: numpy keeps subnormal where XLA:CPU flushes it lies below 2**-19, which rounds
    #: to 0 either way.
    HOST_ABSMAX: ClassVar[tuple[float, float]] = (2.0**-100, 2.0**100)

    def host_rule(self, scaling: Scaling | None, rounding: str) -> bool:
        """Whether `encode(x, scaling=scaling, rounding=rounding)` is the plain rule
        `host_codes` computes: `scale = absmax / qmax`, codes `clip(rint(x * (qmax /
        absmax)), -qmax, qmax)`; not for int1's mean scales, power-of-two or narrow
        scales, or another rounding mode.

        Raises:
            PrecisionTypeError: `scaling` is neither a `Scaling` nor None (the
                format's default).

        Examples:
            >>> from dtypes import PerAxis, int8
            >>> int8.host_rule(PerAxis(0), "nearest_even"), int8.host_rule(PerAxis(0), "up")
            (True, False)
        """
        resolved = resolve_scaling(self, scaling)
        assert resolved is not None  # an integer format always has a default scaling
        return (
            not self.binary
            and not resolved.power_of_two
            and resolved.scale_format == "float32"
            and rounding == "nearest_even"
        )

    def host_absmax(self, absmax: Any) -> bool:
        """Whether every group absmax in `absmax` (numbers) is 0 or in `HOST_ABSMAX`,
        not NaN or inf: the groups whose codes and scales `host_codes` and
        `host_scales` give."""
        low, high = self.HOST_ABSMAX
        m = _host_array(absmax, "absmax", f"{self.name}.host_absmax")
        return bool(np.all((m == 0) | ((m >= low) & (m <= high))))

    def host_codes(self, x: Any, absmax: Any, out: np.ndarray | None = None) -> np.ndarray:
        """The codes `encode` gives float32 values `x`, as float32 (in `out` if given).

        `absmax` is each group's absmax broadcast against `x` (one number for the
        tensor, or a column of rows), each accepted by `host_absmax`, under a
        scaling and rounding that `host_rule` accepts. The reciprocal is taken
        once per group, as the compiled encode takes it; a zero group's codes are 0.
        A code 0 keeps the sign of its value (-0.0), which converting the codes to
        integers drops.

        Raises:
            PrecisionTypeError: `x` or `absmax` is not numbers, or `out` is not a
                float32 numpy array.
            ShapeError: `absmax` does not broadcast against `x`, or `out` is not
                shaped like their product.

        Examples:
            >>> import numpy as np
            >>> from dtypes import int8
            >>> int8.host_codes(np.float32([0.5, -1.0, 0.25]), np.float32(1.0))
            array([  64., -127.,   32.], dtype=float32)
        """
        values = _host_array(x, "x", f"{self.name}.host_codes")
        m = _host_array(absmax, "absmax", f"{self.name}.host_codes")
        _check_out(values, m, out)
        qmax = np.float32(self.qmax)
        inv = np.divide(qmax, m, out=np.zeros_like(m), where=m != 0)  # correctly rounded
        y: np.ndarray = np.multiply(values, inv, out=out) if out is not None else values * inv
        np.rint(y, out=y)  # halves to even
        np.clip(y, -qmax, qmax, out=y)
        return y

    def host_scales(self, absmax: Any) -> np.ndarray:
        """The float32 scales `encode` keeps for group absmaxes `absmax` (accepted by
        `host_absmax`): `absmax / qmax` correctly rounded, 1 for a zero group."""
        m = _host_array(absmax, "absmax", f"{self.name}.host_scales")
        scale: np.ndarray = np.divide(m, np.float32(self.qmax), out=np.ones_like(m), where=m != 0)
        return scale


def _host_array(value: Any, name: str, where: str) -> np.ndarray:
    """`value` as a float32 numpy array (not copied when it is one), or a
    `PrecisionTypeError` naming it: the host rule reads numbers, in numpy."""
    arr = value if isinstance(value, np.ndarray) else None
    if arr is None and isinstance(value, float | int | np.generic) and not isinstance(value, bool):
        arr = np.asarray(value)  # a number, or a numpy or ml_dtypes scalar
    if arr is None or not is_numeric(arr.dtype):
        got = f"{type(value).__name__} {value!r:.60}" if arr is None else f"dtype {arr.dtype}"
        raise PrecisionTypeError(
            f"{where} takes `{name}` as a numpy array of numbers, got {got}; pass "
            "e.g. np.float32 values (the compiled encode takes any array)"
        )
    return arr if arr.dtype == np.float32 else arr.astype(np.float32)


def _check_out(x: np.ndarray, absmax: np.ndarray, out: np.ndarray | None) -> None:
    """Raise unless `absmax` broadcasts against `x` and `out` is None or a float32
    array of the codes' shape."""
    try:
        shape = np.broadcast_shapes(x.shape, absmax.shape)
    except ValueError:
        raise ShapeError(
            f"IntFormat.host_codes: absmax of shape {absmax.shape} does not broadcast against "
            f"values of shape {x.shape}; give one absmax, or one per group (keepdims)"
        ) from None
    if out is not None and (
        not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != shape
    ):
        got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise PrecisionTypeError(
            f"IntFormat.host_codes writes into `out`, a float32 numpy array of shape {shape}, "
            f"got {got}; pass out=None for a new array"
        )
