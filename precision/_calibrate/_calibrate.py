"""`precision.calibrate`: convert a model's weights using recorded activations.

The options are checked into a recipe (`_recipe`). The batches are run through
`f` once each (`_record`), adding up each contraction's input statistics per
weight. AWQ (alone or with GPTQ) and SmoothQuant then fold their per-channel
scales into the normalizations and weights (`_smooth`); every selected weight is
converted on the host, one at a time, by GPTQ (`_gptq`) or round-to-nearest
(`_weight_conversion`), into a Tensor that `apply` and `save` take.
"""

from __future__ import annotations

import functools
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import dtypes

from .._errors import CalibrationError, CalibrationWarning
from .._tensor import Tensor
from .._tree import Where, _path_str, _selector, is_floating, is_tensor
from ._batch_passes import accumulate, batches_of, chunks, survey
from ._recipe import (
    FOLDING,
    GPTQ_METHODS,
    METHODS,
    Recipe,
    check_budget,
    check_flags,
    check_sequential,
    recipe_of,
)
from ._record import FoldKey, Found
from ._smooth import awq_scales, fold_rows, smoothquant_scales
from ._weight_conversion import Site, convert, rtn_values

__all__ = ["METHODS", "MIN_ROWS_PER_INPUT", "calibrate"]

MIN_ROWS_PER_INPUT = 4
"""GPTQ fits each weight's rounding to the Hessian of its recorded inputs; with fewer
than this many recorded rows per input the fit follows those rows rather than the
inputs in general, and can be worse than round-to-nearest on held-out data
(`benchmarks/calibration_rows.py`, docs/calibration.md): `calibrate` warns below it."""


def _refuse_tensors(flat: list[tuple[Any, Any]]) -> None:
    """Refuse parameters that are Tensors already: calibration starts from floats."""
    tensors = [_path_str(p) for p, leaf in flat if isinstance(leaf, Tensor)]
    if tensors:
        raise CalibrationError(
            f"calibrate: {tensors[0]} is already a Tensor; calibrate the float32 parameters "
            "(precision.to_full_precision(params) gives them back)"
        )


def _sites(
    sizes: dict[tuple[int, tuple[int, ...], tuple[int, ...]], int], paths: list[str]
) -> dict[int, Site]:
    """One `Site` per contracted weight, from the recorded (leaf, axes, stacked) uses and
    the bytes of their statistics; a weight contracted over two sets of axes is refused."""
    sites: dict[int, Site] = {}
    for (leaf, axes, stacked), size in sorted(sizes.items()):
        site = sites.get(leaf)
        if site is not None and (site.axes, site.stacked) != (axes, stacked):
            raise CalibrationError(
                f"calibrate: {paths[leaf]} is contracted over two different axes "
                f"({site.axes} and {axes}); exclude it, or calibrate one use"
            )
        sites[leaf] = Site(paths[leaf], axes, stacked, {}, size)
    return sites


def _picked(
    chosen: list[int],
    sites: dict[int, Site],
    paths: list[str],
    skipped: dict[int, str],
    *,
    explicit: bool,
) -> set[int]:
    """The selected weights that have statistics; refused when an explicit selection
    names a weight without them, or when none is left. A weight of the default
    selection that `f` contracts in a way calibration does not record is left as it
    is, with a `CalibrationWarning` naming it and the reason."""
    missing = [j for j in chosen if j not in sites]
    if explicit and missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        j = missing[0]
        why = (
            f"f contracts it, but {skipped[j]}, which calibration does not record"
            if j in skipped
            else "f never contracts it with an activation (an embedding, a norm, a bias)"
        )
        raise CalibrationError(
            f"calibrate: {paths[j]}{more} is selected but {why}: nothing to calibrate it "
            "on; narrow `where` to the layers' weights (to_reduced_precision converts "
            "the others by round-to-nearest)"
        )
    unrecorded = [j for j in missing if j in skipped]
    if not explicit and unrecorded:
        listed = "; ".join(f"{paths[j]} ({skipped[j]})" for j in unrecorded)
        warnings.warn(
            f"calibrate: left in float, because calibration does not record how f "
            f"contracts them: {listed}. Convert them with to_reduced_precision "
            "(round-to-nearest), or pass exclude= to say you mean it",
            CalibrationWarning,
            stacklevel=3,
        )
    picked = {j for j in chosen if j in sites}
    if not picked:
        raise CalibrationError(
            "calibrate: no weight to calibrate: "
            + (
                "`where`/`exclude` selects none of the contracted weights "
                f"({_listed(sorted(s.path for s in sites.values()))})"
                if sites
                else "f contracts no parameter with an activation (the batches do not reach a "
                "dot_general with a weight of params)"
            )
        )
    return picked


def _listed(paths: list[str], most: int = 4) -> str:
    """The first `most` of `paths`, with how many more there are."""
    more = len(paths) - most
    return ", ".join(paths[:most]) + (f" and {more} more" if more > 0 else "")


def _folds(
    method: str, found: Found, sites: dict[int, Site], picked: set[int]
) -> dict[int, tuple[FoldKey, list[int]]]:
    """The foldings AWQ and SmoothQuant make (`_foldable`); none for the other methods."""
    if method not in FOLDING:
        return {}
    scanned = {j for j in picked if sites[j].stacked}
    if scanned:
        listed = ", ".join(sorted(sites[j].path for j in scanned))
        rounded = "by GPTQ unscaled" if method in GPTQ_METHODS else "to nearest"
        warnings.warn(
            f"calibrate: {method} folds its scales into unstacked layers only; {listed} "
            f"hold layers stacked under scan and are rounded {rounded}, each layer with its "
            f"own scales (the other weights get {method}). Use method='gptq' for stacked "
            "layers, or unroll them",
            CalibrationWarning,
            stacklevel=3,
        )
    return _foldable(found, picked, scanned)


def _foldable(
    found: Found, picked: set[int], scanned: set[int]
) -> dict[int, tuple[FoldKey, list[int]]]:
    """The foldings to make, keyed by the selected weight read first in each: every
    normalization output read only by contractions whose weights are read once, none of
    them stacked under scan."""
    first = {leaf: n for n, leaf in enumerate(found.order)}
    out = {}
    for key, sites in found.folds.items():
        members = sorted({leaf for leaf, _, _ in sites}, key=first.__getitem__)
        if key in found.unsafe or any(found.uses[leaf] != 1 for leaf in members):
            continue  # the normalization's output or a weight is read elsewhere too
        if any(leaf in scanned for leaf in members):
            continue  # a scale per layer would have to be folded into each
        trigger = [leaf for leaf in members if leaf in picked]
        if trigger:
            out[trigger[0]] = (key, members)
    return out


def _fold(
    recipe: Recipe,
    key: FoldKey,
    members: list[int],
    stats: dict[str, np.ndarray],
    sites: dict[int, Site],
    work: list[Any],
    traced: list[int],
    paths: list[str],
    scaled: dict[int, np.ndarray],
) -> str:
    """Fold AWQ's or SmoothQuant's scales for one normalization output into `work`.

    `stats` are the recorded inputs of one member (all read the same activation);
    each member's scales are noted in `scaled`."""
    method, alpha = recipe.method, recipe.alpha
    ws = [(np.asarray(work[traced[leaf]]), sites[leaf].axes[0]) for leaf in members]
    if method == "smoothquant":
        s, how = smoothquant_scales(stats["absmax"], ws, alpha), f"alpha {alpha}"
    else:
        mean = stats["abssum"] / max(float(stats["rows"]), 1.0)
        if method == "awq":
            fmt, scaling = recipe.fmt, recipe.scaling
            rtn = lambda w, axis, _: rtn_values(w, axis, fmt, scaling)
            s, chosen = awq_scales(stats["h"], mean, ws, rtn, recipe.grid)
        else:  # each exponent's scales judged by GPTQ's rounding of the scaled weights
            gptq = functools.partial(_gptq_values, recipe=recipe, h=stats["h"])
            s, chosen = awq_scales(stats["h"], mean, ws, gptq, _gptq_exponents(recipe.grid))
        how = f"alpha {chosen:.2f} searched"
    for leaf, (w, axis) in zip(members, ws, strict=True):
        work[traced[leaf]] = fold_rows(w, axis, s)
        scaled[leaf] = s
    for vector in key:
        if vector is not None:
            v = work[traced[vector]]
            work[traced[vector]] = (np.asarray(v, np.float64) / s).astype(np.asarray(v).dtype)
    return (
        f"{method}: scales folded into {paths[key[0]]}"
        f"{'' if key[1] is None else ' and ' + paths[key[1]]} for "
        f"{', '.join(paths[leaf] for leaf in members)} ({how})"
    )


def _gptq_exponents(grid: int) -> int:
    """AWQ+GPTQ's number of exponents tried: each is a GPTQ run of every weight
    reading the activation, so a quarter of AWQ's `grid` (5 by default)."""
    return max(1, grid // 4)


def _gptq_values(w: np.ndarray, axis: int, s: np.ndarray, recipe: Recipe, h: Any) -> Any:
    """`w` (scaled by `s` along `axis`) as GPTQ rounds it against the inputs it then meets,
    `x / s` (decoded values, same layout)."""
    site = Site("", (axis,), (), {"h": h}, 0)
    fmt, scaling, opts = recipe.fmt, recipe.scaling, recipe.opts
    return np.asarray(convert("gptq", w, site, fmt, scaling, opts, s, recipe.clip).numpy())


def _converted(
    recipe: Recipe, leaf: Any, site: Site, scale: np.ndarray | None
) -> tuple[str, Tensor]:
    """(the method used, the Tensor) of one weight converted as `recipe` says, from its
    (folded) values; AWQ and SmoothQuant round a weight stacked under scan to nearest,
    AWQ+GPTQ rounds it by GPTQ, and by GPTQ against `x / scale` a weight it scaled."""
    method, fmt, scaling = recipe.method, recipe.fmt, recipe.scaling
    if method == "awq+gptq":
        how, rounding = ("gptq" if scale is None else method), "gptq"
    else:
        how = rounding = "rtn" if site.stacked and method in FOLDING else method
    return how, convert(rounding, leaf, site, fmt, scaling, recipe.opts, scale, recipe.clip)


def _assemble(
    treedef: Any, values: list[Any], work: list[Any], out: list[tuple[int, Tensor]]
) -> Any:
    """The returned tree: each converted weight's Tensor, every other leaf as `work`
    holds it (a folded leaf given as numpy stays numpy; any other becomes a JAX array)."""
    result = [
        v if v is values[i] or isinstance(values[i], np.ndarray) else jnp.asarray(v)
        for i, v in enumerate(work)
    ]
    for i, tensor in out:
        result[i] = tensor
    return jax.tree_util.tree_unflatten(treedef, result)


def _short_of_rows(method: str, site: Site) -> str | None:
    """`path (R rows, K inputs)` for a weight GPTQ fits on too few rows, else None."""
    if method not in GPTQ_METHODS:
        return None
    rows = int(np.min(site.stats["rows"]))
    inputs = int(site.stats["h"].shape[-1])
    if rows >= MIN_ROWS_PER_INPUT * inputs:
        return None
    return f"{site.path} ({rows} rows, {inputs} inputs)"


def _warn_rows(short: list[str]) -> None:
    if short:
        warnings.warn(
            f"calibrate: GPTQ saw fewer than {MIN_ROWS_PER_INPUT} recorded rows per input for "
            f"{'; '.join(short)}: its rounding then fits those rows and can be worse than "
            "round-to-nearest on other inputs (docs/calibration.md, 'How many rows'); add "
            "batches, or use method='rtn' or 'awq'",
            CalibrationWarning,
            stacklevel=3,
        )


def _pass_label(done: int, size: int, total: int) -> str:
    """What a pass over the batches records, for the progress lines ("" for all at once)."""
    return f"weights {done + 1}-{done + size} of {total}: " if done or size < total else ""


def _say(progress: bool, line: str) -> None:
    if progress:
        print(f"calibrate: {line}", file=sys.stderr)


def _stages(order: list[int], reads: dict[int, int]) -> list[list[int]]:
    """`order` split where the input changes: consecutive weights that read the same
    activation (a block's query, key and value) are one stage."""
    out: list[list[int]] = []
    for j in order:
        if out and reads.get(j) == reads.get(out[-1][-1]):
            out[-1].append(j)
        else:
            out.append([j])
    return out


def calibrate(
    f: Callable[..., Any],
    params: Any,
    batches: Iterable[Any],
    *,
    method: str = "gptq",
    format: str | dtypes.Format | None = None,
    scaling: dtypes.Scaling | None = None,
    where: Where = None,
    exclude: str | None = None,
    damp: float = 0.01,
    block_size: int = 128,
    act_order: bool = True,
    alpha: float = 0.5,
    grid: int = 20,
    clip: bool = True,
    stats_memory: int = 1 << 30,
    sequential: bool = False,
    progress: bool | None = None,
) -> Any:
    """Convert the weights of `params` to `format`, calibrated on real activations.

    Runs `f(params, batch)` for every batch (inside `jit`), recording the
    inputs of every contraction whose other operand is a weight of `params`
    (Flax linen and NNX, Equinox and plain functions alike; a layer under
    `scan` gets statistics of its own per step), then converts each weight:

    - `"gptq"`: GPTQ (error-compensated rounding, column by column, against
      the Hessian of the recorded inputs; `damp` times its mean diagonal is
      added; `act_order` visits inputs by decreasing activation energy; with
      `clip`, each group's scale is searched);
    - `"awq"`: AWQ: input channels that meet large activations are scaled up
      before round-to-nearest (`mean|x|^alpha`, alpha searched over `grid`
      points for the least output error on the recorded inputs);
    - `"awq+gptq"`: AWQ's scales, each exponent judged by GPTQ's rounding of
      the scaled weights (a quarter of `grid`'s exponents: each is a GPTQ
      run), then GPTQ against the inputs the scaled weights meet; slower,
      and the better of the two where a few channels carry large
      activations;
    - `"smoothquant"`: SmoothQuant for W8A8 (`apply(..., contract="int8")`):
      activation outliers moved into the weights (`max|x|^alpha /
      max|W|^(1 - alpha)`), then round-to-nearest;
    - `"rtn"`: round-to-nearest, what `to_reduced_precision` does, for
      comparison through the same selection.

    AWQ (and AWQ+GPTQ) and SmoothQuant divide an activation by their scales
    where it is made:
    in the normalization (LayerNorm's scale and bias) whose output the layers
    read, so the returned tree computes the same function before rounding.
    Weights whose input is not such an output (after an activation function,
    or a normalization whose output is also read elsewhere) are rounded to
    nearest unscaled; `progress` lists every folding made.

    Args:
        f: `f(params, batch)`, e.g. `lambda p, x: model.apply(p, x)`.
        params: the float parameter tree (arrays; Tensors are refused).
        batches: an iterable of batches, each passed as `f`'s second argument.
        method: `"gptq"`, `"awq"`, `"awq+gptq"`, `"smoothquant"` or `"rtn"`.
        format: an integer format: `"int8"`, `"int4"`, `"int2"`, or `"uint8"`,
            `"uint4"` with a zero point per group (default int4; int8 for
            SmoothQuant); or `"q4_0"`, ggml's Q4_0 grid (codes -8..7 times a
            signed float16 scale `max / -8` per block of 32 inputs, held as
            uint4 with zero points 7 or 8; docs/calibration.md).
        scaling: `dtypes.PerBlock(n)` (default `PerBlock(128)`; for
            SmoothQuant `PerAxis()`): blocks of
            `n` inputs, on whichever axis each weight contracts;
            `dtypes.PerAxis()`: one scale per output channel (matrices);
            `dtypes.PerTensor()`. Their `power_of_two` and `scale_format`
            are kept.
        where: select weights as `to_reduced_precision` does (a predicate
            `where(path, leaf)` or a regex on the key path); by default every
            weight that `f` contracts with an activation. Embeddings (looked
            up, not contracted), norms and biases are left as they are.
        exclude: a regex; weights whose key path matches are left alone.
        damp: GPTQ's damping, a fraction of the Hessian's mean diagonal.
        block_size: GPTQ's lazy-update block (changes speed, not codes).
        act_order: GPTQ's activation order: inputs visited by decreasing
            energy, so the rounding of the inputs that matter most is
            compensated by the most others; every block's scale is then taken
            from the original weights ("static groups": the blocks stay the
            contiguous ones storage holds). `False`: inputs in order, each
            block scaled when reached, as the published algorithm.
        alpha: SmoothQuant's migration strength, in [0, 1].
        grid: the number of AWQ exponents tried (0, 1/grid, ...), and of
            clipping ratios (1, 1 - 0.5/grid, ...) `clip` tries.
        clip: search each group's range (GPTQ and AWQ): a group's scale is
            that of its weights clipped to the ratio whose rounding loses
            least on the recorded inputs (for GPTQ each weight's squared
            error weighed by its input's energy; for AWQ the group's output
            error), so a few large weights no longer coarsen the step of
            the many small ones. `False`: every group's whole range, as
            the published algorithms and `to_reduced_precision` scale.
        stats_memory: bytes of input statistics held at once (default 1 GiB):
            the batches run once per group of weights whose statistics fit.
        sequential: GPTQ on the inputs of the model as converted so far:
            the batches run once per stage (the weights that read the same
            input, such as a block's query, key and value), each recorded
            with every earlier stage's weights already rounded, so a layer
            compensates the errors of the layers before it. Slower (one pass
            per stage); layers stacked under `scan` are recorded together.
        progress: print a line per batch and per weight to stderr (default:
            when stderr is a terminal).

    Returns:
        `params` with each selected weight a `Tensor` in `format`, ready for
        `precision.apply` and `precision.save`.

    Raises:
        CalibrationError: no batches, a batch `f` cannot take, a selection
            with nothing to calibrate, NaN or inf among a layer's inputs.

    Examples:
        >>> import numpy as np
        >>> import dtypes, precision
        >>> rng = np.random.default_rng(0)
        >>> params = {"w": rng.normal(size=(64, 16)).astype(np.float32)}
        >>> f = lambda p, x: x @ p["w"]
        >>> batches = [rng.normal(size=(32, 64)).astype(np.float32) for _ in range(8)]
        >>> q = precision.calibrate(f, params, batches, format="int4",
        ...                         scaling=dtypes.PerBlock(32))
        >>> q["w"].format.name, str(q["w"].scaling)  # blocks of 32 inputs (axis 0 of w)
        ('int4', 'per-block 32 on axis 0')
    """
    check_flags(act_order=act_order, clip=clip, sequential=sequential, progress=progress)
    recipe = recipe_of(method, format, scaling, damp, block_size, act_order, alpha, grid, clip)
    budget = check_budget(stats_memory)
    check_sequential(sequential, method)
    progress = sys.stderr.isatty() if progress is None else bool(progress)
    select = _selector(where, exclude)
    flat, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_tensor)
    _refuse_tensors(flat)
    traced = [i for i, (_, leaf) in enumerate(flat) if is_floating(leaf)]
    paths = [_path_str(flat[i][0]) for i in traced]
    values = [leaf for _, leaf in flat]

    def rebuild(xs: list[Any]) -> Any:
        full = list(values)
        for i, x in zip(traced, xs, strict=True):
            full[i] = x
        return jax.tree_util.tree_unflatten(treedef, full)

    data = batches_of(batches)
    found = Found()
    leaves = [values[i] for i in traced]
    sizes = survey(f, leaves, rebuild, data, found)
    sites = _sites(sizes, paths)
    chosen = [j for j, i in enumerate(traced) if select(flat[i][0], flat[i][1])]
    picked = _picked(chosen, sites, paths, found.skipped, explicit=where is not None)
    folds = _folds(method, found, sites, picked)
    order = [j for j in found.order if j in picked]
    work = list(values)  # the parameters with every folding made so far
    scaled: dict[int, np.ndarray] = {}  # AWQ's per-input scales of each folded weight
    out: list[Any] = []
    short: list[str] = []  # weights GPTQ fits on too few rows
    done = 0
    current = list(leaves)  # what the passes run: with `sequential`, weights as converted
    sized = {j: sites[j].size for j in order}
    stages = _stages(order, found.reads) if sequential else [order]
    for chunk in (c for stage in stages for c in chunks(stage, sized, budget)):
        found.wanted = frozenset(chunk)
        what = _pass_label(done, len(chunk), len(order))
        totals = accumulate(f, current, rebuild, data, paths, progress, found, what)
        for (leaf, _, _), stats in totals.items():
            sites[leaf].stats = stats
        for j in chunk:
            if j in folds:
                line = _fold(recipe, *folds[j], sites[j].stats, sites, work, traced, paths, scaled)
                _say(progress, line)
        short += [s for j in chunk if (s := _short_of_rows(method, sites[j])) is not None]
        for j in chunk:
            start = time.perf_counter()
            i, site = traced[j], sites[j]
            how, tensor = _converted(recipe, work[i], site, scaled.get(j))
            out.append((i, tensor))
            if sequential:  # later stages read this weight as rounded
                current[j] = np.asarray(tensor.numpy()).astype(np.asarray(leaves[j]).dtype)
            site.stats = {}  # one chunk's statistics held at a time
            done, took = done + 1, time.perf_counter() - start
            _say(progress, f"[{done}/{len(order)}] {site.path} {how} {took:.2f} s")
    _warn_rows(short)
    return _assemble(treedef, values, work, out)
