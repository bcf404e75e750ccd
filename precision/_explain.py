"""`precision.explain`: what every contraction of `apply(f, ...)` does, before it runs.

The rules write down, for each `dot_general` and convolution, its operands'
storage and the path they take to the dot (`_compute/_explain_notes.py`). The
compiled program is the truth about what XLA then emitted: each row's
operations carry a name scope into the optimized HLO, where the dot (or
convolution) found under it gives the operand and result types (`_hlo.py`).
A declared narrow path that did not happen is the row's `fallback`.

Time is predicted by a roofline over the compiled dots (`_roofline.py`),
for this program and for the same function on bfloat16 arrays compiled by
plain `jax.jit`: the speed-up a user would see against their bf16 model.
With `measure_error`, both this program and a float32 one run, each
contraction handing its output to the host, and the report gives each
contraction's SQNR against the float32 model's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ._apply import apply
from ._compute._explain_notes import SCOPE, Note, recording
from ._context import FormatLike
from ._contract import ContractLike
from ._errors import ExplainError, PrecisionError
from ._hlo import Dot, dots, kernels, output_bytes
from ._operators import refusal
from ._policy import PolicyLike
from ._roofline import Rates, cost, rates, type_key
from ._tensor import Tensor

__all__ = ["Explanation", "Row", "explain"]


@dataclasses.dataclass(frozen=True)
class Row:
    """One contraction: where it is, what reaches it and what XLA compiled.

    Attributes:
        where: the user's file, line and function.
        op: `dot_general` or `conv_general_dilated`.
        shapes: the operands' logical shapes; `out_shape` the result's.
        operands: each operand's storage (format, scaling) or compute format.
        stored_bytes: bytes each operand holds as stored (0 for a computed value).
        path: how the operands reach the dot, in words.
        compiled: the dots XLA emitted for it, as `operand x operand -> result`
            types (`s8[4,16] x s8[16,8] -> s32[4,8]`); empty if XLA folded it away.
        fallback: a declared narrow path that did not happen, and why; else None.
        gpu: what keeps a narrow dot off a GPU's fast GEMM path (an operand whose
            contracting dim is not its last, which a GPU transposes before the GEMM at
            every call; fp8 without fast accumulation); else None. Read from the
            program the library emits, whatever backend compiles it here.
        widened: the numbers are as declared but the backend compiled the narrow dot
            the library emitted with wider operands (XLA:CPU runs f8 and bf16 dots in
            float32): the narrow kernel does not run on this backend; else None.
        flops: multiply-adds times two.
        bytes_read: bytes its compiled dots read and write.
        predicted_s: the roofline's seconds for its compiled dots (None without rates).
        sqnr_db: with `measure_error`, the SQNR of its output against the float32
            model's same contraction (errors of earlier layers included); else None.
        relative_error: with `measure_error`, `‖out − ref‖ / ‖ref‖` of the same.
    """

    where: str
    op: str
    shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    operands: tuple[str, ...]
    stored_bytes: tuple[int, ...]
    path: str
    compiled: tuple[str, ...]
    fallback: str | None
    flops: int
    bytes_read: int = 0
    predicted_s: float | None = None
    sqnr_db: float | None = None
    relative_error: float | None = None
    widened: str | None = None
    gpu: str | None = None


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What `precision.apply(f, ...)` does with given arguments (`precision.explain`).

    `rows` holds one `Row` per contraction; `str()` is a table; `to_json()` the
    same as JSON. Parameter totals count the arguments: bytes held (Tensors:
    codes plus scales), and the same values as float32 and as bfloat16.
    `flops_by_type` sums the compiled dots' FLOPs by operand type (`s8`, `f8`,
    `bf16`, `f32`). `predicted_s` is the roofline's time of one call,
    `bfloat16_s` the same for `f` on bfloat16 arrays under plain `jax.jit`,
    and `speedup` their ratio; `rates` says where the device figures come
    from, `no_prediction` why a figure is missing. With `measure_error`,
    `output_sqnr_db` and `output_relative_error` compare the outputs with the
    float32 model's.
    """

    backend: str
    rows: tuple[Row, ...]
    held_bytes: int
    float32_bytes: int
    bfloat16_bytes: int
    flops_by_type: dict[str, int] = dataclasses.field(default_factory=dict)
    rates: str | None = None
    predicted_s: float | None = None
    bfloat16_s: float | None = None
    no_prediction: str | None = None
    output_sqnr_db: float | None = None
    output_relative_error: float | None = None

    @property
    def fallbacks(self) -> tuple[Row, ...]:
        """The rows whose declared narrow path did not happen."""
        return tuple(r for r in self.rows if r.fallback is not None)

    @property
    def speedup(self) -> float | None:
        """Predicted bfloat16 time over this program's: above 1 is faster than bf16."""
        if self.predicted_s is None or self.bfloat16_s is None:
            return None
        return self.bfloat16_s / self.predicted_s

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["speedup"] = self.speedup
        return json.dumps(data, indent=1)

    def __str__(self) -> str:
        lines = [f"precision.explain on {self.backend}: {len(self.rows)} contraction(s)"]
        for i, r in enumerate(self.rows, 1):
            lines.extend(_row_lines(i, r))
        lines.extend(_total_lines(self))
        return "\n".join(lines)


def _row_lines(i: int, r: Row) -> list[str]:
    shapes = " x ".join(str(s) for s in r.shapes)
    cost = f"{r.flops:,} FLOPs"
    if r.predicted_s is not None:
        cost += f", {r.bytes_read:,} B read, predicted {_time(r.predicted_s)}"
    held = [f"{d} ({b:,} B)" if b else d for d, b in zip(r.operands, r.stored_bytes, strict=True)]
    lines = [
        f"{i:>3}  {r.where}",
        f"     {r.op} {shapes} -> {r.out_shape}, {cost}",
        f"     operands  {'; '.join(held)}",
        f"     path      {r.path}",
        f"     compiled  {'; '.join(r.compiled) or 'no dot left (folded by XLA)'}",
    ]
    if r.sqnr_db is not None:
        lines.append(f"     error     {_error(r.sqnr_db, r.relative_error)} against float32")
    if r.fallback is not None:
        lines.append(f"     FALLBACK  {r.fallback}")
    if r.widened is not None:
        lines.append(f"     WIDENED   {r.widened}")
    if r.gpu is not None:
        lines.append(f"     GPU       {r.gpu}")
    return lines


def _total_lines(e: Explanation) -> list[str]:
    flops = sum(r.flops for r in e.rows)
    lines = [
        f"parameters: {e.held_bytes:,} B held (as float32 {e.float32_bytes:,} B, "
        f"as bfloat16 {e.bfloat16_bytes:,} B); {flops:,} FLOPs in contractions",
    ]
    if e.flops_by_type:
        by = ", ".join(f"{k} {v:,}" for k, v in sorted(e.flops_by_type.items()))
        lines.append(f"compiled FLOPs by operand type: {by}")
    if e.predicted_s is not None:
        line = f"predicted {_time(e.predicted_s)} a call on {e.rates}"
        if e.speedup is not None and e.bfloat16_s is not None:
            line += f"; the bfloat16 model {_time(e.bfloat16_s)}: {e.speedup:.2f}x its speed"
        lines.append(line)
    if e.no_prediction is not None:
        lines.append(f"no prediction: {e.no_prediction}")
    if e.output_sqnr_db is not None:
        error = _error(e.output_sqnr_db, e.output_relative_error)
        lines.append(f"outputs: {error} against float32")
    if e.fallbacks:
        lines.append(f"{len(e.fallbacks)} declared narrow contraction(s) fell back")
    return lines


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def _error(sqnr: float, relative: float | None) -> str:
    return f"SQNR {sqnr:.1f} dB, relative {relative:.2e}"


def explain(
    f: Callable[..., Any],
    *args: Any,
    compute: FormatLike | None = None,
    policy: PolicyLike | None = None,
    contract: ContractLike | None = None,
    measure: bool = False,
    measure_error: Any = False,
    **kwargs: Any,
) -> Explanation:
    """What `precision.apply(f, compute=..., policy=..., contract=...)(*args, **kwargs)` does.

    `f` is traced and compiled for these arguments: each contraction becomes a
    `Row` with its source line, operands, the path the precision rules chose,
    the dot XLA compiled for it and its predicted time. Nothing runs unless
    asked:

    - `measure=True`: on a CPU or a device the datasheet table does not know,
      time this machine once per process (a few seconds) so that time can be
      predicted; known accelerators (H100, H200, A100, TPU v4-v6e) need no
      measurement.
    - `measure_error=True`: run this program and the float32 one on the same
      arguments, every Tensor decoded to float32 (the error the compute path
      adds); or `measure_error=(args...)`: the float32 arguments the model had
      before conversion (the whole error). Each row then holds its output's
      SQNR against the float32 model's, the report the outputs' SQNR.

    Examples:
        >>> import jax.numpy as jnp, numpy as np, precision
        >>> w = precision.Tensor(np.ones((16, 8), np.float32)).to_reduced_precision("int8")
        >>> report = precision.explain(lambda x, w: x @ w, jnp.ones((4, 16)), w,
        ...                            contract="int8")
        >>> report.rows[0].compiled
        ('s8[4,16] x s8[16,8] -> s32[4,8]',)
    """
    _check_flags(measure, measure_error)
    call = _Call.of(args, kwargs)
    run = apply(f, compute=compute, policy=policy, contract=contract)  # a fresh cache
    with recording() as notes:
        try:
            compiled = jax.jit(call.program(run)).lower(*call.dynamic()).compile()
        except PrecisionError:
            raise
        except (TypeError, ValueError, OverflowError) as err:  # JAX refused, or f raised
            raise refusal("explain: f", args, err) from err
    text = compiled.as_text() or ""  # read once: large for a real model
    found = dots(text, SCOPE)
    device = jax.devices()[0]
    rate = rates(device, measure)
    rows = [
        _row(n, dots_of, rate, jax.default_backend())
        for n, dots_of in zip(notes, _claimed(notes, found), strict=True)
    ]
    by_type: dict[str, int] = {}
    for d in found:
        key = type_key(d.operand_types)
        by_type[key] = by_type.get(key, 0) + d.flops
    held, f32, bf16 = call.parameter_bytes()
    report = Explanation(jax.default_backend(), tuple(rows), held, f32, bf16, by_type)
    report = _predicted(report, rate, (compiled, text, found), f, call, device)
    if measure_error is not False:
        options = {"compute": compute, "policy": policy, "contract": contract}
        report = _with_errors(report, f, options, call, measure_error, kwargs)
    return report


def _check_flags(measure: Any, measure_error: Any) -> None:
    if not isinstance(measure, bool):
        raise ExplainError(
            f"measure={measure!r}: expected True or False (time this machine once to predict)"
        )
    if not (isinstance(measure_error, bool) or isinstance(measure_error, tuple | list)):
        raise ExplainError(
            f"measure_error={measure_error!r}: expected True, False, or a tuple of the "
            "float32 arguments to compare with, as f takes them"
        )


_ARRAYS = (jax.Array, np.ndarray)


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


@dataclasses.dataclass(frozen=True)
class _Call:
    """A call's arguments as leaves: arrays and Tensors are traced; anything else
    (an activation function, a flag) is static, as `apply` and Equinox's filters
    treat them."""

    leaves: list[Any]
    treedef: Any
    traced: list[int]

    @classmethod
    def of(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs), is_leaf=_is_tensor)
        traced = [i for i, x in enumerate(leaves) if _is_tensor(x) or isinstance(x, _ARRAYS)]
        return cls(leaves, treedef, traced)

    def dynamic(self) -> list[Any]:
        return [self.leaves[i] for i in self.traced]

    def program(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def program(*dynamic: Any) -> Any:
            given = list(self.leaves)
            for i, x in zip(self.traced, dynamic, strict=True):
                given[i] = x
            a, k = jax.tree_util.tree_unflatten(self.treedef, given)
            return fn(*a, **k)

        return program

    def replaced(self, fn: Callable[[Any], Any]) -> _Call:
        leaves = list(self.leaves)
        for i in self.traced:
            leaves[i] = fn(leaves[i])
        return _Call(leaves, self.treedef, self.traced)

    def parameter_bytes(self) -> tuple[int, int, int]:
        """Bytes held, and the same values as float32 and as bfloat16."""
        held = f32 = bf16 = 0
        for i in self.traced:
            leaf = self.leaves[i]
            if isinstance(leaf, Tensor):
                held += leaf.nbytes
                f32, bf16 = f32 + 4 * leaf.size, bf16 + 2 * leaf.size
                continue
            size, dtype = math.prod(np.shape(leaf)), np.dtype(leaf.dtype)
            held += size * dtype.itemsize
            floating = np.issubdtype(dtype, np.floating)
            f32 += size * (4 if floating else dtype.itemsize)
            bf16 += size * (2 if floating else dtype.itemsize)
        return held, f32, bf16


def _claimed(notes: list[Note], found: list[Dot]) -> list[list[Dot]]:
    """Each note's compiled dots: those under its name scope, else (XLA rewrote the
    dot and dropped its metadata, as it does for some batched integer dots) the first
    unscoped dot of the same FLOPs and result size."""
    claimed = [[d for d in found if d.scope == n.index] for n in notes]
    unscoped = [d for d in found if d.scope is None]
    for n, mine in zip(notes, claimed, strict=True):
        if not mine:
            size = math.prod(n.out_shape)
            match = next(
                (d for d in unscoped if d.flops == n.flops and d.out_elements == size), None
            )
            if match is not None:
                unscoped.remove(match)
                mine.append(match)
    return claimed


def _widened(n: Note, compiled: list[Dot], backend: str) -> str | None:
    """Why the row's narrow dot runs wider here, when the library emitted narrow operands
    and every dot compiled for it takes wider ones (the numbers stay as declared)."""
    if n.emitted is None or not compiled or n.fallback is not None:
        return None
    narrow = [t for t in n.emitted if np.dtype(t).itemsize < 4]
    if not narrow or any(t != "f32" for d in compiled for t in d.operand_types):
        return None
    return (
        f"{backend} compiles the {' x '.join(n.emitted)} dot with float32 operands: the "
        "numbers are as declared (operands rounded to the format, exact products, float32 "
        "sums), the narrow kernel does not run here; a GPU runs it as emitted"
    )


def _row(n: Note, compiled: list[Dot], rate: Rates | None, backend: str) -> Row:
    # a contraction traced once in a loop body runs once per iteration of the loop
    runs = max((d.times for d in compiled), default=1)
    return Row(
        n.where,
        n.op,
        n.shapes,
        n.out_shape,
        n.operands,
        n.stored_bytes,
        n.path,
        tuple(d.text for d in compiled),
        n.fallback,
        n.flops * runs,
        sum(d.bytes for d in compiled),
        None if rate is None or not compiled else sum(rate.dot_seconds(d) for d in compiled),
        widened=_widened(n, compiled, backend),
        gpu=n.gpu,
    )


def _seconds(rate: Rates, compiled: Any, text: str, found: list[Dot]) -> float:
    """The roofline's time of one call of a compiled program whose text and dots are read."""
    return rate.program_seconds(found, cost(compiled), kernels(text), output_bytes(text))


def _predicted(
    report: Explanation,
    rate: Rates | None,
    program: tuple[Any, str, list[Dot]],
    f: Callable[..., Any],
    call: _Call,
    device: Any,
) -> Explanation:
    """The report with predicted times of this program (compiled, its text, its dots)
    and of `f` in bfloat16."""
    if rate is None:
        why = (
            f"no datasheet rates for {device.device_kind!r}; pass measure=True to time "
            "this machine once (a few seconds, kept for the process)"
        )
        return dataclasses.replace(report, no_prediction=why)
    ours = _seconds(rate, *program)
    report = dataclasses.replace(report, rates=rate.describe(), predicted_s=ours)
    try:  # the user's function on bfloat16 arrays, as they would run it without us
        baseline = jax.jit(call.program(f)).lower(*call.replaced(_as_bfloat16).dynamic())
        plain = baseline.compile()
    except Exception as e:  # said in the report, never hidden
        why = f"the bfloat16 baseline did not compile ({type(e).__name__}: {e})"
        return dataclasses.replace(report, no_prediction=why.split("\n")[0])
    text = plain.as_text() or ""
    return dataclasses.replace(report, bfloat16_s=_seconds(rate, plain, text, dots(text)))


def _as_bfloat16(leaf: Any) -> Any:
    """A shape-only stand-in: floats (and Tensors) as bfloat16, other arrays as they are."""
    dtype = np.dtype(leaf.dtype)
    floating = isinstance(leaf, Tensor) or np.issubdtype(dtype, np.floating)
    return jax.ShapeDtypeStruct(tuple(leaf.shape), jax.numpy.bfloat16 if floating else dtype)


def _with_errors(
    report: Explanation,
    f: Callable[..., Any],
    options: dict[str, Any],
    call: _Call,
    reference: Any,
    kwargs: dict[str, Any],
) -> Explanation:
    """Run this program and the float32 one; each row's SQNR against the reference's."""
    ours, out = _captured(apply(f, **options), call)
    if reference is True:
        ref_call = call.replaced(lambda x: x.to_full_precision() if _is_tensor(x) else x)
    else:
        args = jax.tree_util.tree_unflatten(call.treedef, call.leaves)[0]
        if len(reference) != len(args):
            raise ExplainError(
                f"measure_error: {len(reference)} float32 argument(s) given where f takes "
                f"{len(args)}; pass them as f takes them, measure_error=(params, x)"
            )
        ref_call = _Call.of(tuple(reference), kwargs)
    theirs, ref_out = _captured(apply(f), ref_call)
    if [(n.op, n.out_shape) for n in ours] != [(n.op, n.out_shape) for n in theirs]:
        raise ExplainError(
            f"measure_error: the float32 run has {len(theirs)} contraction(s), "
            f"{[n.out_shape for n in theirs]}, where this one has {len(ours)}, "
            f"{[n.out_shape for n in ours]}; pass the float32 arguments in the structure "
            "f takes (measure_error=(params, x)), or measure_error=True"
        )
    rows = []
    for r, a, b in zip(report.rows, ours, theirs, strict=True):
        sqnr, relative = _compared(_joined(a.outputs), _joined(b.outputs))
        rows.append(dataclasses.replace(r, sqnr_db=sqnr, relative_error=relative))
    sqnr, relative = _compared(_floats(out), _floats(ref_out))
    return dataclasses.replace(
        report, rows=tuple(rows), output_sqnr_db=sqnr, output_relative_error=relative
    )


def _captured(run: Callable[..., Any], call: _Call) -> tuple[list[Note], Any]:
    """Run `run` on the call's arguments, every contraction's output kept."""
    with recording(capture=True) as notes:
        out = jax.jit(call.program(run))(*call.dynamic())
        jax.block_until_ready(out)
    jax.effects_barrier()  # the host callbacks have all run
    return notes, out


def _joined(outputs: list[np.ndarray]) -> np.ndarray | None:
    return np.concatenate([o.ravel() for o in outputs]) if outputs else None


def _floats(out: Any) -> np.ndarray | None:
    leaves = jax.tree_util.tree_leaves(out, is_leaf=_is_tensor)
    kept = [
        np.asarray(x, np.float32).ravel()
        for x in leaves
        if _is_tensor(x) or (isinstance(x, _ARRAYS) and np.issubdtype(x.dtype, np.floating))
    ]
    return np.concatenate(kept) if kept else None


def _compared(ours: np.ndarray | None, ref: np.ndarray | None) -> tuple[float | None, float | None]:
    """SQNR and norm-wise relative error of `ours` against `ref` (None if nothing ran)."""
    from .testing._metrics import sqnr_db

    if ours is None or ref is None or ours.shape != ref.shape:
        return None, None
    sqnr = sqnr_db(ref, ours)
    return sqnr, (math.nan if math.isnan(sqnr) else 10.0 ** (-sqnr / 20.0))
