"""What the rules know about a value: its `State`, and what the call declared (`Context`).

Every value the interpreter handles is a `(value, state)` pair. The state is
`None` for a *weak* value (a Python scalar, a constant made inside the
function, anything derived only from those) and for non-floating values;
else it names the compute format whose grid the value is on, whether it
descends from a Tensor argument, and, for a value that is exactly a storage
encoding (an int8 weight, possibly reshaped or sliced), that encoding, so a
result can keep the codes and an integer contraction can use them; and, for
the transpose of another value, that value (a `View`), so a contraction can
read the operand in the layout it has in memory; and, for a value the walk has
just rounded, the value it was rounded from (`Rounded`), so a result stored in a
container whose conversion is that rounding is converted once.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

import dtypes

from .._errors import PrecisionMismatchError

__all__ = ["Context", "Rounded", "State", "Stored", "View", "join", "mismatch", "undeclared"]


class Stored(NamedTuple):
    """A storage encoding that a value equals exactly.

    `enc` holds the arrays as stored (packed codes and scales). It is kept
    through structural moves that the scaling allows, and dropped by any
    computation.
    """

    enc: dtypes.Encoded
    dtype: np.dtype  # the logical dtype it decodes into


class View(NamedTuple):
    """The value is `transpose(value, perm)` of this one, exactly (its `state` too).

    Kept so that a contraction can take `value` itself, in the layout it has in
    memory, with its dimension numbers moved: XLA otherwise fuses the transpose
    into the quantization of the operand, whose reductions and writes then run
    strided (`x @ w.T` of a (50257, 768) float32 `w` took 1.2 s to encode on a
    2-core CPU against 0.14 s for `w` by rows).
    """

    value: Any
    state: State
    perm: tuple[int, ...]


class Rounded(NamedTuple):
    """`value` is the rounding of `raw` onto its state's format, made by the walk.

    A result stored in a container whose conversion is that rounding (bfloat16, float16,
    the float8s: `_storage.converts_by_rounding`) is converted from `raw`: the cast of the
    rounded value would have XLA compute the rounding twice (bfloat16 `Tensor +
    Tensor` 1.3-1.4x the plain expression's time on a CPU). Trusted only while the
    value is that very object: a move or a new state keeps the record but not the
    value.
    """

    value: Any
    raw: Any


class State(NamedTuple):
    """Where a floating value lives.

    `format` is the compute format whose grid holds the value (float32 for a
    decoded storage encoding); `tensor` says it descends from a Tensor
    argument (else from a raw array); `stored` is the storage encoding the
    value equals exactly, when there is one; `view` the value it is a
    transpose of, when it was made by one.
    """

    format: dtypes.Format
    tensor: bool
    stored: Stored | None = None
    source: str | None = None  # the storage format a full-precision value was decoded from
    view: View | None = None
    rounded: Rounded | None = None

    def plain(self) -> State:
        """The state without its storage encoding, view or rounding record (a computed
        value)."""
        if self.stored is None and self.view is None and self.rounded is None:
            return self
        return State(self.format, self.tensor, None, self.source)


class Context(NamedTuple):
    """What a call of `apply` declared: the compute format, the float32 op list, the output,
    the quantization of contractions (a `precision.Contract`, or None), and whether a
    contraction that cannot take its declared narrow path raises (`strict`)."""

    compute: dtypes.Format | None = None
    float32_ops: frozenset[str] = frozenset()
    output: dtypes.Format | None = None
    contract: Any = None
    strict: bool = False


def _describe(state: State) -> str:
    if state.source is not None:
        return f"{state.format.name} values decoded from {state.source} storage"
    kind = "tensor" if state.tensor else "array"
    return f"{state.format.name} {kind}"


def undeclared(op: str, stored: State, other: State) -> PrecisionMismatchError:
    """Storage decoded into a narrower compute format without a declaration."""
    name = other.format.name
    return PrecisionMismatchError(
        f"`{op}` meets {_describe(stored)} and a {_describe(other)}: computing "
        f"{stored.source} storage in {name} rounds it, so the compute format must be "
        f'declared once, at the call: precision.apply(f, compute="{name}"); or convert the '
        f"{name} tensor with t.to_full_precision() to compute in {stored.format.name}, or "
        f'the storage with t.to_reduced_precision("{name}")'
    )


def mismatch(op: str, a: State, b: State) -> PrecisionMismatchError:
    """The error for two compute formats meeting in one operation."""
    if a.source is not None and b.source is None and b.format.bits < a.format.bits:
        return undeclared(op, a, b)
    if b.source is not None and a.source is None and a.format.bits < b.format.bits:
        return undeclared(op, b, a)
    if not a.tensor or not b.tensor:
        arr, ten = (a, b) if not a.tensor else (b, a)
        return PrecisionMismatchError(
            f"cannot combine a full-precision {arr.format.name} array and a {ten.format.name} "
            f"tensor in `{op}`: a raw array argument is full precision and formats never mix "
            f"silently; wrap it explicitly, e.g. "
            f'precision.Tensor(x).to_reduced_precision("{ten.format.name}"), convert the tensor '
            "with t.to_full_precision(), or declare the compute format: "
            f'precision.apply(f, compute="{ten.format.name}")'
        )
    return PrecisionMismatchError(
        f"cannot combine {a.format.name} and {b.format.name} tensors in `{op}`; convert one "
        f'explicitly, e.g. b.to_reduced_precision("{a.format.name}") or a.to_full_precision()'
    )


def join(
    op: str, a: State | None, b: State | None, compute: dtypes.Format | None = None
) -> State | None:
    """The common state of two values (without storage), or raise when formats differ.

    Under a declared `compute` format a full-precision value meeting that format adopts
    it, as every op's inputs do (docs/design.md §5).
    """
    if a is None:
        return None if b is None else b.plain()
    if b is None:
        return a.plain()
    fmt = a.format
    if fmt != b.format:
        pair = (fmt, b.format)
        if compute not in pair or not any(f.is_full_precision for f in pair):
            raise mismatch(op, a, b)
        fmt = compute
    return State(fmt, a.tensor or b.tensor, None, a.source or b.source)
