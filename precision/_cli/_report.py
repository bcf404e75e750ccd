"""`precision report`: two checkpoints compared tensor by tensor."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np

from .._checkpoint._io import encoded
from .._checkpoint._layout import Leaf
from .._checkpoint._reader import Reader
from ._output import PROG, _DataError, _fmt_db, _human, _table


def _error_report(ref, approx):
    try:
        from ..testing import error_report
    except ImportError:  # pragma: no cover - before the testing kit exports it
        from ..testing._metrics import error_report
    # No format: the table needs no ULP histogram, which is the costly part.
    return error_report(ref, approx)


def _report_row(name: str, leaf: Leaf, nbytes: int, ref, other) -> dict[str, Any]:
    rep = _error_report(ref, other)
    fmt_name = leaf.format.name if leaf.format is not None else leaf.dtype.name
    return {
        "name": name,
        "format": fmt_name,
        "scaling": None if leaf.scaling is None else str(leaf.scaling),
        "bytes": nbytes,
        "max_abs_error": float(rep.max_abs_error),
        "mean_abs_error": float(rep.mean_abs_error),
        "max_rel_error": float(rep.max_rel_error),
        "mean_rel_error": float(rep.mean_rel_error),
        "sqnr_db": float(rep.sqnr_db),
    }


def _values(reader: Reader, leaf: Leaf):
    import jax.numpy as jnp

    data, scale = reader.read_leaf(leaf)
    if leaf.kind == "array":
        return jnp.asarray(data.astype(np.float32))
    return encoded(leaf, data, scale).decode(jnp.float32)


def _cmd_report(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    errors: dict[str, np.ndarray] = {}
    problems: list[str] = []
    with Reader(args.ref) as ref, Reader(args.other) as other:
        ref_leaves = {leaf.name: leaf for leaf in ref.leaves}
        other_leaves = {leaf.name: leaf for leaf in other.leaves}
        only_ref = [n for n in ref_leaves if n not in other_leaves]
        only_other = [n for n in other_leaves if n not in ref_leaves]
        for name, oleaf in other_leaves.items():
            rleaf = ref_leaves.get(name)
            if rleaf is None:
                continue
            if rleaf.shape != oleaf.shape:
                problems.append(
                    f"{name!r} has shape {list(rleaf.shape)} in REF but {list(oleaf.shape)} "
                    "in OTHER"
                )
                continue
            if not (_floating(rleaf) and _floating(oleaf)):
                continue
            r, o = _values(ref, rleaf), _values(other, oleaf)
            nbytes = sum(other.entries[n].nbytes for n, _, _ in oleaf.arrays())
            rows.append(_report_row(name, oleaf, nbytes, r, o))
            if args.plot:
                errors[name] = _rel_errors(np.asarray(r), np.asarray(o))
    for name in only_ref:
        print(f"{PROG}: note: {name!r} is only in REF", file=sys.stderr)
    for name in only_other:
        print(f"{PROG}: note: {name!r} is only in OTHER", file=sys.stderr)
    if problems:
        raise _DataError("; ".join(problems))
    if not rows:
        raise _DataError(f"{args.ref} and {args.other} have no floating tensor in common")
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        table = [
            [
                r["name"],
                r["format"],
                str(r["bytes"]),
                f"{r['max_rel_error']:.3e}",
                f"{r['mean_rel_error']:.3e}",
                _fmt_db(r["sqnr_db"]),
            ]
            for r in rows
        ]
        header = ["tensor", "format", "bytes", "max rel err", "mean rel err", "SQNR dB"]
        print(_table(table, header, right={2, 3, 4, 5}))
        total = sum(r["bytes"] for r in rows)
        worst = min(rows, key=lambda r: r["sqnr_db"])
        print(
            f"\n{len(rows)} tensor(s), {_human(total)}; worst SQNR "
            f"{_fmt_db(worst['sqnr_db'])} dB ({worst['name']})"
        )
    if args.plot:
        _plot(errors, rows, args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


def _floating(leaf: Leaf) -> bool:
    return leaf.kind == "tensor" or leaf.dtype.kind == "f" or leaf.dtype.name == "bfloat16"


def _rel_errors(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Relative errors |other - ref| / |ref| of the finite, nonzero reference values."""
    ref = ref.astype(np.float64).ravel()
    other = other.astype(np.float64).ravel()
    ok = np.isfinite(ref) & (ref != 0) & np.isfinite(other)
    return np.abs(other[ok] - ref[ok]) / np.abs(ref[ok])


def _plot(errors: dict[str, np.ndarray], rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    shown = sorted(rows, key=lambda r: r["sqnr_db"])[:10]
    finite = [e[e > 0] for e in errors.values() if np.any(e > 0)]
    lo = min((float(e.min()) for e in finite), default=1e-8)
    hi = max((float(e.max()) for e in finite), default=1.0)
    bins = np.logspace(np.log10(lo), np.log10(hi) + 1e-9, 60)
    for r in shown:
        e = errors[r["name"]]
        e = e[e > 0]
        if e.size:
            ax.hist(e, bins=bins, histtype="step", label=f"{r['name']} ({r['format']})")
    ax.set_xscale("log")
    ax.set_xlabel("relative error |other - ref| / |ref|")
    ax.set_ylabel("values")
    title = "relative error per tensor"
    if len(rows) > len(shown):
        title += f" ({len(shown)} worst of {len(rows)})"
    ax.set_title(title)
    if shown:
        ax.legend(fontsize="small")
    names = [r["name"] for r in rows]
    top = max([r["sqnr_db"] for r in rows if math.isfinite(r["sqnr_db"])] + [1.0]) * 1.1
    sqnr = [min(max(r["sqnr_db"], 0.0), top) for r in rows]
    bars = bx.barh(range(len(rows)), sqnr)
    for bar, r in zip(bars, rows, strict=True):
        if not math.isfinite(r["sqnr_db"]):
            bar.set_hatch("//")
            bx.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " exact", va="center")
    bx.set_yticks(range(len(rows)), names, fontsize="small")
    bx.invert_yaxis()
    bx.set_xlabel("SQNR (dB)")
    bx.set_title("signal-to-quantization-noise ratio")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
