"""The exception hierarchy: one base, each also the builtin users already catch."""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "DeviceMismatchError",
    "FormatError",
    "PrecisionError",
    "PrecisionMismatchError",
]


class PrecisionError(Exception):
    """Base class of every error this library raises on purpose."""


class PrecisionMismatchError(PrecisionError, TypeError):
    """An operation met tensors stored in two different formats.

    Nothing is converted implicitly: convert one operand with
    `to_reduced_precision(...)` or `to_full_precision()` first.
    """


class DeviceMismatchError(PrecisionError, ValueError):
    """An operation met tensors on different devices; move one with `to_device`."""


class FormatError(PrecisionError, ValueError):
    """A format name or object that is not known."""


class CheckpointError(PrecisionError, ValueError):
    """A checkpoint file is truncated, corrupted, foreign or inconsistent.

    The message names the file and what is wrong with it. Raised before any
    wrong number could be returned.
    """
