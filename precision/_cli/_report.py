"""`precision report`: two checkpoints compared tensor by tensor, streamed.

One pair of tensors is in memory at a time (REF's logical float32 values and
OTHER's storage plus its decoded values), and the statistics are taken in
slices of `_CHUNK` values in float64, so the peak stays under three times the
largest tensor. What the plot needs is kept per tensor as a fixed-size
histogram, never as the errors themselves.

Columns (docs/cli.md, "Reading a report"): SQNR in dB over the finite
values (-inf when a value became NaN or inf); `max err/absmax`, the largest
error relative to the tensor's largest magnitude (unlike an elementwise
relative error it is not 1 for every value that rounds to zero); `mean abs
err`; `NaN/inf`, how many values are not finite in OTHER and how many of
those are new. The JSON output also carries the elementwise relative errors.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np

import dtypes

from .._checkpoint._gguf import is_gguf
from .._checkpoint._io import encoded
from .._checkpoint._layout import Leaf
from .._checkpoint._reader import Reader
from .._checkpoint._source import Source
from .._errors import CheckpointError, UsageError
from ._files import leaf_nbytes
from ._interrupts import check_interrupt, import_jax
from ._output import (
    PROG,
    _fmt_db,
    _human,
    _natural_key,
    _progress,
    _require,
    _table,
)
from ._report_gguf import list_gguf

_CHUNK = 1 << 18  # values per slice of the statistics

# Error histograms: |error| / max |ref| of the tensor, one bin per power of
# two from 2**-40 (the first bin also counts everything below) to 2**1 (the
# last bin also counts everything above).
_LOW_EXPONENT = -39
_BINS = 41
_EDGES = 2.0 ** np.arange(_LOW_EXPONENT - 1, _LOW_EXPONENT - 1 + _BINS + 1)

#: Bars shown in the plot's SQNR chart (the worst ones).
_PLOT_BARS = 40
#: Tensors drawn one by one in the histogram panel (the worst ones).
_PLOT_LINES = 6


class _Accumulator:
    """Error statistics of one tensor whose largest finite |ref| is `absmax`, fed by slices.

    Sums are float64 (squares of float32 values neither overflow nor
    underflow there); the histogram counts |error| / absmax by power of two.
    """

    def __init__(self, absmax: float) -> None:
        self.absmax = absmax
        self.size = 0
        self.nonfinite = 0
        self.broken = 0  # non-finite in OTHER where REF holds another value (a finite one)
        self.changed = False
        self.max_abs = 0.0
        self.sum_abs = 0.0
        self.max_rel = 0.0
        self.sum_rel = 0.0
        self.signal = 0.0
        self.noise = 0.0
        self.exact = 0
        self.hist = np.zeros(_BINS, np.int64)

    def add(self, ref: np.ndarray, other: np.ndarray) -> None:
        r = ref.ravel().astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            d = other.ravel().astype(np.float64) - r
        self.size += r.size
        finite = np.isfinite(d)  # float32 inputs: finite exactly when both are
        if not finite.all():
            bad_r, bad_o = ref.ravel()[~finite], other.ravel()[~finite]
            same = (bad_r == bad_o) | (np.isnan(bad_r) & np.isnan(bad_o))
            if not same.all():
                self.changed = True
                self.broken += int(same.size - np.count_nonzero(same))
            self.nonfinite += int(r.size - np.count_nonzero(finite))
            r, d = r[finite], d[finite]
        if not r.size:
            return
        err = np.abs(d, out=d)
        nonzero = int(np.count_nonzero(err))
        self.changed = self.changed or bool(nonzero > 0)
        self.exact += err.size - nonzero
        self.max_abs = max(self.max_abs, float(err.max()))
        self.sum_abs += float(err.sum())
        # einsum, not dot: BLAS threads only contend on a busy machine here
        self.signal += float(np.einsum("i,i->", r, r))
        self.noise += float(np.einsum("i,i->", err, err))
        ar = np.abs(r, out=r)
        zero = ar == 0
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.divide(err, ar, out=ar)
        if zero.any():
            rel[zero] = np.where(err[zero] == 0, 0.0, np.inf)
        self.max_rel = max(self.max_rel, float(rel.max()))
        self.sum_rel += float(rel.sum())
        if nonzero:
            scaled = err[err > 0] / (self.absmax or 1.0)
            exponent = np.frexp(scaled)[1]  # scaled in [2**(e-1), 2**e)
            idx = np.clip(exponent - _LOW_EXPONENT, 0, _BINS - 1).astype(np.intp)
            self.hist += np.bincount(idx, minlength=_BINS)

    def result(self) -> dict[str, Any]:
        n = self.size - self.nonfinite
        if self.broken:
            sqnr = -math.inf  # a value turned NaN or inf: an infinite error
        elif self.noise == 0:
            sqnr = math.inf
        elif self.signal == 0 or math.isinf(self.noise):
            sqnr = -math.inf
        else:
            sqnr = 10 * math.log10(self.signal / self.noise)
        lost = math.inf if self.broken else None  # a value turned NaN or inf: unbounded
        return {
            "size": self.size,
            "nonfinite": self.nonfinite,
            "nonfinite_changed": self.broken,
            "changed": self.changed,
            "max_abs_error": lost or self.max_abs,
            "mean_abs_error": lost or (self.sum_abs / n if n else 0.0),
            "max_rel_error": lost or self.max_rel,
            "mean_rel_error": lost or (self.sum_rel / n if n else 0.0),
            "max_error_over_absmax": lost or (self.max_abs / self.absmax if self.absmax else 0.0),
            "sqnr_db": sqnr,
            # the values that changed into NaN or inf count as not exact
            "exact_fraction": self.exact / (n + self.broken) if n + self.broken else 1.0,
        }


def _values(reader: Reader, leaf: Leaf) -> np.ndarray:
    """The logical float32 values of a leaf (no copy for float32 storage)."""
    stored = reader.read_leaf(leaf)
    data = stored.data
    if leaf.kind == "array" or (leaf.format is not None and leaf.scale is None and _raw(leaf)):
        return data if data.dtype == np.float32 else data.astype(np.float32)
    import_jax()
    import jax.numpy as jnp

    return np.asarray(encoded(leaf, stored).decode(jnp.float32))


def _raw(leaf: Leaf) -> bool:
    fmt = leaf.format
    return (
        isinstance(fmt, dtypes.FloatFormat)
        and fmt.native_dtype is not None
        and fmt.native_dtype == leaf.data_dtype
    )


def _floating(leaf: Leaf) -> bool:
    return leaf.kind == "tensor" or leaf.dtype.kind == "f" or leaf.dtype.name == "bfloat16"


def _compare(ref: np.ndarray, other: np.ndarray) -> tuple[dict[str, Any], np.ndarray]:
    r, o = ref.reshape(-1), other.reshape(-1)
    slices = [slice(i, i + _CHUNK) for i in range(0, r.size, _CHUNK)]
    absmax = 0.0
    for s in slices:
        part = np.abs(r[s])
        absmax = max(absmax, float(np.max(part, where=np.isfinite(part), initial=0.0)))
    acc = _Accumulator(absmax)
    for s in slices:
        acc.add(r[s], o[s])
    return acc.result(), acc.hist


def _cmd_report(args: argparse.Namespace) -> int:
    if args.other is None:
        if not is_gguf(args.ref):
            raise UsageError(
                f"report compares two checkpoints: give OTHER too (REF {args.ref} alone is "
                "listed only when it is a GGUF file)"
            )
        return list_gguf(args)
    if args.plot:
        _require("matplotlib", "report --plot")
    rows: list[dict[str, Any]] = []
    hists: dict[str, np.ndarray] = {}
    with Source(args.ref) as ref, Source(args.other) as other:
        pairs, only_ref, only_other = _pairs(ref, other)
        progress = _progress(len(pairs), args.quiet, "comparing", unit="tensor")
        try:
            for name, rreader, rleaf, oreader, oleaf in pairs:
                check_interrupt()
                progress.set_postfix_str(name, refresh=False)
                r = _values(rreader, rleaf)
                o = _values(oreader, oleaf)
                stats, hist = _compare(r, o)
                del r, o
                rows.append(_row(name, oleaf, stats))
                hists[name] = hist
                progress.update(1)
        finally:
            progress.close()
    for name in only_ref:
        print(f"{PROG}: note: {name!r} is only in REF", file=sys.stderr)
    for name in only_other:
        print(f"{PROG}: note: {name!r} is only in OTHER", file=sys.stderr)
    if not rows:
        raise CheckpointError(f"{args.ref} and {args.other} have no floating tensor in common")
    rows.sort(key=lambda r: _natural_key(r["name"]))
    ordered = _ordered(rows, args.sort)
    if args.json:
        print(json.dumps(ordered, indent=2))
    else:
        _print_table(ordered, args)
    if args.plot:
        _plot(hists, rows, args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


_Pair = tuple[str, Reader, Leaf, Reader, Leaf]


def _pairs(ref: Source, other: Source) -> tuple[list[_Pair], list[str], list[str]]:
    """The floating tensors both checkpoints hold, by name, as (name, REF's reader and
    leaf, OTHER's reader and leaf), and the names only REF, only OTHER holds; tensors of
    the same name but different shapes are refused, all at once."""
    problems: list[str] = []
    ref_leaves = {leaf.name: (r, leaf) for r, leaf in ref.items}
    other_leaves = {leaf.name: (r, leaf) for r, leaf in other.items}
    only_ref = [n for n in ref_leaves if n not in other_leaves]
    only_other = [n for n in other_leaves if n not in ref_leaves]
    pairs = []
    for name, (oreader, oleaf) in other_leaves.items():
        if name not in ref_leaves:
            continue
        rreader, rleaf = ref_leaves[name]
        if rleaf.shape != oleaf.shape:
            problems.append(
                f"{name!r} has shape {list(rleaf.shape)} in REF but {list(oleaf.shape)} in OTHER"
            )
            continue
        if _floating(rleaf) and _floating(oleaf):
            pairs.append((name, rreader, rleaf, oreader, oleaf))
    if problems:
        raise dtypes.ShapeError("; ".join(problems))
    return pairs, only_ref, only_other


def _row(name: str, leaf: Leaf, stats: dict[str, Any]) -> dict[str, Any]:
    """One tensor's row of the report: OTHER's `leaf` as stored, and its `stats`."""
    return {
        "name": name,
        "format": leaf.format.name if leaf.format is not None else leaf.dtype.name,
        "scaling": None if leaf.scaling is None else str(leaf.scaling),
        "shape": list(leaf.shape),
        "bytes": leaf_nbytes(leaf),
        **stats,
    }


def _ordered(rows: list[dict[str, Any]], how: str) -> list[dict[str, Any]]:
    if how == "name":
        return list(rows)
    if how == "size":
        return sorted(rows, key=lambda r: -r["bytes"])
    return sorted(rows, key=lambda r: r["sqnr_db"])  # stable: natural order among equals


def _print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    shown = rows if args.all else [r for r in rows if r["changed"]]
    hidden = len(rows) - len(shown)
    if args.top is not None:
        shown = shown[: args.top]
    table = [
        [
            r["name"],
            r["format"] + ("" if r["scaling"] is None else f" {_brief(r['scaling'])}"),
            _human(r["bytes"]),
            _fmt_db(r["sqnr_db"]),
            f"{r['max_error_over_absmax']:.2e}",
            f"{r['mean_abs_error']:.2e}",
            _nonfinite(r),
        ]
        for r in shown
    ]
    header = ["tensor", "format", "size", "SQNR dB", "max err/absmax", "mean abs err", "NaN/inf"]
    if table:
        print(_table(table, header, right={2, 3, 4, 5, 6}))
    changed = [r for r in rows if r["changed"]]
    total = sum(r["bytes"] for r in rows)
    line = f"\n{len(rows)} tensor(s) compared, {len(changed)} changed, {_human(total)} in OTHER"
    if changed:
        worst = min(changed, key=lambda r: r["sqnr_db"])
        line += f"; worst SQNR {_fmt_db(worst['sqnr_db'])} dB ({worst['name']})"
    print(line.lstrip("\n") if not table else line)
    for total_line in _totals(rows):
        print(total_line)
    notes = []
    if hidden:
        notes.append(f"{hidden} unchanged tensor(s) not listed (--all lists them)")
    if args.top is not None and len(shown) < len(rows) - hidden:
        notes.append(f"showing the first {len(shown)} (--top)")
    if notes:
        print("; ".join(notes))
    broken = [r for r in rows if r["nonfinite_changed"]]
    if broken:
        n = sum(r["nonfinite_changed"] for r in broken)
        print(
            f"{n} value(s) in {len(broken)} tensor(s) are NaN or inf in OTHER where REF holds "
            f"another value (SQNR -inf): OTHER lost them ({broken[0]['name']} first)"
        )


def _totals(rows: list[dict[str, Any]]) -> list[str]:
    """Bytes held against float32 and bfloat16, by format, and what a pass over the
    weights reads: the totals `precision.explain` gives, in its words."""
    held = sum(r["bytes"] for r in rows)
    values = sum(math.prod(r["shape"]) for r in rows)
    by_format: dict[str, list[int]] = {}
    for r in rows:
        entry = by_format.setdefault(r["format"], [0, 0])
        entry[0] += r["bytes"]
        entry[1] += 1
    formats = "; ".join(
        f"{name} {b:,} B ({n} tensor{'s' if n != 1 else ''})"
        for name, (b, n) in sorted(by_format.items(), key=lambda kv: -kv[1][0])
    )
    lines = [
        f"parameters: {held:,} B held (as float32 {4 * values:,} B, "
        f"as bfloat16 {2 * values:,} B): {formats}"
    ]
    if held:
        lines.append(
            f"a pass over these weights reads {held / (2 * values):.2f}x the bytes of "
            f"bfloat16: predicted {2 * values / held:.2f}x faster where reading weights "
            "bounds the step (one-token decoding)"
        )
    return lines


def _nonfinite(row: dict[str, Any]) -> str:
    """The NaN/inf count of a row: '-' for none, '12 (3 new)' when some are not REF's."""
    if not row["nonfinite"]:
        return "-"
    new = row["nonfinite_changed"]
    return f"{row['nonfinite']:,}" + (f" ({new:,} new)" if new else "")


def _brief(scaling: str) -> str:
    return scaling.replace(" on axis -1", "")


def _short(name: str, width: int = 38) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1) :]


def _plot(hists: dict[str, np.ndarray], rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    changed = [r for r in rows if r["changed"]] or rows
    worst = sorted(changed, key=lambda r: r["sqnr_db"])
    bars = worst[:_PLOT_BARS]
    height = max(5.0, 0.24 * len(bars) + 1.8)
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(15, height), gridspec_kw={"width_ratios": [1, 1.15]}
    )
    _plot_worst_sqnr(ax, bars, len(changed))
    _plot_error_distributions(bx, hists, changed, worst[:_PLOT_LINES])
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def _plot_worst_sqnr(ax: Any, bars: list[dict[str, Any]], changed: int) -> None:
    """Left: the worst SQNRs as a sorted bar chart, worst on top (`changed` tensors in all)."""
    import matplotlib.pyplot as plt

    finite = [r["sqnr_db"] for r in bars if math.isfinite(r["sqnr_db"])]
    top = max([*finite, 1.0]) * 1.15
    formats = sorted({r["format"] for r in bars})
    colors = {f: plt.cm.tab10(i % 10) for i, f in enumerate(formats)}
    y = np.arange(len(bars))
    values = [
        min(max(r["sqnr_db"], 0.0), top) if math.isfinite(r["sqnr_db"]) else top for r in bars
    ]
    ax.barh(y, values, color=[colors[r["format"]] for r in bars])
    for yi, r, v in zip(y, bars, values, strict=True):
        label = "exact" if r["sqnr_db"] == math.inf else f"{r['sqnr_db']:.1f}"
        ax.text(v, yi, f" {label}", va="center", fontsize=7)
    ax.set_yticks(y, [_short(r["name"]) for r in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.12)
    ax.axvline(15, color="0.3", linestyle=":", linewidth=1)
    ax.set_xlabel("SQNR (dB, higher is better; dotted line: 15 dB warning threshold)")
    title = f"worst {len(bars)} of {changed} changed tensors by SQNR"
    if changed <= len(bars):
        title = f"SQNR of the {changed} changed tensor(s), worst first"
    ax.set_title(title, fontsize=10)
    if len(formats) > 1:
        handles = [plt.Rectangle((0, 0), 1, 1, color=colors[f]) for f in formats]
        ax.legend(handles, formats, fontsize=7, loc="lower right", title="format")


def _plot_error_distributions(
    bx: Any, hists: dict[str, np.ndarray], changed: list[dict[str, Any]], lines: list[Any]
) -> None:
    """Right: the error distribution of each of the worst tensors (`lines`), normalised
    per tensor (|error| / max |ref|, as a fraction of its values), and the average over
    every changed tensor as a grey band."""
    centers = np.sqrt(_EDGES[:-1] * _EDGES[1:])

    counted = {r["name"]: max(r["size"] - r["nonfinite"], 1) for r in changed}

    def fractions(name: str) -> np.ndarray:
        fraction: np.ndarray = hists[name].astype(np.float64) / counted[name]
        return fraction

    everyone = np.mean([fractions(r["name"]) for r in changed], axis=0)
    bx.fill_between(centers, everyone, step="mid", color="0.85", label="mean of all changed")
    styles = ["-", "--", "-.", ":"]
    for i, r in enumerate(lines):
        f = fractions(r["name"])
        bx.step(
            centers,
            f,
            where="mid",
            linestyle=styles[i % len(styles)],
            linewidth=1.4,
            label=f"{_short(r['name'], 32)} ({r['format']}, {_fmt_db(r['sqnr_db'])} dB, "
            f"{r['exact_fraction']:.0%} exact)",
        )
    used = np.flatnonzero(sum(hists[r["name"]] for r in changed))
    if used.size:
        bx.set_xlim(_EDGES[max(used[0] - 1, 0)], _EDGES[min(used[-1] + 2, _BINS)])
    bx.set_xscale("log")
    bx.set_xlabel("|error| / max |value| of the tensor (exact values not shown)")
    bx.set_ylabel("fraction of the tensor's values")
    bx.set_title("error distribution, normalised per tensor (worst SQNR)", fontsize=10)
    bx.legend(fontsize=7, loc="upper left")
