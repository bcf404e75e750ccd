"""`precision convert`: a checkpoint converted to another format, streamed in blocks.

What each tensor becomes is decided first (`_plan`: matched rule or the
reason it is kept), so `--dry-run` prints exactly what a conversion would
do. This module holds the command: its arguments resolved against the
registry, the plan, the written checkpoint (one file or shards) and the
summary. The conversion itself, the modes a tensor is converted in and
the compiled encodes with their statistics, is in `_convert_engine`.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import errno
import json
import math
import os
import re
import sys

import numpy as np

import dtypes

from .._checkpoint import _compressed_tensors as ct
from .._checkpoint import _q4_0
from .._checkpoint._io import write
from .._checkpoint._layout import Leaf
from .._checkpoint._source import Source
from .._errors import UsageError
from .._kept_in_float32 import KEEP
from ._arguments import _check_pair, _format, _scaling, cli_text, resolve_preset
from ._convert_engine import _Converter, _Engine, _no_specials
from ._convert_modes import _HOW, _NUMPY_MODES, _mode, _Plan, _raw
from ._convert_stats import _widened as _widened
from ._files import DEFAULT_SHARD_BYTES, leaf_nbytes, write_shards
from ._interrupts import deferred_interrupts, import_jax
from ._layout_gguf import Prepared
from ._layout_gguf import prepare as _prepare_gguf
from ._layout_gguf import write as _write_gguf
from ._output import PROG, _fmt_db, _human, _progress, _table
from ._output_layouts import GGUF, copy_files, fit, report_copied, write_layout

# the tests reach these through this module
from ._stored_blocks import _Blocks as _Blocks
from ._temp_directory import TempDirectory, recover_leftovers

#: What `--keep` keeps by default for formats of 8 bits or fewer: norms,
#: biases and embeddings (`precision.quantize`'s default, defined there).
DEFAULT_KEEP = KEEP

#: SQNR below which a converted tensor is reported with a warning (see
#: docs/cli.md, "Reading SQNR": below ~15 dB a tensor keeps less than
#: about 97% of its signal energy and models visibly degrade).
DEFAULT_WARN_SQNR = 15.0


# --------------------------------------------------------------------------
# the plan


@dataclasses.dataclass
class _Rules:
    include: re.Pattern[str] | None
    exclude: re.Pattern[str] | None
    keep: re.Pattern[str] | None
    keep_text: str


def _rules(args: argparse.Namespace, fmt: dtypes.Format) -> _Rules:
    keep_text = args.keep
    if keep_text is None:
        keep_text = DEFAULT_KEEP if fmt.bits <= 8 else "none"
        label = "default" if fmt.bits <= 8 else "none"
    else:
        label = keep_text
    if keep_text.strip().lower() in ("none", ""):
        return _Rules(args.include, args.exclude, None, "none")
    try:
        keep = re.compile(keep_text, re.IGNORECASE)
    except re.error as exc:
        raise UsageError(f"--keep: bad regular expression {keep_text!r}: {exc}") from None
    return _Rules(args.include, args.exclude, keep, label)


def _fits(scaling: dtypes.Scaling, shape: tuple[int, ...]) -> bool:
    try:
        scaling.validate(shape)
    except (ValueError, TypeError):
        return False
    return True


def _model_beside(source: Source) -> ct.Model | None:
    """What the `config.json` beside the tensors (in the model's directory, or beside the
    one file given) says of the model, or None where there is none."""
    home = source.path if os.path.isdir(source.path) else os.path.dirname(source.path)
    try:
        with open(os.path.join(home or ".", "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return ct.Model.of(config) if isinstance(config, dict) else None


def _on_conv1d(scaling: dtypes.Scaling) -> dtypes.Scaling:
    """The default `scaling` of a Conv1D weight, stored (in, out): a scale per output
    channel (axis 1), blocks along the inputs (axis 0), as a Linear layer's (out, in)
    weight gets them from per-axis:0 and per-block on axis -1."""
    if isinstance(scaling, dtypes.PerAxis) and scaling.axes == (0,):
        return dataclasses.replace(scaling, axis=1)
    if isinstance(scaling, dtypes.PerBlock) and scaling.axis in (-1, 1):
        return dataclasses.replace(scaling, axis=0)
    return scaling


def _default_scaling(
    whole: dtypes.Scaling | None, leaf: Leaf, model: ct.Model | None
) -> dtypes.Scaling | None:
    """A tensor's scaling when none is given: per tensor for fewer than two axes where the
    default is per axis (a scale per value would hold more bytes than the float32
    values); a Conv1D weight's turned to its outputs (`_on_conv1d`) where it fits."""
    if isinstance(whole, dtypes.PerAxis) and len(leaf.shape) < 2:
        return dtypes.PerTensor(scale_format=whole.scale_format)
    if whole is None or model is None or len(leaf.shape) != 2 or not ct.conv1d(leaf.name, model):
        return whole
    turned = _on_conv1d(whole)
    return turned if _fits(turned, leaf.shape) else whole


def _plan(
    source: Source,
    fmt: dtypes.Format,
    scaling: dtypes.Scaling | None,
    rules: _Rules,
    rounding: str,
    *,
    default: bool = False,
) -> list[_Plan]:
    """What each tensor becomes, and why. With the `default` scaling, each tensor's is
    `_default_scaling`'s, read with the model's `config.json` where there is one."""
    plans = []
    whole = scaling
    model = _model_beside(source) if default else None
    for reader, leaf in source.items:
        scaling = _default_scaling(whole, leaf, model) if default else whole
        reason = None
        if rules.include is not None and not rules.include.search(leaf.name):
            reason = "not included (--include)"
        elif rules.exclude is not None and rules.exclude.search(leaf.name):
            reason = "excluded (--exclude)"
        elif rules.keep is not None and rules.keep.search(leaf.name):
            reason = f"kept (--keep {rules.keep_text})"
        elif leaf.kind == "array" and leaf.dtype.name not in ("float32", "float16", "bfloat16"):
            reason = f"{leaf.dtype.name} array"
        elif leaf.kind == "tensor" and leaf.dtype != np.float32:
            reason = f"{leaf.dtype.name} tensor"
        elif scaling is not None and leaf.shape and not _fits(scaling, leaf.shape):
            reason = f"{scaling} does not fit shape {list(leaf.shape)}"
        elif scaling is not None and not leaf.shape and not isinstance(scaling, dtypes.PerTensor):
            reason = f"{scaling} does not fit a scalar"
        if reason is not None:
            plans.append(_Plan(reader, leaf, leaf, reason))
            continue
        full = fmt.is_full_precision and scaling is None
        out_fmt = dtypes.float32 if full else fmt
        out = Leaf.tensor(leaf.name, leaf.path, np.dtype(np.float32), leaf.shape, out_fmt, scaling)
        plan = _Plan(reader, leaf, out, None)
        plan.mode, plan.note = _mode(plan, rounding)
        plans.append(plan)
    return plans


def _say_turned(plans: list[_Plan], scaling: dtypes.Scaling | None, source: Source) -> None:
    """Say how many Conv1D weights the default `scaling` turned to their outputs, and the
    `--scaling` that keeps theirs as every other tensor's."""
    turned = collections.Counter(
        p.out.scaling
        for p in plans
        if p.reason is None and len(p.leaf.shape) == 2 and p.out.scaling != scaling
    )
    model = _model_beside(source)
    for how, count in turned.items():
        blocks = isinstance(how, dtypes.PerBlock)
        what = "blocks along the inputs" if blocks else "a scale per output channel"
        other = "blocks their outputs" if blocks else "scales each input"
        print(
            f"{what}: {count} Conv1D weight(s) of {model.model_type if model else 'the model'}, "
            f"stored inputs x outputs, take {how} (--scaling {cli_text(scaling)} {other})"
        )


# --------------------------------------------------------------------------
# the command


def _describe(plan: _Plan) -> str:
    out = plan.out
    if plan.reason is not None:
        return "unchanged"
    assert out.format is not None
    return out.format.name + ("" if out.scaling is None else f" ({out.scaling})")


def _print_plan(plans: list[_Plan]) -> None:
    rows = []
    for p in plans:
        stored = p.leaf.format.name if p.leaf.format is not None else p.leaf.dtype.name
        why = p.reason if p.reason is not None else "converted"
        how = "copied" if p.reason is not None else _HOW[p.mode]
        rows.append(
            [
                p.leaf.name,
                "x".join(map(str, p.leaf.shape)) or "scalar",
                stored,
                _describe(p),
                _human(leaf_nbytes(p.out)),
                why,
                how + (f" ({p.note})" if p.note else ""),
            ]
        )
    header = ["tensor", "shape", "stored", "becomes", "size", "why", "how"]
    print(_table(rows, header, right={4}))


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def _warn_rules(plans: list[_Plan], args: argparse.Namespace, rules: _Rules) -> None:
    names = [p.leaf.name for p in plans]
    for flag, pattern in (("--include", rules.include), ("--exclude", rules.exclude)):
        if pattern is not None and not any(pattern.search(n) for n in names):
            _warn(f"{flag} {pattern.pattern!r} matches no tensor")
    if args.keep is not None and rules.keep is not None:
        if not any(rules.keep.search(n) for n in names):
            _warn(f"--keep {args.keep!r} matches no tensor")


def _source_mode(src: str) -> int | None:
    """The input's permission bits, which a new output takes (a 0600 input stays private)."""
    try:
        return os.stat(src).st_mode & 0o777
    except OSError:
        return None


def _check_paths(src: str, dst: str, overwrite: bool) -> None:
    if not os.path.exists(src):  # (said first: an existing output is no news then)
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", src)
    if os.path.lexists(dst):
        same = os.path.exists(src) and os.path.samefile(src, dst)
        if same and not overwrite:
            raise FileExistsError(
                f"refusing to convert {src} onto itself; pass --overwrite to replace it (the "
                "original stays intact until the converted checkpoint is complete)"
            )
        if not overwrite:
            raise FileExistsError(f"{dst} already exists; pass --overwrite to replace it")


def _target(args: argparse.Namespace) -> tuple[dtypes.Format, dtypes.Scaling | None, str | None]:
    """The format and scaling that `--preset`, `--to` and `--scaling` ask for, checked with
    `--rounding`, and the scaling as typed (None: none given, the default applies)."""
    to, scaling_text = resolve_preset(args.preset, args.to, args.scaling)
    if args.input is None:
        raise UsageError("the following arguments are required: IN (the checkpoint to read)")
    fmt = _format(to)
    if args.rounding not in dtypes.ROUNDING_MODES:
        raise UsageError(
            f"--rounding: unknown rounding mode {args.rounding!r}; choose one of "
            + ", ".join(dtypes.ROUNDING_MODES)
        )
    if scaling_text is None and args.layout in GGUF and fmt.name in ("int8", "int4"):
        scaling_text = "per-block:32:fp16"  # ggml's Q8_0 and Q4_0: the only scales GGUF holds
    scaling = _scaling(scaling_text, fmt)
    _check_pair(fmt, scaling, scaling_text, args.rounding)
    return fmt, scaling, scaling_text


def _cmd_convert(args: argparse.Namespace) -> int:
    if args.list_keep:
        print(DEFAULT_KEEP)
        return 0
    fmt, scaling, scaling_text = _target(args)
    rules = _rules(args, fmt)
    if args.output is None and not args.dry_run:
        raise UsageError("the following arguments are required: -o/--output (or --dry-run)")
    src, dst = args.input, args.output
    if dst is not None and not args.dry_run:
        for line in recover_leftovers(dst):  # of conversions to dst that were killed
            _warn(line)
        _check_paths(src, dst, args.overwrite)
    with Source(src) as source:
        default = scaling_text is None and args.layout == "precision"
        plans = _plan(source, fmt, scaling, rules, args.rounding, default=default)
        _say_turned(plans, scaling, source)
        _warn_rules(plans, args, rules)
        plans, notes = fit(args.layout, plans, source, dst, args)
        prepared = _prepare_gguf(plans, source, args) if args.layout == "gguf" else None
        if prepared is not None:  # llama.cpp's tensors: renamed, moved, norms in float32
            plans = prepared.plans
        converted = [p for p in plans if p.reason is None]
        if args.dry_run:
            _print_plan(plans)
            _summary(plans, fmt, scaling, source, None, None, dry=True)
            _print_notes(notes, args.layout)
            return 0
        assert dst is not None
        if not converted and prepared is None:  # (llama.cpp's file of stored codes is one)
            raise _nothing_to_convert(plans, fmt)
        if any(p.reason is None and p.mode not in _NUMPY_MODES for p in plans):
            import_jax()  # (numpy casts need no JAX: they start in a fraction of the time)
        engine = _Engine(fmt, scaling, args.rounding, stats=not args.no_stats)
        total = sum(p.leaf.data_dtype.itemsize * math.prod(p.leaf.shape) for p in plans)
        progress = _progress(total, args.quiet, "converting")
        converter = _Converter(engine, args.rounding, args.seed, progress)
        metadata = {**source.metadata, "converted_by": _provenance(args, fmt, scaling)}
        try:
            size_out = _write(prepared, source, plans, converter, dst, args, metadata)
        except dtypes.NonFiniteError as err:
            if converter.refused is None:
                raise
            raise _every_non_finite(err, converter.refused, plans) from None
        finally:
            progress.close()
    _summary(plans, fmt, scaling, source, size_out, dst, dry=False)
    _print_notes(notes, args.layout)
    _report_sqnr(converter.sqnr, args)
    return 0


def _every_non_finite(
    err: dtypes.NonFiniteError, first: str, plans: list[_Plan]
) -> dtypes.NonFiniteError:
    """`err` (tensor `first` holds NaN or inf) naming every other converted tensor that
    would be refused for the same reason, and the `--exclude` that keeps them all: the
    user fixes the command once, not once a tensor. Read only now, on refusal
    (stored-encoded inputs are not searched: decoding them needs the compiled path)."""
    others = [
        p.leaf.name
        for p in plans
        if p.reason is None
        and p.leaf.name != first
        and (p.out.scaling is not None or _no_specials(p))
        and _raw(p.leaf, p.reader.foreign)
        and _holds_non_finite(p)
    ]
    if not others:
        return err
    listed = ", ".join(repr(n) for n in others[:5])
    more = f" and {len(others) - 5} more" if len(others) > 5 else ""
    pattern = "^(" + "|".join(re.escape(n) for n in [first, *others]) + ")$"
    return dtypes.NonFiniteError(
        f"{err} (so do {listed}{more}: --exclude '{pattern}' keeps all {len(others) + 1})",
        rule=err.rule,
    )


def _holds_non_finite(plan: _Plan) -> bool:
    return any(
        not np.all(np.isfinite(np.asarray(block, np.float32)))
        for block in _Blocks(plan.reader, plan.leaf.name)
    )


def _nothing_to_convert(plans: list[_Plan], fmt: dtypes.Format) -> UsageError:
    """The refusal of a conversion that would keep every tensor, with why each is kept."""
    return UsageError(
        f"nothing to convert to {fmt.name}: every tensor would be kept ("
        + "; ".join(f"{n}: {r}" for r, n in _reasons(plans))
        + "); check --include/--exclude/--keep/--scaling, or see --dry-run"
    )


def _write(
    prepared: Prepared | None,
    source: Source,
    plans: list[_Plan],
    converter: _Converter,
    dst: str,
    args: argparse.Namespace,
    metadata: dict[str, str],
) -> int:
    """The converted tensors written to `dst` in the layout asked for (llama.cpp's GGUF
    when `prepared`, another tool's layout, shards, or one file); returns the bytes."""
    src = args.input
    sharded = args.max_shard_size is not None or (
        (source.sharded or os.path.isdir(src)) and not dst.endswith(".safetensors")
    )
    if prepared is not None:
        return _write_gguf(prepared, converter, dst, args, metadata)
    if args.layout != "precision":
        return write_layout(source, plans, converter, dst, args, metadata)
    if sharded:
        return _write_shards(source, plans, converter, dst, args, metadata)
    # without --overwrite the commit is an exclusive create: a file that
    # appeared at dst meanwhile (another convert) is never replaced
    return write(
        dst,
        [p.out for p in plans],
        converter.arrays(plans),
        overwrite=args.overwrite,
        metadata=metadata,
        guard=deferred_interrupts,
        mode=_source_mode(src),
    )


def _print_notes(notes: list[str], layout: str) -> None:
    for note in notes:
        print(f"note ({layout}): {note}")


def _write_shards(
    source: Source,
    plans: list[_Plan],
    converter: _Converter,
    dst: str,
    args: argparse.Namespace,
    metadata: dict[str, str],
) -> int:
    files = source.files()
    file_mode = _source_mode(files[0]) if files else None
    dir_mode = _source_mode(source.path) if os.path.isdir(source.path) else None
    temp = TempDirectory(dst, overwrite=args.overwrite, mode=dir_mode)
    try:
        size = write_shards(
            temp.name,
            source.prefix,
            [p.out for p in plans],
            converter.arrays(plans),
            args.max_shard_size or DEFAULT_SHARD_BYTES,
            metadata=metadata,
            index_metadata={k: v for k, v in source.index_metadata.items() if k != "total_size"},
            mode=file_mode,
        )
        found = copy_files(source, temp.name)  # config.json, the tokenizer, ...
        temp.commit()
    except BaseException:
        temp.discard()
        raise
    report_copied(found)
    return size


def _provenance(
    args: argparse.Namespace, fmt: dtypes.Format, scaling: dtypes.Scaling | None
) -> str:
    where = "" if scaling is None else f" {scaling}"
    return f"precision convert --to {fmt.name}{where} --rounding {args.rounding}"


def _reasons(plans: list[_Plan]) -> list[tuple[str, int]]:
    reasons: dict[str, int] = {}
    for p in plans:
        if p.reason is not None:
            reasons[p.reason] = reasons.get(p.reason, 0) + 1
    return sorted(reasons.items())


def _summary(
    plans: list[_Plan],
    fmt: dtypes.Format,
    scaling: dtypes.Scaling | None,
    source: Source,
    size_out: int | None,
    dst: str | None,
    *,
    dry: bool,
) -> None:
    converted = [p for p in plans if p.reason is None]
    kept = len(plans) - len(converted)
    verb = ("would convert", "keep") if dry else ("converted", "kept")
    # the scalings the tensors were given (a layout may move some: GGUF's Conv1D blocks)
    given = collections.Counter(str(p.out.scaling) for p in converted if p.out.scaling)
    if len(given) > 1:
        where = " (" + "; ".join(f"{n} {s}" for s, n in given.most_common()) + ")"
    elif given:
        where = f" ({next(iter(given))})"
    else:
        where = f" ({scaling})" if scaling is not None and not converted else ""
    tail = "" if dry else f"; wrote {dst}"
    print(
        f"{verb[0]} {len(converted)} tensor(s) to {fmt.name}{where}, {verb[1]} {kept} "
        f"unchanged{tail}"
    )
    ggml = sum(p.reason is None and _q4_0.is_q4_0(p.out.format) for p in plans)
    if ggml:
        print(
            f"  Q4_0: {ggml} of them rounded as ggml's quantizer rounds, onto Q4_0's whole "
            "grid (codes -8..7 times max / -8 per block of 32)"
        )
    for reason, count in _reasons(plans):
        # ("kept 2: --keep default", not "kept 2: kept (--keep default)")
        shown = reason[6:-1] if reason.startswith("kept (") and reason.endswith(")") else reason
        print(f"  {verb[1]} {count}: {shown}")
    size_in = source.nbytes
    if size_out is None:
        size_out = sum(leaf_nbytes(p.out) for p in plans)
        label = "tensor bytes"
        size_in = sum(leaf_nbytes(p.leaf) for p in plans)
    else:
        label = "bytes"
    ratio = size_out / size_in if size_in else 1.0
    print(f"{label}: {_human(size_in)} -> {_human(size_out)} ({ratio:.1%})")


def _report_sqnr(sqnr: dict[str, float], args: argparse.Namespace) -> None:
    if not sqnr:
        return
    worst = min(sqnr.items(), key=lambda kv: (kv[1], kv[0]))
    print(f"worst SQNR: {_fmt_db(worst[1])} dB ({worst[0]})")
    threshold = DEFAULT_WARN_SQNR if args.warn_sqnr is None else args.warn_sqnr
    low = sorted((db, name) for name, db in sqnr.items() if db < threshold)
    if low:
        shown = ", ".join(f"{name} {_fmt_db(db)} dB" for db, name in low[:5])
        more = f" and {len(low) - 5} more" if len(low) > 5 else ""
        _warn(
            f"{len(low)} tensor(s) below {threshold:g} dB SQNR: {shown}{more} (see docs/cli.md, "
            "'Reading SQNR'; try a wider format, smaller --scaling blocks, or --keep)"
        )
