"""The passes over the batches: what each records, and how many there are.

A first, abstract trace (`survey`, no compute) lists every contraction with a
weight and the size of its statistics, in the order `f` first reads the
weights. The selected weights are then split into chunks whose statistics fit
`budget` bytes (`chunks`), and the batches run once per chunk (`accumulate`):
the statistics held at once are one chunk's, not the whole model's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from .._errors import CalibrationError, PrecisionError
from ._record import Found, SiteKey, Stats, record

__all__ = ["accumulate", "batches_of", "chunks", "shapes_of", "survey"]


def batches_of(batches: Any) -> list[Any]:
    zero_d = getattr(batches, "ndim", None) == 0  # an array is iterable, but not a 0-d one
    if (
        batches is None
        or isinstance(batches, str | bytes)
        or not isinstance(batches, Iterable)
        or zero_d
    ):
        raise CalibrationError(
            f"calibrate: `batches` must be an iterable of inputs for f(params, batch), got "
            f"{type(batches).__name__}; pass e.g. [x1, x2, ...]"
        )
    out = list(batches)
    if not out:
        raise CalibrationError(
            "calibrate: `batches` is empty: pass a few batches of real inputs (GPTQ needs "
            "activations to measure)"
        )
    return out


def shapes_of(batch: Any) -> str:
    return str(jax.tree_util.tree_map(lambda x: tuple(np.shape(x)), batch))


def accumulate(
    f: Callable[..., Any],
    leaves: list[Any],
    rebuild: Callable[[list[Any]], Any],
    batches: list[Any],
    paths: list[str],
    progress: bool,
    found: Found,
    what: str = "",
) -> dict[SiteKey, dict[str, np.ndarray]]:
    """The statistics of `found.wanted`'s sites, added up over every batch (float64)."""
    run = jax.jit(record(f, rebuild, found))
    totals: dict[SiteKey, dict[str, np.ndarray]] = {}
    for b in range(len(batches)):
        stats: dict[SiteKey, Stats] = _call(run, leaves, batches, b)
        _refuse_special(stats, paths, found.order, b)
        for key, s in stats.items():
            new = {
                n: np.asarray(getattr(s, n), np.float64) for n in ("h", "absmax", "abssum", "rows")
            }
            old = totals.get(key)
            if old is None:
                totals[key] = new
            else:
                old["h"] += new["h"]
                old["abssum"] += new["abssum"]
                old["rows"] += new["rows"]
                old["absmax"] = np.maximum(old["absmax"], new["absmax"])
        if progress:
            print(f"calibrate: {what}batch {b + 1}/{len(batches)} recorded", file=sys.stderr)
    for key, total in totals.items():
        if not np.all(total["rows"] > 0):
            raise CalibrationError(
                f"calibrate: {paths[key[0]]} met no activation in the {len(batches)} "
                "batch(es): it is read in a cond branch that none of them took, or in a "
                "while loop that ran no iteration, so there is nothing to calibrate it on; "
                "add batches that reach it, or leave it out (exclude=...)"
            )
    return totals


def _refuse_special(
    stats: dict[SiteKey, Stats], paths: list[str], order: list[int], b: int
) -> None:
    """Refuse NaN or infinity among the recorded inputs of batch `b`, naming the first
    weight `f` reads them with (its execution order, not the order of the keys: the
    layer to look at, or the one after the layer that made them)."""
    first = {leaf: n for n, leaf in enumerate(order)}
    bad = [
        (first.get(key[0], len(first)), key, n)
        for key, s in stats.items()
        if (n := int(np.sum(np.asarray(s.bad))))
    ]
    if not bad:
        return
    _, key, n = min(bad, key=lambda t: t[0])
    more = "" if len(bad) == 1 else f" (and those of {len(bad) - 1} later weight(s))"
    raise CalibrationError(
        f"calibrate: the inputs of {paths[key[0]]} hold {n} NaN or infinite value(s) in "
        f"batch {b}{more}: GPTQ cannot measure them; check that batch (and the layers "
        "before this one)"
    )


def _call(run: Callable[..., Any], leaves: list[Any], batches: list[Any], b: int) -> Any:
    """`run(leaves, batches[b])`, a batch `f` cannot take refused by name (whatever `f`
    raises on it: a model library's own shape error is no `ValueError`)."""
    try:
        return run(leaves, batches[b])
    except PrecisionError:
        raise
    except Exception as err:
        first = "" if b == 0 else f" (batch 0 had shapes {shapes_of(batches[0])})"
        raise CalibrationError(
            f"calibrate: f(params, batch) fails on batch {b} of shapes {shapes_of(batches[b])}"
            f"{first}: {type(err).__name__}: {str(err).splitlines()[0]}"
        ) from err


def survey(
    f: Callable[..., Any],
    leaves: list[Any],
    rebuild: Callable[[list[Any]], Any],
    batches: list[Any],
    found: Found,
) -> dict[SiteKey, int]:
    """Every site `f` has on the first batch and the bytes of its statistics (float64),
    by abstract evaluation; fills `found` (its `order`, folds, uses)."""
    found.wanted = None
    recorder = record(f, rebuild, found)

    def shapes_only(xs: list[Any], batch: Any) -> Any:
        return jax.eval_shape(recorder, xs, batch)

    shapes = _call(shapes_only, leaves, batches, 0)
    return {
        key: 8 * (int(np.prod(s.h.shape)) + 3 * int(np.prod(s.absmax.shape)))
        for key, s in shapes.items()
    }


def chunks(order: list[int], sizes: dict[int, int], budget: int) -> list[list[int]]:
    """`order`'s leaves in consecutive groups whose sizes sum to at most `budget` (a leaf
    larger than the budget alone)."""
    out: list[list[int]] = []
    used = budget + 1
    for leaf in order:
        if used + sizes[leaf] > budget:
            out.append([])
            used = 0
        out[-1].append(leaf)
        used += sizes[leaf]
    return out
