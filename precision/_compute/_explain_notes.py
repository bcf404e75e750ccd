"""What each contraction did, written down while `precision.explain` traces.

The contraction rules call `note` with the path they take; outside `explain`
nothing is recording and `note` returns at once, so programs are unchanged.
While recording, each contraction's operations are bound inside a name scope
(`precision_explain_<n>`) that reaches the compiled program's metadata, so
`explain` finds the dot XLA emitted for each row.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import os
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.extend import source_info_util

import dtypes

from ._state import State

__all__ = [
    "SCOPE",
    "Note",
    "describe_operand",
    "emitted",
    "explained_backend",
    "gpu_slow_path",
    "mark_fallback",
    "note",
    "observe",
    "paused",
    "recording",
    "settle",
]

SCOPE = "precision_explain_"


@dataclasses.dataclass
class Note:
    """One contraction as the rules saw it."""

    index: int
    op: str
    where: str  # the user's file:line (function)
    shapes: tuple[tuple[int, ...], ...]  # operands' logical shapes
    out_shape: tuple[int, ...]
    operands: tuple[str, ...]  # each operand's storage or compute format
    stored_bytes: tuple[int, ...]  # bytes each operand holds as stored (0: computed)
    path: str  # how the operands reach the dot
    flops: int  # multiply-adds times two
    fallback: str | None = None  # a declared narrow path that did not happen, and why
    emitted: tuple[str, ...] | None = None  # the narrow operand dtypes handed to the dot
    gpu: str | None = None  # what keeps the narrow dot off a GPU's fast GEMM path
    outputs: list[np.ndarray] = dataclasses.field(default_factory=list)  # when capturing


_NOTES: contextvars.ContextVar[list[Note] | None] = contextvars.ContextVar(
    "precision_explain_notes", default=None
)
_CAPTURE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "precision_explain_capture", default=False
)


@contextlib.contextmanager
def recording(capture: bool = False) -> Iterator[list[Note]]:
    """Collect the notes of every contraction traced inside the block.

    With `capture`, the traced program also hands each contraction's output
    to the host when it runs (`Note.outputs`, one array per execution: a
    contraction inside `scan` runs once per step).
    """
    notes: list[Note] = []
    token, capturing = _NOTES.set(notes), _CAPTURE.set(capture)
    try:
        yield notes
    finally:
        _NOTES.reset(token)
        _CAPTURE.reset(capturing)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Record nothing inside the block: an abstract evaluation (a loop's carry
    formats found before the loop is traced) is not a contraction of the program."""
    token = _NOTES.set(None)
    try:
        yield
    finally:
        _NOTES.reset(token)


def observe(value: Any) -> None:
    """Hand the output of the contraction noted last to the host, when capturing."""
    notes = _NOTES.get()
    if not notes or not _CAPTURE.get():
        return
    kept = notes[-1].outputs

    def keep(out: Any) -> None:
        kept.append(np.asarray(out, np.float32))

    jax.debug.callback(keep, value)


def describe_operand(value: Any, state: State | None) -> tuple[str, int]:
    """(what an operand is, the bytes it holds as stored: 0 for a computed value)."""
    if state is None:
        return f"{np.dtype(value.dtype).name} array", 0
    if state.stored is None and state.view is not None and state.view.state.stored is not None:
        inner, held = describe_operand(state.view.value, state.view.state)
        return f"{inner}, transposed {list(state.view.perm)}", held
    if state.stored is not None:
        enc = state.stored.enc
        scaling = "" if enc.scaling is None else f", {enc.scaling.describe()}"
        return f"{enc.format.name} storage{scaling}", int(enc.nbytes)
    return f"{state.format.name} value", 0


def note(
    eqn: Any, vals: list[tuple[Any, State | None]], path: str
) -> contextlib.AbstractContextManager[Any]:
    """Record `eqn`'s path when `explain` is recording; a name scope for its operations."""
    notes = _NOTES.get()
    if notes is None:
        return contextlib.nullcontext()
    described = [describe_operand(v, s) for v, s in vals]
    notes.append(
        Note(
            index=len(notes),
            op=eqn.primitive.name,
            where=_where(eqn.source_info),
            shapes=tuple(tuple(np.shape(v)) for v, _ in vals),
            out_shape=tuple(eqn.outvars[0].aval.shape),
            operands=tuple(d for d, _ in described),
            stored_bytes=tuple(b for _, b in described),
            path=path,
            flops=_flops(eqn),
        )
    )
    return jax.named_scope(f"{SCOPE}{len(notes) - 1}")


def _where(info: Any) -> str:
    """The equation's line, and the line that called into its package when the equation
    sits in one: a Flax `Dense` contracts inside Flax, and the row names Flax's line
    and the model's line that called it.

    Frames of JAX and of this library are skipped. A package is a directory tree of
    `__init__.py` files, wherever it is installed, so the answer depends on the code's
    own layout, never on where it lies (site-packages or a checkout).
    """
    where = source_info_util.summarize(info)
    frames = getattr(getattr(info, "traceback", None), "frames", None) or []
    frames = [f for f in frames if not f.file_name.startswith(_SKIPPED)]  # innermost first
    root = _package_root(frames[0].file_name) if frames else None
    if root is None:
        return where  # a script's own line
    for frame in frames[1:]:
        if not frame.file_name.startswith(root):
            own = f"{frame.file_name}:{frame.line_num} ({frame.function_name})"
            return f"{own} via {where}"
    return where


def _own_root(module_file: str) -> str:
    return os.path.dirname(os.path.abspath(module_file)) + os.sep


# JAX's frames (its `_src`, its wrappers) and this library's
_SKIPPED = (
    _own_root(jax.__file__),
    _own_root(os.path.dirname(__file__)),  # precision/
    _own_root(dtypes.__file__),
)


@functools.cache
def _package_root(file_name: str) -> str | None:
    """The outermost directory of the package that holds `file_name` (with a trailing
    separator), or None for a file outside any package (a script)."""
    directory = os.path.dirname(file_name)
    if not os.path.exists(os.path.join(directory, "__init__.py")):
        return None
    while os.path.exists(os.path.join(os.path.dirname(directory), "__init__.py")):
        directory = os.path.dirname(directory)
    return directory + os.sep


def _flops(eqn: Any) -> int:
    """Two per multiply-add of a dot_general or convolution."""
    lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
    out = math.prod(int(d) for d in eqn.outvars[0].aval.shape)
    if eqn.primitive.name == "dot_general":
        (contracted, _), _ = eqn.params["dimension_numbers"]
        return 2 * out * math.prod(int(lhs[d]) for d in contracted)
    out_features = int(rhs[eqn.params["dimension_numbers"].rhs_spec[0]])
    return 2 * out * (math.prod(int(d) for d in rhs) // max(out_features, 1))


def settle(path: str) -> None:
    """Name the path of the contraction noted last, once the rule has chosen it."""
    notes = _NOTES.get()
    if notes:
        notes[-1].path = path


def explained_backend() -> str | None:
    """The backend `explain` compiles for, while it records (its rows' words depend on
    it); None otherwise. Programs never branch on it: they follow the platform they are
    lowered for (`lax.platform_dependent`)."""
    return jax.default_backend() if _NOTES.get() is not None else None


def emitted(*dtypes: Any) -> None:
    """Record the element types of the operands the contraction noted last hands to its
    dot on this backend (`explain` compares them with what the backend compiled)."""
    notes = _NOTES.get()
    if notes:
        notes[-1].emitted = tuple(np.dtype(d).name for d in dtypes)


def gpu_slow_path(reason: str) -> None:
    """Say what keeps the dot of the contraction noted last off a GPU's fast GEMM path."""
    notes = _NOTES.get()
    if notes:
        notes[-1].gpu = reason


def mark_fallback(reason: str) -> None:
    """Say that the contraction noted last did not take its declared narrow path."""
    notes = _NOTES.get()
    if notes:
        notes[-1].fallback = reason
