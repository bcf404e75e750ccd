"""Precision-aware tensors for JAX: logical values over reduced-precision storage."""

# Names load on first use (the pattern of `precision.testing`): `import precision`
# imports neither JAX nor numpy, so `precision --help` answers at once and an
# interrupt during start-up is the command line's to report. Static tools and
# the docs read the names from the TYPE_CHECKING block.
from __future__ import annotations

import importlib

# `typing` is not imported at run time: under `python -m precision` this file runs
# before the entry point records Ctrl-C, so it imports only what the interpreter
# has loaded already (annotations are strings: `from __future__ import annotations`).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._apply import apply as apply
    from ._calibrate import calibrate as calibrate
    from ._checkpoint import load as load
    from ._checkpoint import save as save
    from ._context import FormatLike as FormatLike
    from ._context import default_format as default_format
    from ._context import get_default_format as get_default_format
    from ._contract import Contract as Contract
    from ._contract import ContractLike as ContractLike
    from ._errors import CalibrationError as CalibrationError
    from ._errors import CalibrationWarning as CalibrationWarning
    from ._errors import CheckpointError as CheckpointError
    from ._errors import DeviceMismatchError as DeviceMismatchError
    from ._errors import ExplainError as ExplainError
    from ._errors import FormatError as FormatError
    from ._errors import LossScaleError as LossScaleError
    from ._errors import LossScaleTypeError as LossScaleTypeError
    from ._errors import PolicyError as PolicyError
    from ._errors import PrecisionError as PrecisionError
    from ._errors import PrecisionFallbackError as PrecisionFallbackError
    from ._errors import PrecisionFallbackWarning as PrecisionFallbackWarning
    from ._errors import PrecisionMismatchError as PrecisionMismatchError
    from ._errors import PrecisionTypeError as PrecisionTypeError
    from ._errors import SaveError as SaveError
    from ._errors import SaveTypeError as SaveTypeError
    from ._errors import SelectionError as SelectionError
    from ._errors import SelectionWarning as SelectionWarning
    from ._errors import UpdateError as UpdateError
    from ._explain import Explanation as Explanation
    from ._explain import explain as explain
    from ._kept_in_float32 import KEEP as KEEP
    from ._loss_scale import DynamicLossScale as DynamicLossScale
    from ._loss_scale import NoOpLossScale as NoOpLossScale
    from ._loss_scale import StaticLossScale as StaticLossScale
    from ._loss_scale import all_finite as all_finite
    from ._loss_scale import select_tree as select_tree
    from ._placement import device_put as device_put
    from ._placement import storage_shardings as storage_shardings
    from ._policy import DEFAULT_FLOAT32_OPS as DEFAULT_FLOAT32_OPS
    from ._policy import Policy as Policy
    from ._policy import PolicyLike as PolicyLike
    from ._stacks import scales_per_layer as scales_per_layer
    from ._tensor import Tensor as Tensor
    from ._tree import is_reduced_precision as is_reduced_precision
    from ._tree import quantize as quantize
    from ._tree import to_full_precision as to_full_precision
    from ._tree import to_reduced_precision as to_reduced_precision
    from ._tree import tree_nbytes as tree_nbytes
    from ._updates import apply_updates as apply_updates
    from ._version import __version__ as __version__

_HOME = {
    "__version__": "_version",
    "apply": "_apply",
    "calibrate": "_calibrate",
    "explain": "_explain",
    "Explanation": "_explain",
    "load": "_checkpoint",
    "save": "_checkpoint",
    "default_format": "_context",
    "get_default_format": "_context",
    "FormatLike": "_context",
    "Contract": "_contract",
    "ContractLike": "_contract",
    "CalibrationError": "_errors",
    "CalibrationWarning": "_errors",
    "CheckpointError": "_errors",
    "DeviceMismatchError": "_errors",
    "ExplainError": "_errors",
    "FormatError": "_errors",
    "LossScaleError": "_errors",
    "LossScaleTypeError": "_errors",
    "PolicyError": "_errors",
    "PrecisionError": "_errors",
    "PrecisionFallbackError": "_errors",
    "PrecisionFallbackWarning": "_errors",
    "PrecisionMismatchError": "_errors",
    "PrecisionTypeError": "_errors",
    "SaveError": "_errors",
    "SaveTypeError": "_errors",
    "SelectionError": "_errors",
    "SelectionWarning": "_errors",
    "UpdateError": "_errors",
    "DynamicLossScale": "_loss_scale",
    "NoOpLossScale": "_loss_scale",
    "StaticLossScale": "_loss_scale",
    "all_finite": "_loss_scale",
    "select_tree": "_loss_scale",
    "DEFAULT_FLOAT32_OPS": "_policy",
    "Policy": "_policy",
    "PolicyLike": "_policy",
    "Tensor": "_tensor",
    "scales_per_layer": "_stacks",
    "device_put": "_placement",
    "storage_shardings": "_placement",
    "KEEP": "_kept_in_float32",
    "is_reduced_precision": "_tree",
    "quantize": "_tree",
    "to_full_precision": "_tree",
    "to_reduced_precision": "_tree",
    "tree_nbytes": "_tree",
    "apply_updates": "_updates",
}

# Homes whose names load no JAX when handed out (`load` and `save` import it when called,
# and attach the operators to the Tensors they make themselves: `_checkpoint._leaves`).
_PLAIN = frozenset(
    {"_checkpoint", "_context", "_contract", "_errors", "_kept_in_float32", "_version"}
)

__all__ = [
    "DEFAULT_FLOAT32_OPS",
    "KEEP",
    "CalibrationError",
    "CalibrationWarning",
    "CheckpointError",
    "Contract",
    "ContractLike",
    "DeviceMismatchError",
    "DynamicLossScale",
    "ExplainError",
    "Explanation",
    "FormatError",
    "FormatLike",
    "LossScaleError",
    "LossScaleTypeError",
    "NoOpLossScale",
    "Policy",
    "PolicyError",
    "PolicyLike",
    "PrecisionError",
    "PrecisionFallbackError",
    "PrecisionFallbackWarning",
    "PrecisionMismatchError",
    "PrecisionTypeError",
    "SaveError",
    "SaveTypeError",
    "SelectionError",
    "SelectionWarning",
    "StaticLossScale",
    "Tensor",
    "UpdateError",
    "all_finite",
    "apply",
    "apply_updates",
    "calibrate",
    "default_format",
    "device_put",
    "explain",
    "get_default_format",
    "is_reduced_precision",
    "load",
    "quantize",
    "save",
    "scales_per_layer",
    "select_tree",
    "storage_shardings",
    "to_full_precision",
    "to_reduced_precision",
    "tree_nbytes",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    if home not in _PLAIN:
        # Tensor's operators are attached by one module, loaded before any name
        # that computes is handed out (precision/_applied_operators.py says why).
        importlib.import_module(f"{__name__}._applied_operators")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
