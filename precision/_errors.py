"""The exception hierarchy: one base, each also the builtin users already catch.

`PrecisionError` and `FormatError` are the very classes `dtypes` raises
(defined in `dtypes`, with its `RoundingError`, `ScalingError`,
`ShapeError`, `NonFiniteError` and `PrecisionTypeError`), so one
`except precision.PrecisionError:` catches every error both packages raise
on purpose.
"""

from __future__ import annotations

from dtypes import FormatError as FormatError
from dtypes import PrecisionError as PrecisionError

__all__ = [
    "CalibrationError",
    "CalibrationWarning",
    "CheckpointError",
    "DeviceMismatchError",
    "ExplainError",
    "FormatError",
    "KitError",
    "LayoutError",
    "LossScaleError",
    "LossScaleTypeError",
    "PolicyError",
    "PrecisionError",
    "PrecisionFallbackError",
    "PrecisionFallbackWarning",
    "PrecisionMismatchError",
    "SaveError",
    "SaveTypeError",
    "SelectionError",
    "SelectionWarning",
    "TensorIndexError",
    "ToleranceError",
    "UpdateError",
]


class PrecisionMismatchError(PrecisionError, TypeError):
    """An operation met tensors stored in two different formats.

    Nothing is converted implicitly: convert one operand with
    `to_reduced_precision(...)` or `to_full_precision()` first.
    """


class DeviceMismatchError(PrecisionError, ValueError):
    """An operation met tensors on different devices; move one with `to_device`."""


class CheckpointError(PrecisionError, ValueError):
    """A checkpoint file is truncated, corrupted, foreign or inconsistent.

    The message names the file and what is wrong with it. Raised before any
    wrong number could be returned.
    """


class LayoutError(PrecisionError, ValueError):
    """A tensor that another tool's checkpoint layout (compressed-tensors, GGUF) cannot
    hold as it is: the message names the tensor, its format and scaling, what the
    layout holds instead, and the `--to` / `--scaling` (or `--keep`) that would work."""


class CalibrationError(PrecisionError, ValueError):
    """A calibration that cannot run as asked: no batches, batches `f` cannot take,
    a selection with no contraction to calibrate, non-finite activations. The
    message names the parameter (layer) or batch concerned and the fix."""


class CalibrationWarning(UserWarning):
    """`calibrate` left a weight in float: `f` contracts it in a way calibration does not
    record (named with the reason), and the default selection met it."""


class LossScaleError(PrecisionError, ValueError):
    """A loss scale or setting it cannot work with: not finite, not positive, a
    negative counter, or a flag or predicate that is not one value."""


class LossScaleTypeError(PrecisionError, TypeError):
    """A loss-scaling helper given the wrong kind of value: a Tensor leaf where
    plain arrays are needed, a float or an integer (a count of finite values)
    where a boolean flag is needed, two trees whose leaves differ in dtype."""


class SaveError(PrecisionError, ValueError):
    """A tree that cannot be saved as it is: two leaves under one name, a name,
    shape or leaf count beyond the checkpoint limits, or an encoding that breaks
    its format's invariants (so `load` would refuse the file)."""


class SaveTypeError(PrecisionError, TypeError):
    """A leaf, key or format that a checkpoint cannot hold."""


class UpdateError(PrecisionError, ValueError):
    """An optimizer update that does not fit its parameter (shape or dtype)."""


class PolicyError(PrecisionError, ValueError):
    """A policy string or declaration that cannot be read (what was expected, where)."""


class SelectionError(PrecisionError, ValueError):
    """A `where=` / `exclude=` leaf selection that is not a valid regular expression."""


class ToleranceError(PrecisionError, ValueError):
    """A tolerance or scale given to an assertion or metric that cannot mean anything
    (NaN, negative, zero where a step is needed): it would pass every comparison."""


class KitError(PrecisionError, ValueError):
    """A testing-kit (`precision.testing`) argument that describes no data or no check: strategy
    bounds that hold no value, an unknown kind, no format in a bit range, a
    negative count, arrays whose shapes do not broadcast."""


class PrecisionFallbackWarning(UserWarning):
    """A declared quantized contraction that cannot take its narrow path and runs in
    float32 instead (MX blocks, formats without a container XLA contracts). Warned
    once per call site, naming the op, the file and line, and the reason."""


class PrecisionFallbackError(PrecisionError, RuntimeError):
    """`apply(..., strict=True)`: a declared quantized contraction would fall back."""


class SelectionWarning(UserWarning):
    """A `where=` / `exclude=` selection that matched none of a tree's floating leaves."""


class TensorIndexError(PrecisionError, IndexError):
    """A static integer index outside its dimension (JAX would clamp it silently)."""


class ExplainError(PrecisionError, ValueError):
    """`precision.explain` was asked for something it cannot give (a reference that does
    not match the program, a flag of the wrong type)."""
