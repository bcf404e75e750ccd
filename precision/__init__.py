"""Precision-aware tensors for JAX: logical values over reduced-precision storage."""

from ._context import default_format as default_format
from ._context import get_default_format as get_default_format
from ._errors import DeviceMismatchError as DeviceMismatchError
from ._errors import FormatError as FormatError
from ._errors import PrecisionError as PrecisionError
from ._errors import PrecisionMismatchError as PrecisionMismatchError
from ._interpreter import apply as apply
from ._io import CheckpointError as CheckpointError
from ._io import load as load
from ._io import save as save
from ._tensor import Tensor as Tensor
from ._tensor import device_put as device_put

__all__ = [
    "CheckpointError",
    "DeviceMismatchError",
    "FormatError",
    "PrecisionError",
    "PrecisionMismatchError",
    "Tensor",
    "apply",
    "default_format",
    "device_put",
    "get_default_format",
    "load",
    "save",
]
