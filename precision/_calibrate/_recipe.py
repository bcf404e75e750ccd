"""What `calibrate` makes of each selected weight, checked: the method, the format and
scaling it writes (their defaults filled in), and the methods' own settings.

Every refusal of a bad option is a `CalibrationError` naming the option, what it got and
what it takes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import dtypes

from .._checkpoint import _q4_0
from .._context import resolve_format
from .._errors import CalibrationError

__all__ = [
    "FOLDING",
    "GPTQ_METHODS",
    "METHODS",
    "Recipe",
    "check_budget",
    "check_flags",
    "check_sequential",
    "recipe_of",
]

METHODS = ("gptq", "awq", "awq+gptq", "smoothquant", "rtn")
"""The calibration methods `calibrate` runs: GPTQ, AWQ, AWQ's scales with GPTQ's
rounding, SmoothQuant, and round-to-nearest (what `to_reduced_precision` does,
through the same selection, for comparison)."""

FOLDING = ("awq", "awq+gptq", "smoothquant")  # the methods that fold scales
GPTQ_METHODS = ("gptq", "awq+gptq")  # the methods that round with GPTQ


def _check_method(method: Any, fmt: dtypes.Format) -> None:
    if method not in METHODS:
        raise CalibrationError(
            f"calibrate: method={method!r} is not one of {', '.join(map(repr, METHODS))}"
        )
    symmetric = isinstance(fmt, dtypes.IntFormat) and not fmt.binary
    if not (symmetric or isinstance(fmt, dtypes.AsymmetricIntFormat)):
        raise CalibrationError(
            f"calibrate: {fmt.name} is not an integer format calibration writes: choose "
            'int8, int4, int2, or uint8, uint4 with zero points (e.g. format="int4")'
        )


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What `calibrate` makes of each selected weight: the method, the format and scaling
    it writes, and the method's own settings (checked)."""

    method: str
    fmt: dtypes.Format
    scaling: dtypes.Scaling
    opts: dict[str, Any]  # GPTQ's damp, block and act_order
    alpha: float  # SmoothQuant's migration strength
    grid: int  # AWQ's number of exponents tried
    clip: int  # the clipping ratios GPTQ and AWQ search (0: none)


def recipe_of(
    method: Any,
    format: str | dtypes.Format | None,
    scaling: Any,
    damp: Any,
    block_size: Any,
    act_order: Any,
    alpha: Any,
    grid: Any,
    clip: bool,
) -> Recipe:
    """`calibrate`'s method, format, scaling and numeric options, checked."""
    fmt, scaling = _format_and_scaling(method, format, scaling)
    _check_numbers(damp, block_size, grid, alpha)
    opts = {"damp": float(damp), "block": block_size, "act_order": bool(act_order)}
    return Recipe(method, fmt, scaling, opts, float(alpha), grid, grid if clip else 0)


def _q4_0_scaling(method: Any, scaling: Any) -> tuple[dtypes.Format, dtypes.Scaling]:
    """ggml's Q4_0 grid (`_q4_0`): its one scaling, for the weight-only methods."""
    _check_method(method, _q4_0.FORMAT)
    if method == "smoothquant":
        raise CalibrationError(
            "calibrate: format='q4_0' is a weight format for gptq, awq, awq+gptq or rtn; "
            "SmoothQuant "
            "prepares int8 activations: use format='int8'"
        )
    if scaling is not None and scaling != _q4_0.SCALING:
        raise CalibrationError(
            f"calibrate: format='q4_0' has one scaling, blocks of 32 with float16 scales "
            f"(dtypes.PerBlock(32, scale_format='float16')); got {scaling!r}"
        )
    return _q4_0.FORMAT, _q4_0.SCALING


def _format_and_scaling(
    method: Any, format: str | dtypes.Format | None, scaling: Any
) -> tuple[dtypes.Format, dtypes.Scaling]:
    """The format and scaling `calibrate` writes (its defaults filled in), checked with
    the method."""
    smooth = method == "smoothquant"
    if isinstance(format, str) and format.lower() == _q4_0.NAME:
        return _q4_0_scaling(method, scaling)
    fmt = resolve_format(("int8" if smooth else "int4") if format is None else format)
    _check_method(method, fmt)
    if scaling is None:
        scaling = dtypes.PerAxis() if smooth else dtypes.PerBlock(128)
    if not isinstance(scaling, dtypes.PerBlock | dtypes.PerAxis | dtypes.PerTensor):
        raise CalibrationError(
            f"calibrate: scaling must be dtypes.PerBlock(n), PerAxis() or PerTensor(), "
            f"got {scaling!r}"
        )
    return fmt, scaling


def _check_numbers(damp: Any, block_size: Any, grid: Any, alpha: Any) -> None:
    """Refuse a numeric option of `calibrate` outside its range (a bool is no number)."""
    number = lambda v: isinstance(v, int | float) and not isinstance(v, bool)
    if not (number(damp) and 0 <= damp < 1e6 and np.isfinite(damp)):
        raise CalibrationError(f"calibrate: damp must be a finite number ≥ 0, got {damp!r}")
    for name, n in (("block_size", block_size), ("grid", grid)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise CalibrationError(f"calibrate: {name} must be a positive int, got {n!r}")
    if not (number(alpha) and 0 <= alpha <= 1):
        raise CalibrationError(f"calibrate: alpha must be within [0, 1], got {alpha!r}")


def check_flags(**flags: Any) -> None:
    """Refuse a yes/no option of `calibrate` that is not a bool (`"no"` is truthy)."""
    for name, value in flags.items():
        if not isinstance(value, bool | np.bool_) and not (name == "progress" and value is None):
            raise CalibrationError(
                f"calibrate: {name} must be True or False, got {type(value).__name__} "
                f"{value!r:.60}; pass {name}=True or {name}=False"
            )


def check_sequential(sequential: bool, method: str) -> None:
    if sequential and method != "gptq":
        raise CalibrationError(
            f"calibrate: sequential=True is GPTQ's (each layer compensates the rounding "
            f"before it), not {method}'s: use method='gptq', or sequential=False"
        )


def check_budget(stats_memory: Any) -> int:
    if isinstance(stats_memory, bool) or not isinstance(stats_memory, int) or stats_memory < 1:
        raise CalibrationError(
            f"calibrate: stats_memory must be a positive number of bytes, got {stats_memory!r}"
        )
    return stats_memory
