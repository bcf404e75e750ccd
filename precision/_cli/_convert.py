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
import dataclasses
import math
import os
import re
import sys

import numpy as np

import dtypes

from .._checkpoint._io import write
from .._checkpoint._layout import Leaf
from .._checkpoint._source import Source
from .._keep import KEEP
from ._convert_engine import _HOW, _Converter, _Engine, _mode, _Plan

# the tests reach these through this module
from ._convert_engine import _Blocks as _Blocks
from ._convert_engine import _widened as _widened
from ._files import (
    DEFAULT_SHARD_BYTES,
    leaf_nbytes,
    plan_shards,
    shard_names,
    write_index,
)
from ._interrupts import deferred_interrupts, import_jax
from ._layouts import check as _check_layout
from ._layouts import copy_files, report_copied, write_layout
from ._output import PROG, _DataError, _fmt_db, _human, _progress, _table, _UsageError
from ._temp_directory import TempDirectory, recover_leftovers

#: What `--keep` keeps by default for formats of 8 bits or fewer: norms,
#: biases and embeddings (`precision.quantize`'s default, defined there).
DEFAULT_KEEP = KEEP

#: SQNR below which a converted tensor is reported with a warning (see
#: docs/cli.md, "Reading SQNR": below ~15 dB a tensor keeps less than
#: about 97% of its signal energy and models visibly degrade).
DEFAULT_WARN_SQNR = 15.0


# --------------------------------------------------------------------------
# arguments resolved against the registry


def _format(text: str) -> dtypes.Format:
    try:
        fmt = dtypes.get(text)
    except (ValueError, TypeError) as exc:
        raise _UsageError(f"--to: {exc}") from None
    if fmt.bits > 32:
        raise _UsageError(
            f"--to {text}: {fmt.name} is wider than the float32 values a checkpoint holds, so "
            "converting to it gains nothing; choose float32 or a narrower format (see "
            "'precision formats')"
        )
    return fmt


# The short names `--scaling` suggests for each scale format (any name that
# dtypes.get resolves to one of dtypes.SCALE_FORMATS is accepted).
_SCALE_SHORT = {
    "float32": "f32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float8_e4m3fn": "e4m3",
    "float8_e8m0fnu": "e8m0",
}
_SCALE_ORDER = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e8m0fnu")


@dataclasses.dataclass(frozen=True)
class _ScalingText:
    """The fields of a `--scaling` text (already checked against the grammar)."""

    kind: str  # "none", "per-tensor", "per-axis" or "per-block"
    number: int | None  # the axis of per-axis, the size of per-block
    pow2: bool
    scales: str | None  # the scale format as typed, or None

    @classmethod
    def parse(cls, text: str) -> _ScalingText:
        parts = text.split(":")
        kind, rest = parts[0], parts[1:]
        number = int(rest.pop(0)) if kind in ("per-axis", "per-block") else None
        pow2 = bool(rest) and rest[0] == "pow2"
        if pow2:
            rest.pop(0)
        return cls(kind, number, pow2, rest[0] if rest else None)

    def __str__(self) -> str:
        fields = [self.kind]
        fields += [] if self.number is None else [str(self.number)]
        fields += ["pow2"] if self.pow2 else []
        fields += [] if self.scales is None else [self.scales]
        return ":".join(fields)

    def build(self, scale_format: str) -> dtypes.Scaling | None:
        """The dtypes scaling; raises what dtypes raises for a refused combination."""
        if self.kind == "none":
            return None
        if self.kind == "per-tensor":
            return dtypes.PerTensor(power_of_two=self.pow2, scale_format=scale_format)
        assert self.number is not None
        if self.kind == "per-axis":
            return dtypes.PerAxis(self.number, power_of_two=self.pow2, scale_format=scale_format)
        return dtypes.PerBlock(self.number, power_of_two=self.pow2, scale_format=scale_format)


def _scale_format(word: str, text: str) -> str:
    """The scale format `word` names (a name or alias of one of dtypes.SCALE_FORMATS)."""
    try:
        name: str | None = dtypes.get(word).name
    except (ValueError, TypeError):
        name = None
    if name not in dtypes.SCALE_FORMATS:
        what = "is not a format" if name is None else f"names {name}, which is not a scale format"
        choices = ", ".join(f"{full} ({short})" for full, short in _SCALE_SHORT.items())
        raise _UsageError(
            f"--scaling {text}: {word!r} {what}; end --scaling with a scale format: {choices}"
        )
    return name


def _scaling(text: str | None, fmt: dtypes.Format) -> dtypes.Scaling | None:
    """The scaling of `--scaling` (already checked against the grammar), or the preset.

    A named composition keeps the scale format of its own scaling unless the
    text names one (`--to mxfp4 --scaling per-block:64:pow2` stores E8M0
    scales per 64 values); anything else stores float32 scales unless told.

    Examples:
        >>> print(_scaling("per-block:128:bf16", dtypes.get("int4")))
        per-block 128 on axis -1, bfloat16 scales
        >>> print(_scaling("per-block:64:pow2", dtypes.get("mxfp4")))
        per-block 64 on axis -1, power of two, float8_e8m0fnu scales
    """
    default = fmt.default_scaling()
    if text is None:
        narrow_int = fmt.kind in ("int", "uint") and fmt.bits <= 4
        if narrow_int and not isinstance(default, dtypes.PerBlock):
            # Narrow integers need small groups: per tensor, one outlier
            # takes the whole range (int4 on GPT-2's wte: 12 dB vs 20 dB).
            return dtypes.PerBlock(32)
        return default
    spec = _ScalingText.parse(text)
    if spec.scales is not None:
        scale_format = _scale_format(spec.scales, text)
    else:
        scale_format = "float32" if default is None else default.scale_format
    try:
        return spec.build(scale_format)
    except (ValueError, TypeError) as exc:
        where = f"--scaling {text} with --to {fmt.name}"
        fix = _working_scaling(fmt, spec, scale_format)
        raise _UsageError(f"{where}: {_first_sentence(exc)}{fix}") from None


def _probe(scaling: dtypes.Scaling) -> np.ndarray:
    """Ones of the smallest shape `scaling` fits: one block, or one index per axis."""
    axis = int(getattr(scaling, "axis", 0))
    ndim = axis + 1 if axis >= 0 else -axis
    shape = [1] * ndim
    if isinstance(scaling, dtypes.PerBlock):
        shape[axis] = int(scaling.size)
    return np.ones(shape, np.float32)


def _refusal(fmt: dtypes.Format, scaling: dtypes.Scaling | None) -> BaseException | None:
    """Why `fmt` refuses `scaling` (asked of the format with a one-block probe), or None."""
    if scaling is None:
        return None
    probe = _probe(scaling)
    check = getattr(fmt, "check", None)
    try:
        if check is not None:
            check(probe, scaling=scaling)
        else:  # pragma: no cover - before Format.check existed
            fmt.encode(probe, scaling=scaling)
    except (ValueError, TypeError) as exc:
        return exc
    return None


def _working_scaling(fmt: dtypes.Format, spec: _ScalingText, scale_format: str) -> str:
    """`; write --scaling X instead` for the nearest text `fmt` takes, or "" if none.

    Nearest: the same text with :pow2 toggled, then each other scale format
    (16-bit ones first) with the same :pow2, then with it toggled. The
    formats themselves decide, not a copy of their rules.
    """
    others = [s for s in _SCALE_ORDER if s != scale_format]
    candidates = [(not spec.pow2, scale_format)]
    candidates += [(p, s) for p in (spec.pow2, not spec.pow2) for s in others]
    for pow2, scales in candidates:
        named = spec.scales is not None or scales != scale_format
        short = _SCALE_SHORT[scales] if named else None
        other = dataclasses.replace(spec, pow2=pow2, scales=short)
        try:
            scaling = other.build(scales)
        except (ValueError, TypeError):
            continue
        if _refusal(fmt, scaling) is None:
            return f"; write --scaling {other} instead"
    return ""


def _check_pair(
    fmt: dtypes.Format, scaling: dtypes.Scaling | None, text: str | None, rounding: str
) -> None:
    """Usage error unless `fmt` takes `scaling` and `rounding` (asked of the format itself)."""
    if fmt.kind in ("int", "uint", "codebook") and scaling is None:
        raise _UsageError(
            f"--to {fmt.name} --scaling none: {fmt.name} always needs a scaling; use --scaling "
            "per-tensor, per-axis:AXIS or per-block:SIZE"
        )
    if scaling is None:
        return
    refused = _refusal(fmt, scaling)
    if refused is not None:
        where = f"--scaling {text}" if text else f"the default scaling {scaling}"
        fix = ""
        if text:
            fix = _working_scaling(fmt, _ScalingText.parse(text), scaling.scale_format)
        raise _UsageError(f"--to {fmt.name} with {where}: {_first_sentence(refused)}{fix}")
    if fmt.kind not in ("float", "int"):
        # Code books, asymmetric integers and E8M0 round in fewer modes: ask the
        # format with one value, so a refused mode is a usage error up front.
        import jax

        key = jax.random.key(0) if rounding == "stochastic" else None
        try:
            fmt.encode(_probe(scaling), scaling=scaling, rounding=rounding, key=key)
        except (ValueError, TypeError) as exc:
            raise _UsageError(
                f"--to {fmt.name} with --rounding {rounding}: {_first_sentence(exc)}"
            ) from None


def _first_sentence(exc: BaseException) -> str:
    return " ".join(str(exc).split())


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
        raise _UsageError(f"--keep: bad regular expression {keep_text!r}: {exc}") from None
    return _Rules(args.include, args.exclude, keep, label)


def _fits(scaling: dtypes.Scaling, shape: tuple[int, ...]) -> bool:
    try:
        scaling.validate(shape)
    except (ValueError, TypeError):
        return False
    return True


def _plan(
    source: Source,
    fmt: dtypes.Format,
    scaling: dtypes.Scaling | None,
    rules: _Rules,
    rounding: str,
) -> list[_Plan]:
    plans = []
    for reader, leaf in source.items:
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
    if os.path.lexists(dst):
        same = os.path.exists(src) and os.path.samefile(src, dst)
        if same and not overwrite:
            raise _DataError(
                f"refusing to convert {src} onto itself; pass --overwrite to replace it (the "
                "original stays intact until the converted checkpoint is complete)"
            )
        if not overwrite:
            raise _DataError(f"{dst} already exists; pass --overwrite to replace it")


def _cmd_convert(args: argparse.Namespace) -> int:
    fmt = _format(args.to)
    if args.rounding not in dtypes.ROUNDING_MODES:
        raise _UsageError(
            f"--rounding: unknown rounding mode {args.rounding!r}; choose one of "
            + ", ".join(dtypes.ROUNDING_MODES)
        )
    scaling = _scaling(args.scaling, fmt)
    _check_pair(fmt, scaling, args.scaling, args.rounding)
    if args.list_keep:
        print(DEFAULT_KEEP)
        return 0
    rules = _rules(args, fmt)
    if args.output is None and not args.dry_run:
        raise _UsageError("the following arguments are required: -o/--output (or --dry-run)")
    src, dst = args.input, args.output
    if dst is not None and not args.dry_run:
        for line in recover_leftovers(dst):  # of conversions to dst that were killed
            _warn(line)
        _check_paths(src, dst, args.overwrite)
    with Source(src) as source:
        plans = _plan(source, fmt, scaling, rules, args.rounding)
        _warn_rules(plans, args, rules)
        _check_layout(args.layout, plans, source, dst, args)
        converted = [p for p in plans if p.reason is None]
        if args.dry_run:
            _print_plan(plans)
            _summary(plans, fmt, scaling, source, None, None, dry=True)
            return 0
        assert dst is not None
        if not converted:
            reasons = _reasons(plans)
            raise _UsageError(
                f"nothing to convert to {fmt.name}: every tensor would be kept ("
                + "; ".join(f"{n}: {r}" for r, n in reasons)
                + "); check --include/--exclude/--keep/--scaling, or see --dry-run"
            )
        if any(p.reason is None and p.mode not in ("cast", "intcast") for p in plans):
            import_jax()  # (numpy casts need no JAX: they start in a fraction of the time)
        engine = _Engine(fmt, scaling, args.rounding, stats=not args.no_stats)
        total = sum(p.leaf.data_dtype.itemsize * math.prod(p.leaf.shape) for p in plans)
        progress = _progress(total, args.quiet, "converting")
        converter = _Converter(engine, args.rounding, args.seed, progress)
        metadata = {**source.metadata, "converted_by": _provenance(args, fmt, scaling)}
        sharded = args.max_shard_size is not None or (
            (source.sharded or os.path.isdir(src)) and not dst.endswith(".safetensors")
        )
        try:
            if args.layout != "precision":
                size_out = write_layout(source, plans, converter, dst, args, metadata)
            elif sharded:
                size_out = _write_shards(source, plans, converter, dst, args, metadata)
            else:
                # without --overwrite the commit is an exclusive create: a file that
                # appeared at dst meanwhile (another convert) is never replaced
                size_out = write(
                    dst,
                    [p.out for p in plans],
                    converter.arrays(plans),
                    overwrite=args.overwrite,
                    metadata=metadata,
                    guard=deferred_interrupts,
                    mode=_source_mode(src),
                )
        finally:
            progress.close()
    _summary(plans, fmt, scaling, source, size_out, dst, dry=False)
    _report_sqnr(converter.sqnr, args)
    return 0


def _write_shards(
    source: Source,
    plans: list[_Plan],
    converter: _Converter,
    dst: str,
    args: argparse.Namespace,
    metadata: dict[str, str],
) -> int:
    limit = args.max_shard_size or DEFAULT_SHARD_BYTES
    groups = plan_shards([p.out for p in plans], limit)
    names = shard_names(source.prefix, len(groups))
    files = source.files()
    file_mode = _source_mode(files[0]) if files else None
    dir_mode = _source_mode(source.path) if os.path.isdir(source.path) else None
    temp = TempDirectory(dst, overwrite=args.overwrite, mode=dir_mode)
    try:
        weight_map: dict[str, str] = {}
        total = 0
        produced = converter.arrays(plans)
        size = 0
        for name, group in zip(names, groups, strict=True):
            leaves = [plans[i].out for i in group]
            count = sum(len(leaf.arrays()) for leaf in leaves)
            pieces = (next(produced) for _ in range(count))
            size += write(
                os.path.join(temp.name, name),
                leaves,
                pieces,
                overwrite=False,
                metadata=metadata,
                mode=file_mode,
            )
            for leaf in leaves:
                for array, _, _ in leaf.arrays():
                    weight_map[array] = name
                total += leaf_nbytes(leaf)
        index_meta = {k: v for k, v in source.index_metadata.items() if k != "total_size"}
        write_index(
            os.path.join(temp.name, f"{source.prefix}.safetensors.index.json"),
            weight_map,
            total,
            index_meta,
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
    where = f" ({scaling})" if scaling is not None else ""
    verb = ("would convert", "keep") if dry else ("converted", "kept")
    tail = "" if dry else f"; wrote {dst}"
    print(
        f"{verb[0]} {len(converted)} tensor(s) to {fmt.name}{where}, {verb[1]} {kept} "
        f"unchanged{tail}"
    )
    for reason, count in _reasons(plans):
        print(f"  {verb[1]} {count}: {reason}")
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
