"""`precision convert --layout gguf`: a GGUF file llama.cpp runs.

The plan (`_convert_command._plan`) is made on the Hugging Face tensors as usual; `prepare`
then reads the model's `config.json` and `tokenizer.json` (`_checkpoint._gguf_model`,
`_gguf_vocab`), refuses what llama.cpp would not run as the model runs, and adjusts
the plan to llama.cpp's habits:

* a weight ggml holds transposed (GPT-2's `Conv1D`, stored inputs × outputs) is
  quantized with its blocks along its inputs (axis 0), so that once transposed its
  blocks lie along ggml's rows, as Q8_0, Q4_0 and MXFP4 hold them;
* 1-D tensors (norms, biases) stay float32, as llama.cpp's own converter writes them.

`write` streams the converted tensors into the file under llama.cpp's names, each
moved (`_gguf_model.transform`: rows permuted, or transposed) as codes and scales,
nothing re-rounded, with the architecture's keys and the tokenizer's.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

import dtypes

from .._checkpoint import _gguf, _gguf_model, _gguf_vocab, _q4_0
from .._checkpoint._layout import Leaf
from .._checkpoint._source import Source
from .._errors import SaveError
from ._convert_engine import _Converter
from ._convert_modes import _mode, _Plan
from ._interrupts import deferred_interrupts
from ._output import PROG
from ._output_layouts import model_directory

__all__ = ["Prepared", "prepare", "write"]

#: llama.cpp's `general.file_type` of a file whose matrices are mostly of each type.
_FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "BF16": 32, "MXFP4": 38}

_FLOAT32 = "1-D: llama.cpp reads norms and biases as float32"


class Prepared:
    """The plans as llama.cpp's file holds them, and the model they belong to."""

    def __init__(self, plans: list[_Plan], model: _gguf_model.Model, keys: list[Any]):
        self.plans = plans
        self.model = model
        self.keys = keys


def _blocked_on_inputs(plan: _Plan, rounding: str) -> _Plan:
    """A plan of a transposed weight, with its blocks along its inputs (axis 0)."""
    out = plan.out
    scaling = out.scaling
    assert out.format is not None
    assert isinstance(scaling, dtypes.PerBlock)
    moved = dtypes.PerBlock(
        scaling.size, 0, power_of_two=scaling.power_of_two, scale_format=scaling.scale_format
    )
    try:
        moved.validate(out.shape)
    except (ValueError, TypeError):
        return _Plan(plan.reader, plan.leaf, plan.leaf, f"{moved} does not fit shape")
    leaf = Leaf.tensor(out.name, out.path, out.dtype, out.shape, out.format, moved)
    new = _Plan(plan.reader, plan.leaf, leaf, None)
    new.mode, new.note = _mode(new, rounding)
    return new


def _as_float32(plan: _Plan, rounding: str) -> _Plan:
    """A 1-D tensor's plan: kept when stored float32, else converted to float32."""
    leaf = plan.leaf
    if (leaf.kind == "array" and leaf.dtype == np.float32) or leaf.format == dtypes.float32:
        return _Plan(plan.reader, leaf, leaf, f"kept ({_FLOAT32})")
    out = Leaf.tensor(leaf.name, leaf.path, np.dtype(np.float32), leaf.shape, dtypes.float32, None)
    new = _Plan(plan.reader, leaf, out, None)
    new.mode, new.note = _mode(new, rounding)
    return new


def _written_scaling(scaling: Any, move: str, ndim: int) -> Any:
    """A tensor's scaling as ggml holds it once moved: blocks along its inputs become
    blocks along the last axis (axis 0 of a weight ggml transposes, else the last)."""
    if not isinstance(scaling, dtypes.PerBlock) or ndim != 2:
        return scaling
    inputs = 0 if move == "transpose" else 1
    return dataclasses.replace(scaling, axis=-1) if scaling.axis % ndim == inputs else scaling


def _adjusted(plan: _Plan, mapped: _gguf_model.Mapped, rounding: str) -> _Plan:
    leaf = plan.leaf
    if len(leaf.shape) == 1 and leaf.dtype.kind == "f":
        return _as_float32(plan, rounding)
    if plan.reason is None and mapped.move == "transpose" and plan.out.scaling is not None:
        plan = _blocked_on_inputs(plan, rounding)
    if plan.reason is None and leaf.scaling is not None:
        # stored as the asked ggml type already (a calibrated checkpoint: int4, or Q4_0's
        # grid as uint4): its codes as they are, never decoded and rounded again
        ndim = len(leaf.shape)
        mine = _gguf.gguf_type(
            leaf.format, _written_scaling(leaf.scaling, mapped.move, ndim), leaf.dtype
        )
        asked = _written_scaling(plan.out.scaling, mapped.move, ndim)
        if mine is not None and mine == _gguf.gguf_type(plan.out.format, asked, leaf.dtype):
            return _Plan(plan.reader, leaf, leaf, f"kept (stored as {mine} already: written as is)")
    if plan.reason is None and rounding == "nearest_even" and _from_int4_into_q4_0(plan, mapped):
        return _on_q4_0_grid(plan, rounding)
    return plan


def _from_int4_into_q4_0(plan: _Plan, mapped: _gguf_model.Mapped) -> bool:
    """Whether `plan` writes this library's int4 as Q4_0 (`_gguf.gguf_type` says which
    type holds it), its own absmax scales, in whole blocks of 32."""
    out = plan.out
    fmt, scaling = out.format, out.scaling
    if not isinstance(fmt, dtypes.IntFormat) or not isinstance(scaling, dtypes.PerBlock):
        return False
    written = _written_scaling(scaling, mapped.move, len(out.shape))
    return (
        _gguf.gguf_type(fmt, written, out.dtype) == "Q4_0"
        and not scaling.power_of_two
        and out.shape[scaling.axis % len(out.shape)] % 32 == 0
    )


def _on_q4_0_grid(plan: _Plan, rounding: str) -> _Plan:
    """An int4 plan written as Q4_0, rounded as ggml's quantizer rounds, onto Q4_0's
    whole grid (codes -8..7 times `max / -8`; this library's int4 holds -7..7 times
    `absmax / 7`, a step 8/7 as wide: on the byte-level GPT-2 of the benchmarks it lost
    41% more bits per byte)."""
    out = plan.out
    leaf = Leaf.tensor(out.name, out.path, out.dtype, out.shape, _q4_0.FORMAT, out.scaling)
    new = _Plan(plan.reader, plan.leaf, leaf, None)
    new.mode, new.note = _mode(new, rounding)
    return new


def _problem(plan: _Plan, move: str) -> str | None:
    """Why llama.cpp's file cannot hold the tensor of `plan` as written, or None."""
    out = plan.out
    scaling = _written_scaling(out.scaling, move, len(out.shape))
    if _gguf.gguf_type(out.format, scaling, out.dtype) is not None:
        return None
    if plan.reason is None and out.format is not None:
        return _gguf.refusal(out.name, out.format, scaling, out.shape)
    what = out.dtype.name if out.format is None else f"{out.format.name} with {out.scaling}"
    return (
        f"kept as {what}, which has no GGUF type once laid out for llama.cpp (blocks of 32 "
        "along the inputs with float16 scales, or float32, float16, bfloat16); convert them "
        "(--include) to a format GGUF holds"
    )


def _refuse(plans: list[_Plan], model: _gguf_model.Model) -> None:
    """Every tensor llama.cpp's file cannot hold, grouped by reason, in one `SaveError`."""
    refused: dict[str, list[str]] = {}
    for plan in plans:
        problem = _problem(plan, model.tensors[plan.leaf.name].move)
        if problem is not None:
            refused.setdefault(problem, []).append(plan.leaf.name)
    parts = []
    for problem, names in refused.items():
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        what = "tensor" if len(names) == 1 else f"{len(names)} tensors"
        parts.append(f"{what} {', '.join(repr(n) for n in names[:3])}{more}: {problem}")
    if parts:
        raise SaveError("--layout gguf cannot hold " + "; ".join(parts))


def prepare(plans: list[_Plan], source: Source, args: argparse.Namespace) -> Prepared:
    """The plans adjusted to llama.cpp's file, or a `SaveError` naming what it would
    not run (an architecture, a tokenizer, a tensor): before anything is converted."""
    home = model_directory(source)
    if home is None:
        raise SaveError(
            f"--layout gguf writes a file llama.cpp runs, from a Hugging Face model directory "
            f"(config.json, tokenizer.json and the weights): give that directory, not "
            f"{source.path}; --layout gguf-tensors writes a file's tensors alone under their "
            "own names"
        )
    model = _gguf_model.describe(home, [p.leaf.name for p in plans])
    rows = [p.leaf.shape[0] for p in plans if _target(model, p) == "token_embd.weight"]
    keys = _gguf_vocab.vocabulary(home, model.config, rows[0])
    kept = [p for p in plans if p.leaf.name in model.tensors]
    out = [_adjusted(p, model.tensors[p.leaf.name], args.rounding) for p in kept]
    _refuse(out, model)
    pairs = zip(out, kept, strict=True)
    moved = sum(a.reason is None and a.out.scaling != b.out.scaling for a, b in pairs)
    if moved:
        print(
            f"blocks along the inputs: {moved} weight(s) stored inputs x outputs (Conv1D) are "
            "quantized on axis 0, then transposed into ggml's rows as codes"
        )
    if model.dropped:
        listed = ", ".join(f"{n} ({why})" for n, why in model.dropped.items())
        print(f"not written (llama.cpp does without them): {listed}")
    return Prepared(out, model, keys)


def _target(model: _gguf_model.Model, plan: _Plan) -> str | None:
    mapped = model.tensors.get(plan.leaf.name)
    return None if mapped is None else mapped.name


def _file_type(kinds: list[str], plans: list[_Plan]) -> int:
    """llama.cpp's `general.file_type`: the type most of the matrices' values are in."""
    count: collections.Counter[str] = collections.Counter()
    for kind, plan in zip(kinds, plans, strict=True):
        if len(plan.out.shape) == 2:
            count[kind] += int(np.prod(plan.out.shape))
    top = count.most_common(1)[0][0] if count else "F32"
    return _FILE_TYPES.get(top, 0)


def _whole(array: Any) -> np.ndarray:
    """An array given whole or as consecutive pieces, whole (one tensor in memory)."""
    if isinstance(array, np.ndarray):
        return array
    pieces = [np.array(p).reshape(-1) for p in array]
    return np.concatenate(pieces) if pieces else np.zeros(0)


def _moved(kind: str, move: str, out: Leaf, arrays: list[np.ndarray]) -> np.ndarray:
    """The bytes (or values) ggml holds for one converted or kept tensor."""
    if len(arrays) == 1:
        values = arrays[0].reshape(out.data_shape)
        return _gguf_model.transform(move, values)
    data, scale, *zero = arrays  # zero points: Q4_0's grid as uint4
    if move == "transpose":
        assert out.format is not None
        assert len(out.shape) == 2
        shape = (out.shape[0], out.shape[1])
        if zero:
            zero = [_gguf.transposed(data, zero[0], shape, True)[1]]
        data, scale = _gguf.transposed(data, scale, shape, out.format.packed)
        move = ""
    blocks = _gguf.block_bytes(kind, data, scale, *zero)
    return _gguf_model.transform(move, blocks.reshape(out.shape[0], -1))


def write(
    prepared: Prepared,
    converter: _Converter,
    dst: str,
    args: argparse.Namespace,
    metadata: dict[str, str],
) -> int:
    """Write llama.cpp's file of the prepared plans; the bytes written."""
    plans, model = prepared.plans, prepared.model
    tensors, kinds = [], []
    for plan in plans:
        out, mapped = plan.out, model.tensors[plan.leaf.name]
        scaling = _written_scaling(out.scaling, mapped.move, len(out.shape))
        kind = _gguf.gguf_type(out.format, scaling, out.dtype)
        assert kind is not None  # `prepare` refused the rest
        shape = out.shape[::-1] if mapped.move == "transpose" else out.shape
        tensors.append((mapped.name, shape, kind))
        kinds.append(kind)

    def produce() -> Iterator[np.ndarray]:
        stream = converter.arrays(plans)
        for plan, kind in zip(plans, kinds, strict=True):
            arrays = [_whole(a) for _, a in (next(stream) for _ in plan.out.arrays())]
            move = model.tensors[plan.leaf.name].move
            yield _moved(kind, move, plan.out, arrays)

    keys = [
        *model.keys,
        ("general.file_type", "u32", _file_type(kinds, plans)),
        *prepared.keys,
    ]
    meta = {f"{PROG}.{key}": value for key, value in metadata.items() if key == "converted_by"}
    return _gguf.write_file(
        dst,
        tensors,
        produce(),
        metadata=meta,
        overwrite=args.overwrite,
        guard=deferred_interrupts,
        arch=model.arch,
        keys=keys,
    )
