"""How `precision convert` converts each planned tensor: its mode.

What each tensor becomes is decided by the command (`_convert_command._plan`); how
it is converted, its mode, by `_mode` here. The conversion itself
(`_convert_engine`) never holds more than one tensor's input, and usually
only one block of it:

* **flat** — unscaled formats and per-block scaling along the last axis
  encode each value from itself or its block alone, so the tensor's values
  are encoded in fixed-size blocks of its flat order (the last one padded),
  one compiled program for every tensor;
* **two passes** — per-tensor scaling needs the absmax first: one pass reads
  it (exact: a maximum), the second encodes each block with that absmax
  appended as an extra value, which gives every value the scale of the
  whole tensor, so the codes are those of the whole-tensor encode;
* **two-level** — NVFP4's e4m3 block scales hang on the tensor's absmax:
  one pass reads it, the second encodes each block with one more scaling
  block holding it, which gives every block the whole tensor's float32
  tensor scale;
* **rows** — per-axis scaling along the first axis, or blocks down it (`PerBlock` on
  axis 0 of a matrix, a Conv1D weight's default): blocks of whole rows (of whole
  scale blocks);
* **introws** — int8 with one float32 scale per row (`PerAxis(0)`, the
  default), nearest even: numpy blocks of whole rows, each row's absmax
  read in its block, its codes `dtypes`' own rule on the host
  (`IntFormat.host_codes`), nothing compiled; a block holding a row whose
  absmax that rule does not take (`IntFormat.host_absmax`) is encoded as in
  the rows mode;
* **columns** — per-axis scaling along another axis: one pass for every
  group's absmax, then row blocks encoded with one more row holding them;
* **intcols** — int8 with one float32 scale per column of a matrix (`PerAxis(1)`, the
  default of a Conv1D weight, stored inputs x outputs), nearest even: the columns'
  absmax pass, then numpy blocks of rows (`IntFormat.host_codes`), nothing compiled;
  absmaxes the host rule does not take are the columns mode's;
* **cast** — unscaled nearest-even conversion into a format with an
  ml_dtypes type: a numpy cast in blocks, nothing compiled;
* **intcast** — int8 with one float32 scale for the tensor, nearest even:
  the absmax pass, then numpy blocks (`IntFormat.host_codes`), nothing
  compiled; an absmax the host rule does not take takes the two passes above;
* **q4_0** — int4 written as GGUF's Q4_0 (`--layout gguf`): ggml's own rounding onto
  Q4_0's full grid (`_checkpoint._q4_0`), in numpy blocks of whole rows (32 rows at a
  time where the blocks run down the columns), nothing compiled;
* **whole** — everything else (stochastic rounding, int1's mean scales,
  asymmetric integers' min/max scales over more than a block or a row,
  inputs stored in a precision format): the tensor is encoded at once, its
  statistics taken in row slices. `--dry-run` says which mode each tensor
  takes, and why when whole.

Every path gives the bytes the library's own `Format.encode` gives for the
whole tensor (tests/precision/test_cli.py checks each).
"""

from __future__ import annotations

import dataclasses

import numpy as np

import dtypes

from .._checkpoint import _q4_0
from .._checkpoint._layout import Leaf
from .._checkpoint._reader import Reader

_BLOCK = 1 << 20  # values per block of a streamed conversion (4 MiB of float32)

#: The modes that run in numpy: a conversion of nothing else imports no JAX.
_NUMPY_MODES = ("cast", "intcast", "introws", "intcols", "q4_0")

# Input containers whose float32 value is their logical value (an exact cast).
_RAW_FLOATS = {np.dtype(t) for t in ("float32", "float16", "bfloat16")} | {
    np.dtype(dtypes.float8_e4m3fn.container),
    np.dtype(dtypes.float8_e5m2.container),
}


# --------------------------------------------------------------------------
# the plan of one tensor, and how it is converted


@dataclasses.dataclass
class _Plan:
    reader: Reader
    leaf: Leaf  # as stored in the input
    out: Leaf  # as written to the output
    reason: str | None  # why it is copied unchanged, or None when converted
    mode: str = "copy"  # copy or a mode of the module docstring
    note: str = ""  # why the tensor is encoded whole


def _raw(leaf: Leaf, foreign: bool) -> bool:
    """Whether the stored data of `leaf`, cast to float32, is its logical value."""
    if leaf.scale is not None or leaf.data_dtype not in _RAW_FLOATS:
        return False
    if leaf.kind == "array" or foreign:
        return True
    fmt = leaf.format
    return isinstance(fmt, dtypes.FloatFormat) and fmt.native_dtype == leaf.data_dtype


def _per_byte_ok(fmt: dtypes.Format, last: int) -> bool:
    """Whether rows of `last` values pack without padding (so flat order packs the same)."""
    return not fmt.packed or (last * fmt.code_bits) % 8 == 0


def _castable(fmt: dtypes.Format, scaling: dtypes.Scaling | None, rounding: str) -> bool:
    """Whether encoding is a plain numpy cast into the format's ml_dtypes type.

    The library encodes unscaled nearest-even values into a format with a
    native type as XLA's convert, which matches ml_dtypes bit for bit (the
    tests compare every path with `Format.encode`); numpy does it without
    compiling anything.
    """
    native = getattr(fmt, "native_dtype", None)
    return (
        scaling is None
        and rounding == "nearest_even"
        and native is not None
        and not getattr(fmt, "saturate", False)
        and np.dtype(native) == np.dtype(fmt.container)
    )


def _numpy_int(fmt: dtypes.Format, scaling: dtypes.Scaling, rounding: str) -> bool:
    """Whether an integer encode with one scale per tensor, row or column may run in numpy
    (`_Converter._int_blocks`, `_Converter._int_row_blocks`): int8, whose codes are
    written as they are, under a scaling and rounding for which `dtypes` computes
    its rule on the host (`IntFormat.host_rule`, `host_codes`)."""
    return isinstance(fmt, dtypes.IntFormat) and fmt.bits == 8 and fmt.host_rule(scaling, rounding)


def _mode(plan: _Plan, rounding: str) -> tuple[str, str]:
    """How a tensor is converted (a mode of the module docstring), and why when whole."""
    leaf, out = plan.leaf, plan.out
    fmt, scaling, shape = out.format, out.scaling, out.shape
    assert fmt is not None
    if _q4_0.is_q4_0(fmt):
        return "q4_0", ""
    if not _raw(leaf, plan.reader.foreign):
        return "whole", "stored encoded: decoded whole"
    if rounding == "stochastic":
        return "whole", "stochastic rounding"
    if fmt.kind == "scale":
        return "whole", "a scale format: every value is checked first"
    if not shape:
        return "whole", "a scalar"
    if _castable(fmt, scaling, rounding):
        return "cast", ""
    if 0 in shape:
        return "whole", "empty"
    binary = getattr(fmt, "binary", False)
    last = shape[-1]
    packed_rows = "rows end inside a packed byte"
    if scaling is None:
        return ("flat", "") if _per_byte_ok(fmt, last) else ("whole", packed_rows)
    if binary:
        # int1's scale is a mean: its summation order must stay the library's
        return "whole", "int1 mean scales"
    # Asymmetric integers scale from each group's minimum and maximum, not its
    # absmax: only modes where every block holds whole groups apply.
    ranged = fmt.kind == "uint"
    ndim = len(shape)
    if isinstance(scaling, dtypes.PerTensor):
        if ranged:
            return "whole", "one min/max scale for the tensor"
        if _numpy_int(fmt, scaling, rounding):
            return "intcast", ""
        return ("twopass", "") if _per_byte_ok(fmt, last) else ("whole", packed_rows)
    if isinstance(scaling, dtypes.PerBlock) and scaling.axis % ndim == ndim - 1:
        size = int(scaling.size)
        if last % size == 0 and _per_byte_ok(fmt, size) and size <= _BLOCK:
            # two-level scales hang on the whole tensor's absmax: read first,
            # given to each block as one more group holding it
            return ("twolevel" if scaling.two_level else "flat"), ""
        return "whole", "blocks do not tile the rows"
    if scaling.two_level:
        return "whole", "two-level scales across the tensor"
    if isinstance(scaling, dtypes.PerBlock) and ndim == 2 and scaling.axis % ndim == 0:
        size = int(scaling.size)
        if shape[0] % size == 0 and _per_byte_ok(fmt, last) and size * last <= _BLOCK:
            return "rows", ""
    if isinstance(scaling, dtypes.PerAxis) and len(scaling.axes) > 1:
        return "whole", "scales along several axes"
    if isinstance(scaling, dtypes.PerAxis) and scaling.kept(ndim) == (0,) and ndim >= 2:
        return ("introws" if _numpy_int(fmt, scaling, rounding) else "rows"), ""
    if isinstance(scaling, dtypes.PerAxis) and ndim >= 2 and not ranged:
        return ("intcols" if ndim == 2 and _numpy_int(fmt, scaling, rounding) else "columns"), ""
    return "whole", "groups across rows"


#: What --dry-run says of each mode.
_HOW = {
    "cast": "streamed (numpy cast)",
    "q4_0": "streamed by rows (ggml's Q4_0 rounding, numpy)",
    "flat": "streamed in blocks",
    "twopass": "absmax pass, then blocks",
    "intcast": "absmax pass, then numpy blocks",
    "twolevel": "absmax pass, then blocks",
    "rows": "streamed by rows",
    "introws": "numpy blocks of rows",
    "columns": "group absmax pass, then rows",
    "intcols": "column absmax pass, then numpy blocks of rows",
    "whole": "whole tensor",
}
