"""Declared quantized contractions that cannot take their narrow path: said, never silent.

A `Contract` declares that contractions run on narrow operands. Where one
cannot (MX blocks, whose scales vary along the sum; a format that XLA has no
dot for), `_quantized` still quantizes both operands as declared and
contracts the quantized values in float32: the numbers the declaration asks
for, without its speed. That is reported here, once per call site: a
`PrecisionFallbackWarning` naming the op, the user's file and line and the
reason, or, under `apply(..., strict=True)`, a `PrecisionFallbackError`.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from jax.extend import source_info_util

from .._errors import PrecisionFallbackError, PrecisionFallbackWarning
from ._explain_notes import mark_fallback
from ._state import Context

__all__ = ["fall_back"]

# The warnings already given, keyed as `warnings` keys them (text, category, line):
# a retrace of the same call site (a new shape, a new jit) says nothing new.
_SAID: dict[Any, Any] = {}


def fall_back(eqn: Any, ctx: Context, reason: str) -> None:
    """Report that `eqn`, declared quantized by `ctx.contract`, runs in float32."""
    mark_fallback(reason)
    where = source_info_util.summarize(eqn.source_info)
    message = f"`{eqn.primitive.name}` at {where}: declared {ctx.contract.describe()}, but {reason}"
    emulated = "in float32 on the quantized values (the declared rounding, not its speed)"
    if ctx.strict:
        raise PrecisionFallbackError(
            f"{message}, so it would run {emulated}. Declare a contraction with a narrow "
            'path (int8, or float8_e4m3fn / float8_e5m2 with scaling="tensorwise" or '
            '"rowwise"), or drop strict=True to accept the emulation'
        )
    found = re.match(r"(.+?):(\d+)(?::\d+)? \(", where)
    filename, line = (found.group(1), int(found.group(2))) if found else ("<unknown>", 0)
    message = f"{message}; it runs {emulated}"
    warnings.warn_explicit(message, PrecisionFallbackWarning, filename, line, registry=_SAID)
