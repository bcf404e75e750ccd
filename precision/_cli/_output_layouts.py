"""`precision convert --layout`: outputs other tools load, and the files beside the tensors.

`--layout precision` (the default) writes this library's safetensors, which hold every
format; `compressed-tensors` writes a Hugging Face model directory that vLLM and
transformers load; `gguf` writes one GGUF file. What each layout holds, byte for byte,
is described with its module (`precision/_checkpoint/_compressed_tensors.py`,
`_gguf.py`); this one fits a plan to the layout before anything is converted (`fit`:
compressed-tensors keeps in float what its readers would not quantize, with the reason
`convert` prints; every tensor the layout cannot hold is refused at once, with the flags
that would work) and writes the converted stream in it, atomically, as `convert` writes
its own.

A directory input is a model: the files beside its tensors (`config.json`, the tokenizer,
`generation_config.json`, ...) go into a directory output with the tensors, inside the
same temporary directory, so they appear together or not at all (`copy_files`). Weights
in other formats (`*.bin`, `*.pt`, `*.gguf`, ...) and subdirectories are not copied.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._checkpoint import _compressed_tensors as ct
from .._checkpoint import _gguf
from .._checkpoint._layout import Leaf
from .._checkpoint._source import INDEX_SUFFIX, Source
from .._errors import SaveError, UsageError
from ._convert_engine import _Converter
from ._convert_modes import _Plan
from ._files import DEFAULT_SHARD_BYTES, write_shards
from ._interrupts import check_interrupt, deferred_interrupts
from ._output import PROG
from ._temp_directory import TempDirectory

__all__ = [
    "GGUF",
    "LAYOUTS",
    "copy_files",
    "fit",
    "model_directory",
    "report_copied",
    "write_layout",
]

LAYOUTS = ("precision", "compressed-tensors", "gguf", "gguf-tensors")
#: The GGUF layouts: a file llama.cpp runs, and the tensors alone (`_layout_gguf`).
GGUF = ("gguf", "gguf-tensors")

#: Files that hold weights in another format: never copied beside converted tensors.
_WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".onnx",
    ".gguf",
    ".index.json",
)


# --------------------------------------------------------------------------
# the files beside the tensors


def model_directory(source: Source) -> str | None:
    """The directory of a model given as a directory (or as its index file), or None."""
    if os.path.isdir(source.path):
        return source.path
    if source.sharded:
        return os.path.dirname(os.path.abspath(source.path))
    return None


def _beside(directory: str) -> tuple[list[str], list[str]]:
    """(files to copy, what is left out and why) of a model directory."""
    copied, skipped = [], []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith("."):
            continue
        if os.path.isdir(path):
            skipped.append(f"{name}/ (a directory)")
        elif name.endswith(_WEIGHT_SUFFIXES):
            if not name.endswith((".safetensors", INDEX_SUFFIX)):
                skipped.append(f"{name} (weights in another format)")
        elif os.path.isfile(path):  # (a link into a hub cache is followed)
            copied.append(name)
    return copied, skipped


def copy_files(
    source: Source, directory: str, config: dict[str, Any] | None = None
) -> tuple[list[str], list[str]]:
    """Copy the files beside the input's tensors into `directory` (the output's temporary
    directory); `config` is merged into `config.json`. Returns what `_beside` found."""
    home = model_directory(source)
    if home is None:
        return [], []
    copied, skipped = _beside(home)
    for name in copied:
        check_interrupt()
        target = os.path.join(directory, name)
        if name == "config.json" and config:
            with open(os.path.join(home, name), encoding="utf-8") as f:
                doc = json.load(f)
            doc.update(config)
            with open(target, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
        else:
            shutil.copyfile(os.path.join(home, name), target)
    return copied, skipped


def report_copied(found: tuple[list[str], list[str]]) -> None:
    copied, skipped = found
    if copied:
        print(f"copied {len(copied)} file(s) beside the tensors: {', '.join(copied)}")
    if skipped:
        print(f"not copied: {', '.join(skipped)}")


# --------------------------------------------------------------------------
# checks before anything is converted


def _kept_problem(layout: str, plan: _Plan) -> str | None:
    """Why a tensor kept unchanged cannot be written in `layout` as it is, or None."""
    leaf = plan.leaf
    fmt = leaf.format
    if layout in GGUF:
        kind = _gguf.gguf_type(fmt, leaf.scaling, leaf.dtype)
        if kind is not None and not (kind == "BF16" and not leaf.shape):
            return None
        what = leaf.dtype.name if fmt is None else f"{fmt.name} with {leaf.scaling}"
        return (
            f"kept as {what}, which has no GGUF type (GGUF holds float32, float16, bfloat16, "
            "signed integers and float64 as they are); convert them (--include) to a format "
            "GGUF holds"
        )
    if plan.reader.foreign or fmt is None:
        return None
    if leaf.scaling is None and getattr(fmt, "native_dtype", None) is not None:
        return None  # a float32, bfloat16, float16 or float8 tensor: stored as it is
    return (
        f"kept in this library's {fmt.name} encoding, which compressed-tensors does not hold "
        "as it is; convert the original checkpoint instead"
    )


def _refusal(layout: str, plan: _Plan) -> str | None:
    if plan.reason is not None:
        return _kept_problem(layout, plan)
    out = plan.out
    assert out.format is not None
    if layout == "compressed-tensors":
        return ct.refusal(plan.leaf.name, out.format, out.scaling, out.shape)
    return _gguf.refusal(plan.leaf.name, out.format, out.scaling, out.shape)


def _model_config(source: Source, dst: str | None) -> dict[str, Any]:
    """The `config.json` of the model directory compressed-tensors needs (usage errors
    for another input or output), refused when the model is quantized already."""
    home = model_directory(source)
    if home is None or not os.path.isfile(os.path.join(home, "config.json")):
        raise UsageError(
            f"--layout compressed-tensors writes a Hugging Face model directory with its "
            f"config.json: give IN as the model's directory (with config.json), not "
            f"{source.path}"
        )
    if dst is not None and dst.endswith(".safetensors"):
        raise UsageError(
            f"--layout compressed-tensors writes a directory: name OUT {dst!r} without .safetensors"
        )
    path = os.path.join(home, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError as exc:
        raise SaveError(f"{path} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise SaveError(f"{path} holds {type(config).__name__}, not a JSON object")
    if "quantization_config" in config:
        raise SaveError(
            f"{home}/config.json already has a quantization_config: this model is "
            "quantized; convert the original (unquantized) checkpoint"
        )
    return config


def _keep_for_readers(plans: list[_Plan], model: ct.Model) -> list[_Plan]:
    """`plans` with what compressed-tensors' readers would not quantize kept in float,
    refused when that leaves nothing quantized, and refused when no `ignore` list can
    tell the kept modules from the quantized ones."""
    out: list[_Plan] = []
    kept: dict[str, list[str]] = {}
    for plan in plans:
        leaf = plan.leaf
        reason = None if plan.reason is not None else ct.not_linear(leaf.name, leaf.shape, model)
        if reason is None:
            out.append(plan)
            continue
        out.append(_Plan(plan.reader, plan.leaf, plan.leaf, reason))
        kept.setdefault(reason, []).append(plan.leaf.name)
    if kept and all(p.reason is not None for p in out):
        raise SaveError(
            "--layout compressed-tensors would quantize none of the tensors asked for: "
            + _grouped(kept)
            + "; nothing is left to quantize (--layout precision holds them all)"
        )
    try:
        _ignore(out, model)
    except ValueError as exc:
        raise SaveError(f"--layout compressed-tensors: {exc}") from None
    return out


def _ignore(plans: list[_Plan], model: ct.Model) -> list[str]:
    """The `ignore` entries of the modules whose weights `plans` keep in float."""
    quantized: list[str] = []
    kept: list[str] = []
    for plan in plans:
        if plan.leaf.name.endswith(".weight"):
            module = plan.leaf.name[: -len(".weight")]
            (quantized if plan.reason is None else kept).append(module)
    return ct.ignore_list(quantized, kept, model)


def _loading_notes(plans: list[_Plan], config: dict[str, Any]) -> list[str]:
    """What to know to load the compressed-tensors output (printed by `convert`)."""
    notes = []
    kept = sum(p.reason is not None and p.leaf.name.endswith(".weight") for p in plans)
    if kept:
        notes.append(
            f"the {kept} weight(s) kept in float are listed, by module, in config.json's "
            "quantization_config.ignore"
        )
    dtype = config.get("dtype", config.get("torch_dtype"))
    if dtype != "bfloat16" and any(
        p.reason is None and p.out.format is not None and ct.decompressed_in_bfloat16(p.out.format)
        for p in plans
    ):
        notes.append(
            f"mxfp4 weights decompress to bfloat16 in transformers: load this "
            f"{dtype or 'float32'} model with dtype=torch.bfloat16 (in {dtype or 'float32'} "
            "its forward fails: 'expected m1 and m2 to have the same dtype')"
        )
    return notes


def _grouped(names_by_reason: dict[str, list[str]]) -> str:
    """`tensor 'a': why; 3 tensors 'b', 'c', 'd': why`, the first three of each named."""
    parts = []
    for problem, names in names_by_reason.items():
        shown = ", ".join(repr(n) for n in names[:3])
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        what = "tensor" if len(names) == 1 else f"{len(names)} tensors"
        parts.append(f"{what} {shown}{more}: {problem}")
    return "; ".join(parts)


def fit(
    layout: str, plans: list[_Plan], source: Source, dst: str | None, args: argparse.Namespace
) -> tuple[list[_Plan], list[str]]:
    """`plans` fitted to `layout` before anything is converted, and the notes to print.

    Usage errors for a model directory the layout needs; compressed-tensors keeps in
    float what its readers would not quantize (`_keep_for_readers`); then every tensor
    the layout cannot hold is refused, grouped by reason (`SaveError`, exit status 1
    like any data it refuses).
    """
    if layout == "precision":
        return plans, []
    notes: list[str] = []
    if layout == "compressed-tensors":
        config = _model_config(source, dst)
        plans = _keep_for_readers(plans, ct.Model.of(config))
        notes = _loading_notes(plans, config)
    if layout in GGUF:
        if args.max_shard_size is not None:
            raise UsageError(f"--layout {layout} writes one file: drop --max-shard-size")
        try:
            import gguf  # noqa: F401 (written through it)
        except ImportError:
            raise ModuleNotFoundError(
                "--layout gguf needs the gguf package; install it with pip install "
                "'precision[gguf]'",
                name="gguf",
            ) from None
        if layout == "gguf":
            # llama.cpp's file: `_layout_gguf.prepare` checks each tensor as moved
            return plans, notes
    refused: dict[str, list[str]] = {}
    for plan in plans:
        problem = _refusal(layout, plan)
        if problem is not None:
            refused.setdefault(problem, []).append(plan.leaf.name)
    if refused:
        raise SaveError(f"--layout {layout} cannot hold " + _grouped(refused))
    return plans, notes


# --------------------------------------------------------------------------
# writing


def _whole(array: Any) -> np.ndarray:
    """An array given whole or as consecutive pieces, whole (one tensor in memory)."""
    if isinstance(array, np.ndarray):
        return array
    pieces = [np.array(p).reshape(-1) for p in array]
    return np.concatenate(pieces) if pieces else np.zeros(0)


def _ct_stream(
    plans: list[_Plan], modules: dict[int, ct.Module], converter: _Converter
) -> Iterator[tuple[str, Any]]:
    """The layout's arrays of every plan, in file order, from the converter's stream."""
    stream = converter.arrays(plans)
    for i, plan in enumerate(plans):
        module = modules.get(i)
        if module is None:
            for _ in plan.out.arrays():
                yield next(stream)
            continue
        # the codes first: a streamed conversion has its scales once they are written
        data = next(stream)[1]
        if module.bits:
            rows, cols = module.shape
            if (cols * module.bits) % 32 == 0 and not isinstance(data, np.ndarray):
                yield module.data[0], ct.streamed_words(data, module.bits)
            else:
                yield module.data[0], ct.to_words(_whole(data).reshape(rows, -1), cols, module.bits)
        else:
            yield module.data[0], data
        scale = _whole(next(stream)[1])
        yield module.scale[0], scale.reshape(module.scale[2]).view(module.scale[1])
        if module.format == "pack-quantized":
            yield f"{module.module}.weight_shape", np.array(module.shape, "<i8")


def _array_leaf(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Leaf:
    return Leaf(name, (("key", name),), "array", dtype, shape)


def _write_compressed_tensors(
    source: Source,
    plans: list[_Plan],
    converter: _Converter,
    dst: str,
    args: argparse.Namespace,
    metadata: dict[str, str],
) -> int:
    modules = {
        i: ct.module_of(p.leaf.name, p.out.format, p.out.scaling, p.out.shape)
        for i, p in enumerate(plans)
        if p.reason is None and p.out.format is not None and p.out.scaling is not None
    }
    leaves = []
    for i, plan in enumerate(plans):
        arrays = modules[i].arrays() if i in modules else plan.out.arrays()
        leaves += [_array_leaf(*a) for a in arrays]
    model = ct.Model.of(_model_config(source, None))
    ignore = _ignore(plans, model)
    config = {"quantization_config": ct.quantization_config(list(modules.values()), ignore)}
    meta = {**metadata, "format": "pt"}  # what transformers asks of a safetensors file
    temp = TempDirectory(dst, overwrite=args.overwrite)
    try:
        size = write_shards(
            temp.name,
            source.prefix,
            leaves,
            _ct_stream(plans, modules, converter),
            args.max_shard_size or DEFAULT_SHARD_BYTES,
            metadata=meta,
            index_metadata={},
            plain=True,
        )
        found = copy_files(source, temp.name, config)
        temp.commit()
    except BaseException:
        temp.discard()
        raise
    report_copied(found)
    return size


def _write_gguf(
    plans: list[_Plan],
    converter: _Converter,
    dst: str,
    args: argparse.Namespace,
    metadata: dict[str, str],
) -> int:
    tensors = []
    for plan in plans:
        leaf = plan.out
        kind = _gguf.gguf_type(leaf.format, leaf.scaling, leaf.dtype)
        assert kind is not None  # `check` refused the rest
        tensors.append((leaf.name, leaf.shape, kind))

    def produce() -> Iterator[np.ndarray]:
        stream = converter.arrays(plans)
        for plan, (_, _, kind) in zip(plans, tensors, strict=True):
            arrays = [_whole(a) for _, a in (next(stream) for _ in plan.out.arrays())]
            if len(arrays) >= 2:  # codes, scales (and Q4_0's zero points as uint4)
                yield _gguf.block_bytes(kind, *arrays)
            else:
                yield arrays[0]

    meta = {f"{PROG}.{key}": value for key, value in metadata.items() if key == "converted_by"}
    return _gguf.write_file(
        dst, tensors, produce(), metadata=meta, overwrite=args.overwrite, guard=deferred_interrupts
    )


def write_layout(
    source: Source,
    plans: list[_Plan],
    converter: _Converter,
    dst: str,
    args: argparse.Namespace,
    metadata: dict[str, str],
) -> int:
    """Write the converted checkpoint in `args.layout` (checked by `check`); the bytes written."""
    if args.layout in GGUF:
        return _write_gguf(plans, converter, dst, args, metadata)
    return _write_compressed_tensors(source, plans, converter, dst, args, metadata)
