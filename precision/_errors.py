"""The exception hierarchy: one base, each also the builtin users already catch.

`PrecisionError`, `PrecisionTypeError` and `FormatError` are the very classes
`dtypes` raises (defined in `dtypes`, with its `FormatTypeError`,
`RoundingError`, `ScalingError`, `ShapeError` and `NonFiniteError`), so one
`except precision.PrecisionError:` catches every error both packages raise on
purpose, and one `except precision.PrecisionTypeError:` every `TypeError`
among them. A class exists where a caller may want to catch it apart from the
rest (a rule of the Tensor, a file, a calibration, a feature's arguments); the
reason is in its docstring, and docs/api/errors.md lists them side by side.
"""

from __future__ import annotations

from dtypes import FormatError as FormatError
from dtypes import PrecisionError as PrecisionError
from dtypes import PrecisionTypeError as PrecisionTypeError

__all__ = [
    "CalibrationError",
    "CalibrationWarning",
    "CheckpointError",
    "DeviceMismatchError",
    "ExplainError",
    "FormatError",
    "KitError",
    "LossScaleError",
    "LossScaleTypeError",
    "PolicyError",
    "PrecisionError",
    "PrecisionFallbackError",
    "PrecisionFallbackWarning",
    "PrecisionMismatchError",
    "PrecisionTypeError",
    "SaveError",
    "SaveTypeError",
    "SelectionError",
    "SelectionWarning",
    "TensorIndexError",
    "UpdateError",
    "UsageError",
]

# -- the rules of a Tensor's operations


class PrecisionMismatchError(PrecisionTypeError):
    """An operation met tensors stored in two different formats.

    Nothing is converted implicitly: convert one operand with
    `to_reduced_precision(...)` or `to_full_precision()` first. Its own class
    because it is the rule most code meets first and fixes by a conversion,
    not by another argument; a `PrecisionTypeError` (a `TypeError`) like every
    refused mix.
    """


class DeviceMismatchError(PrecisionError, ValueError):
    """An operation met tensors on different devices; move one with `to_device`.

    Its own class because the fix is a placement, not a format or a value.
    """


class TensorIndexError(PrecisionError, IndexError):
    """A static integer index outside its dimension (JAX would clamp it silently).

    An `IndexError`, as numpy raises, so code that catches numpy's catches it.
    """


class PrecisionFallbackError(PrecisionError, RuntimeError):
    """`apply(..., strict=True)`: a declared quantized contraction would fall back.

    A `RuntimeError`: the arguments are valid, the program this backend would
    run is not the one declared.
    """


class PrecisionFallbackWarning(UserWarning):
    """A declared quantized contraction that cannot take its narrow path and runs in
    float32 instead (MX blocks, formats without a container XLA contracts), or a JAX
    primitive missing from precision's table of primitives, computed by the default
    rule. Warned once per call site (or primitive), naming the op, the file and line,
    and the reason; filter it by this class, or make a contraction's fallback an
    error with `apply(..., strict=True)`."""


# -- files


class CheckpointError(PrecisionError, ValueError):
    """A checkpoint file is truncated, corrupted, foreign or inconsistent.

    The message names the file and what is wrong with it. Raised before any
    wrong number could be returned; its own class so that a loader can tell a
    bad file from a bad argument.
    """


class SaveError(PrecisionError, ValueError):
    """A tree that cannot be written as asked: two leaves under one name, a name,
    shape or leaf count beyond the checkpoint limits, an encoding that breaks its
    format's invariants (so `load` would refuse the file), or a tensor or model
    file (config, tokenizer) that another tool's layout cannot hold (`precision
    convert --layout compressed-tensors` / `gguf`: the message names the tensor and
    the flags that would work). Nothing has been written when it is raised."""


class SaveTypeError(SaveError, PrecisionTypeError):
    """A leaf, key, format or flag that a checkpoint cannot hold: a `SaveError` and a
    `PrecisionTypeError` (a `TypeError`), so either `except` catches it."""


# -- calibration, explanation, training


class CalibrationError(PrecisionError, ValueError):
    """A calibration that cannot run as asked: no batches, batches `f` cannot take,
    a selection with no contraction to calibrate, non-finite activations. The
    message names the parameter (layer) or batch concerned and the fix; its own
    class because the fix is often in the model or the batches, not the call."""


class CalibrationWarning(UserWarning):
    """`calibrate` left a weight in float: `f` contracts it in a way calibration does not
    record (named with the reason), and the default selection met it."""


class ExplainError(PrecisionError, ValueError):
    """`precision.explain` was asked for something it cannot give (a reference that does
    not match the program, a flag of the wrong type); its own class so that a report
    that fails can be told from the program it reports on failing."""


class LossScaleError(PrecisionError, ValueError):
    """A loss scale or setting it cannot work with: not finite, not positive, a
    negative counter, or a flag or predicate that is not one value; its own class
    because it is raised inside a training step, apart from the model's errors."""


class LossScaleTypeError(LossScaleError, PrecisionTypeError):
    """A loss-scaling helper given the wrong kind of value: a Tensor leaf where
    plain arrays are needed, a float or an integer (a count of finite values)
    where a boolean flag is needed, two trees whose leaves differ in dtype. A
    `LossScaleError` and a `PrecisionTypeError` (a `TypeError`)."""


class UpdateError(PrecisionError, ValueError):
    """An optimizer update that does not fit its parameter (shape or dtype); its own
    class because it is raised inside a training step, where the fix is the
    optimizer's state, not the model."""


# -- declarations and selections


class PolicyError(PrecisionError, ValueError):
    """A policy string or declaration that cannot be read (what was expected, where);
    its own class because a policy is often read from a configuration file, apart
    from the code that uses it."""


class SelectionError(PrecisionError, ValueError):
    """A `where=` / `exclude=` leaf selection that is not a valid regular expression;
    its own class because the pattern, not the tree, is what to change."""


class SelectionWarning(UserWarning):
    """A `where=` / `exclude=` selection that matched none of a tree's floating leaves
    (or excluded none of them); the message lists the paths it could have matched.
    A warning, not an error: an empty selection is valid, but seldom what was meant."""


# -- the testing kit


class KitError(PrecisionError, ValueError):
    """A testing-kit (`precision.testing`) argument that describes no data or no check:
    strategy bounds that hold no value, an unknown kind, no format in a bit range, a
    negative count, arrays whose shapes do not broadcast, a tolerance or scale that
    would pass every comparison (NaN, negative, zero where a step is needed), a
    `@pytest.mark.formats(...)` marker that selects no format. Not exported: tests
    meet it as the `ValueError` it is; its own class only to say where it came from."""


# -- the command line


class UsageError(PrecisionError, ValueError):
    """Command-line flags that cannot go together, or that name nothing the command can
    use (`--to` a format wider than float32, `--preset` with `--to`). The command
    line reports it as one line with exit status 2, as it does argparse's own usage
    errors, and every other refusal with status 1: that status is why it is a class
    of its own. Not exported: only the command line raises it."""
