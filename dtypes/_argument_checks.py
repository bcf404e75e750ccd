"""Argument checks that need no JAX: the scaling given, and NaN/inf in numpy values.

`_encode_input_checks` applies them to every encoder's input; a format's `check` applies
them alone to float numpy arrays, so a caller that only asks whether a
format takes a scaling (the command line, planning a conversion) loads no JAX.
A scale format's refusal of a scaling and of directed rounding is here too,
shared by its `nbytes` (no JAX) and its codec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._errors import NonFiniteError, PrecisionTypeError, RoundingError, ScalingError
from ._scaling import Scaling

if TYPE_CHECKING:
    from ._format import Format
    from ._int import IntFormat

__all__ = [
    "as_dtype",
    "check_format_fields",
    "check_scaling_field",
    "is_numeric",
    "refuse_non_finite",
    "refuse_scale_format_arguments",
    "refuse_scaling",
    "resolve_scaling",
]


def resolve_scaling(fmt: Format, scaling: Scaling | None) -> Scaling | None:
    """`scaling`, or the format's default for None; anything else but a `Scaling` is refused."""
    if scaling is None:
        return fmt.default_scaling()
    if not isinstance(scaling, Scaling):
        raise PrecisionTypeError(
            f"scaling must be PerTensor(), PerAxis(axis), PerBlock(size) or None for {fmt.name}, "
            f"got {type(scaling).__name__} {scaling!r:.60}; pass e.g. scaling=dtypes.PerTensor()"
        )
    return scaling


def as_dtype(dtype: Any, what: str) -> np.dtype[Any]:
    """`dtype` as a numpy dtype of numbers, or a `PrecisionTypeError` naming it."""
    dt: np.dtype[Any] | None
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        dt = None
    if dt is None or not is_numeric(dt) or isinstance(dtype, bool):
        raise PrecisionTypeError(
            f"{what} takes a numeric dtype such as np.float32 or ml_dtypes.bfloat16, got "
            f"{type(dtype).__name__} {dtype!r}"
        )
    assert dt is not None
    return dt


def is_numeric(dt: np.dtype[Any]) -> bool:
    """Whether `dt` holds numbers: numpy's integers and floats, or an ml_dtypes float."""
    return dt.kind in "iuf" or dt.name in _ML_FLOATS


_ML_FLOATS = frozenset(
    ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e3m4", "float8_e4m3fnuz",
     "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e8m0fnu", "float4_e2m1fn", "float6_e2m3fn",
     "float6_e3m2fn")
)  # fmt: skip


def check_scaling_field(fmt: object, scaling: object) -> None:
    """A format's own `scaling=` field: None or a `Scaling`, refused at construction
    (a string such as "pertensor" would otherwise fail only at the first encode)."""
    if scaling is not None and not isinstance(scaling, Scaling):
        raise PrecisionTypeError(
            f"{type(fmt).__name__}(scaling=...) takes a Scaling, got {type(scaling).__name__} "
            f"{scaling!r}; pass e.g. scaling=dtypes.PerTensor(), dtypes.PerAxis(0) or "
            "dtypes.PerBlock(32)"
        )


def check_format_fields(fmt: object, call: str, flags: tuple[str, ...] = ()) -> None:
    """A format's bool `flags` (`nan` may also be None) and its `name` (a str, or None
    for the derived one), refused at construction: a truthy string such as "no" would
    otherwise build the opposite format. `call` is the constructor call the fix shows."""
    for field in flags:
        value = getattr(fmt, field)
        if value is None and field == "nan":
            continue
        if not isinstance(value, bool | np.bool_):
            allowed = "True, False or None" if field == "nan" else "True or False"
            raise PrecisionTypeError(
                f"{field} must be {allowed}, got {type(value).__name__} {value!r:.60}; "
                f"pass {_call_with_argument(call, f'{field}=True')}"
            )
        object.__setattr__(fmt, field, bool(value))
    name = getattr(fmt, "name", None)
    if name is not None and not isinstance(name, str):
        example = _call_with_argument(call, "name=" + repr("mine"))
        raise PrecisionTypeError(
            f"{type(fmt).__name__}(name=...) takes a str (or None for the derived name), got "
            f"{type(name).__name__} {name!r:.60}; pass e.g. {example}"
        )


def _call_with_argument(call: str, argument: str) -> str:
    """`call` ("FloatFormat(4, 3)", "E8M0Format()") with one more argument."""
    return f"{call[:-1]}{'' if call.endswith('()') else ', '}{argument})"


def refuse_non_finite(values: np.ndarray, fmt: Format) -> None:
    """Raise `NonFiniteError` naming the count and the first NaN/inf of `values`, if any."""
    if np.isfinite(values).all():
        return
    bad = ~np.isfinite(np.asarray(values, np.float64))
    first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
    value = np.asarray(values, np.float64)[first] if bad.ndim else float(np.asarray(values))
    raise NonFiniteError(
        f"cannot encode {int(bad.sum())} non-finite value(s) into scaled {fmt.name}: the first "
        f"is {value} at index {first}. A scale computed over them would be NaN; replace them "
        "first (e.g. jnp.nan_to_num(x)) or encode into an unscaled float format"
    )


def refuse_scaling(fmt: IntFormat, scaling: Scaling, shape: tuple[int, ...]) -> None:
    """Raise `ScalingError` unless `fmt` takes `scaling` for values of `shape`."""
    if scaling.power_of_two and fmt.binary:
        rule = "int1 scales are mean(|x|) per group and have no power-of-two variant"
        raise ScalingError(
            f"{rule}; pass {type(scaling).__name__} without power_of_two=True", rule=rule
        )
    if scaling.scale_format not in ("float32", "bfloat16", "float16"):
        if fmt.binary:
            rule = (
                "int1 scales are mean(|x|) per group and cannot be stored as "
                f"{scaling.scale_format}"
            )
            raise ScalingError(
                f"{rule}; use scale_format='float32', 'bfloat16' or 'float16'", rule=rule
            )
        if scaling.scale_format == "float8_e4m3fn":
            rule = (
                "two-level float8_e4m3fn scales (the NVFP4 recipe) are for float elements, not "
                f"{fmt.name}"
            )
            raise ScalingError(
                f"{rule}; use scale_format='bfloat16' or 'float16' for integer groups", rule=rule
            )
    if shape:
        scaling.validate(shape)


def refuse_scale_format_arguments(fmt: Format, scaling: Scaling | None, rounding: str) -> None:
    """Raise unless a scale format (E8M0) is given no scaling and nearest rounding."""
    if scaling is not None:
        raise ScalingError(
            f"{fmt.name} is a scale format and takes no scaling of its own, got {scaling}; "
            "name it as a scaling's scale_format instead, e.g. "
            "PerBlock(32, power_of_two=True, scale_format='float8_e8m0fnu')",
            rule=f"{fmt.name} is a scale format: it takes no scaling of its own, and is named as "
            "the scale format of another format's scaling instead",
        )
    if rounding != "nearest_even":
        why = "its scales come from the OCP MX rule, which picks the power of two itself"
        raise RoundingError(
            f"{fmt.name} rounds only to nearest (rounding='nearest_even'), got {rounding!r}: {why}",
            rule=f"{fmt.name} rounds only to nearest even, got {rounding}: {why}",
        )
