"""Quantized contractions side by side: precision vs Qwix (int8) and Flax's fp8 ops.

One Flax linen MLP (Dense width -> ReLU -> Dense width -> ReLU -> Dense 10), the
same float32 parameters and inputs for every row:

- `float32`: the plain model (the reference);
- W8A8 QAT (dynamic int8 activations and weights, straight-through training):
  `precision.apply(model.apply, contract="int8")` and Qwix's `QtProvider` with
  `QtRule(weight_qtype=int8, act_qtype=int8)`; and ours under Qwix's backward
  rule, `Contract("int8", backward_operands="original")` (the cotangent meets
  the operands as given, not as quantized), twice: the same program compiled a
  second time, whose ratio to the first (the "null" comparison) is what two
  calls of one program differ by in the run, the floor the other ratios stand on;
- W8A8 PTQ (int8 weights stored, activations quantized at run time): int8
  storage Tensors (`PerAxis` on the output channel) through the same
  `contract="int8"`, and Qwix's `PtqProvider` + `quantize_params`;
- fp8 training (e4m3 forward, e5m2 gradients, one scale per tensor):
  `precision.Contract("float8_e4m3fn", backward="float8_e5m2")` (current
  scaling) and Flax's `Fp8DirectDotGeneralOp` (delayed scaling: an amax
  history of 1024 steps in the `_overwrite_with_gradient` collection; warmed
  up with a few steps before it is measured, as its scales start at 1).

Columns: logits error against float32 (`||y - y32|| / ||y32||`), the jitted
forward and training-step times (median of `--repeats` rounds; each round calls
every row once, in an order shuffled afresh, so no row always follows the same
one: a PTQ forward timed right after a training step ran about 2% slower than
after another forward, ours and Qwix's alike) and their ratio to float32's, the
parameter bytes as each row keeps them, and the temporary bytes XLA allocates for
the step (its `memory_analysis`). Below the table, each comparison with a peer as
the median over rounds of the two calls' ratio in the same round, with a 95%
bootstrap interval: a load that slows one round slows both calls, so the ratio
moves less than the ratio of two medians. Nothing is installed at run
time: install the peers with `pip install -e ".[peers]"`; a missing peer's rows
are skipped with a note.

    python benchmarks/peers.py                  # width 1024, batch 256
    python benchmarks/peers.py --width 256 --batch 64 --repeats 5   # quick
    python benchmarks/peers.py --model block --width 512 --batch 512  # transformer blocks
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import dtypes
import precision


def _model(width: int, dot_general_cls: Any = None, kind: str = "mlp"):
    import flax.linen as nn

    kw = {} if dot_general_cls is None else {"dot_general_cls": dot_general_cls}

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Dense(width, **kw)(x))
            x = nn.relu(nn.Dense(width, **kw)(x))
            return nn.Dense(10, **kw)(x)

    class Blocks(nn.Module):
        """A transformer's MLP blocks: LayerNorm, width -> 4 width -> width with GELU and
        a residual, twice, between an input projection and a 10-way head."""

        @nn.compact
        def __call__(self, x):
            x = nn.Dense(width, **kw)(x)
            for _ in range(2):
                h = nn.gelu(nn.Dense(4 * width, **kw)(nn.LayerNorm()(x)))
                x = x + nn.Dense(width, **kw)(h)
            return nn.Dense(10, **kw)(x)

    return Blocks() if kind == "block" else MLP()


def _time(fn: Callable, *args, repeats: int) -> float:
    """Median milliseconds of a compiled call (compilation and the first call excluded)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def _temp_bytes(fn: Callable, *args) -> int:
    analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
    return int(getattr(analysis, "temp_size_in_bytes", 0) or 0)


def _loss(forward: Callable, labels: jax.Array) -> Callable:
    def loss(params, x):
        logits = precision.to_full_precision(forward(params, x)).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    return loss


def _sgd_step(loss: Callable) -> Callable:
    def step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)

    return step


class Row(dict):
    pass


def _row(name, forward, params, x, ref, step=None, step_params=None) -> Row:
    """A row's accuracy and bytes now; its timed calls are kept for `_measure`."""
    fwd = jax.jit(forward)
    y = np.asarray(precision.to_full_precision(fwd(params, x)), np.float64)
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    row = Row(name=name, err=err, bytes=precision.tree_nbytes(params), step_ms=None)
    row["calls"] = {"fwd_ms": (fwd, (params, x))}
    if step is not None:
        sp = params if step_params is None else step_params
        row["calls"]["step_ms"] = (jax.jit(step), (sp, x))
        row["temp"] = _temp_bytes(step, sp, x)
    else:
        row["temp"] = _temp_bytes(forward, params, x)
    return row


def _measure(rows: list[Row], repeats: int) -> None:
    """Median times, the rows' calls interleaved round by round (load drifts hit all),
    in a seeded order shuffled every round (what runs before a call moves its time)."""
    calls = [(r, k, fn, args) for r in rows for k, (fn, args) in r.pop("calls").items()]
    times: dict[tuple[int, str], list[float]] = {(id(r), k): [] for r, k, _, _ in calls}
    for _, _, fn, args in calls:
        jax.block_until_ready(fn(*args))  # compiled and warm
    order = list(range(len(calls)))
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for r, k, fn, args in (calls[i] for i in order):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[id(r), k].append(time.perf_counter() - start)
    for r, k, _, _ in calls:
        r[k] = 1000 * statistics.median(times[id(r), k])
        r.setdefault("rounds", {})[k] = times[id(r), k]  # (index i: round i)


def run(width: int, batch: int, repeats: int, kind: str = "mlp") -> tuple[list[Row], list[str]]:
    key = jax.random.key(0)
    k_init, k_x, k_y = jax.random.split(key, 3)
    x = jax.random.normal(k_x, (batch, 784), jnp.float32)
    labels = jax.random.randint(k_y, (batch,), 0, 10)
    model = _model(width, kind=kind)
    params = model.init(k_init, x)
    ref = np.asarray(model.apply(params, x), np.float64)
    notes: list[str] = []
    rows: list[Row] = []

    def training(forward):
        return _sgd_step(_loss(forward, labels))

    rows.append(_row("float32", model.apply, params, x, ref, training(model.apply)))

    # -- W8A8 QAT ------------------------------------------------------------
    ours = precision.apply(model.apply, contract="int8")
    rows.append(_row("precision W8A8 QAT", ours, params, x, ref, training(ours)))
    # Qwix's backward rule: the cotangent meets the operands as given, not as quantized
    qwix_rule = precision.Contract("int8", backward_operands="original")
    ours_orig = precision.apply(model.apply, contract=qwix_rule)
    rows.append(_row("  original operands", ours_orig, params, x, ref, training(ours_orig)))
    # the same program traced and compiled a second time: its ratio to the row above is
    # the comparisons' floor, what two calls of one program differ by in this run
    again = precision.apply(model.apply, contract=qwix_rule)
    rows.append(_row("  same, compiled again", again, params, x, ref, training(again)))
    try:
        import qwix
    except ImportError:
        qwix = None
        notes.append("qwix is not installed (pip install -e '.[peers]'): its rows are skipped")
    if qwix is not None:
        rule = qwix.QtRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)
        qt_model = qwix.quantize_model(model, qwix.QtProvider([rule]))
        rows.append(_row("qwix W8A8 QAT", qt_model.apply, params, x, ref, training(qt_model.apply)))

    # -- W8A8 PTQ ------------------------------------------------------------
    stored = precision.to_reduced_precision(
        params, "int8", scaling=dtypes.PerAxis(-1), where="kernel"
    )
    rows.append(_row("precision W8A8 PTQ", ours, stored, x, ref))
    if qwix is not None:
        rule = qwix.QuantizationRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)
        ptq_model = qwix.quantize_model(model, qwix.PtqProvider([rule]))
        abstract = jax.eval_shape(ptq_model.init, k_init, x)
        qparams = {"params": qwix.quantize_params(params["params"], abstract["params"])}
        rows.append(_row("qwix W8A8 PTQ", ptq_model.apply, qparams, x, ref))

    # -- fp8 -----------------------------------------------------------------
    hybrid = precision.Contract("float8_e4m3fn", backward="float8_e5m2", scaling="tensorwise")
    ours8 = precision.apply(model.apply, contract=hybrid)
    rows.append(_row("precision fp8 HYBRID", ours8, params, x, ref, training(ours8)))
    try:
        from flax.linen import fp8_ops
    except ImportError:
        fp8_ops = None
        notes.append("flax.linen.fp8_ops is not available: the Flax fp8 row is skipped")
    if fp8_ops is not None:
        rows.append(_flax_fp8(fp8_ops, width, params, x, labels, ref, kind))
    _measure(rows, repeats)
    return rows, notes


def _flax_fp8(fp8_ops, width, params, x, labels, ref, kind) -> Row:
    """Flax's fp8 Dense layers: delayed scaling, its meta state updated through gradients."""
    owg = fp8_ops.OVERWRITE_WITH_GRADIENT
    model = _model(width, fp8_ops.Fp8DirectDotGeneralOp, kind)
    variables = model.init(jax.random.key(0), x)
    variables = {**variables, "params": params["params"]}  # the same float32 weights

    def loss(v, x):
        logits = model.apply(v, x)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    def step(v, x):
        grads = jax.grad(loss)(v, x)
        new = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, v["params"], grads["params"])
        # the fp8 meta (amax histories, scales) is replaced by its "gradient"
        return {"params": new, owg: grads[owg]}

    def meta_only(v, x):
        return {"params": v["params"], owg: jax.grad(loss)(v, x)[owg]}

    warm = jax.jit(meta_only)
    for _ in range(4):  # scales start at 1: let the amax history see the tensors
        variables = warm(variables, x)
    row = _row("flax fp8 (delayed)", model.apply, variables, x, ref, step)
    row["bytes"] = precision.tree_nbytes(variables["params"])
    return row


# (label, our row, the peer's row, the call): the comparisons issue 35's acceptance reads
COMPARISONS = (
    ("W8A8 PTQ forward / Qwix", "precision W8A8 PTQ", "qwix W8A8 PTQ", "fwd_ms"),
    ("W8A8 QAT step, Qwix's rule / Qwix", "  original operands", "qwix W8A8 QAT", "step_ms"),
    ("W8A8 QAT step, our rule / Qwix", "precision W8A8 QAT", "qwix W8A8 QAT", "step_ms"),
    ("fp8 training step / Flax", "precision fp8 HYBRID", "flax fp8 (delayed)", "step_ms"),
)
# one program against itself, printed after them: the floor under their ratios
NULL = (
    "null: Qwix's rule, compiled twice",
    "  same, compiled again",
    "  original operands",
    "step_ms",
)


def paired_ratio(ours: list[float], peer: list[float], seed: int = 0) -> tuple[float, float, float]:
    """The median over rounds of ours / peer, each round's two calls taken together (a load
    that slows one round slows both), with a 95% bootstrap interval of that median."""
    ratios = np.asarray(ours) / np.asarray(peer)
    rng = np.random.default_rng(seed)
    resampled = rng.choice(ratios, size=(2000, ratios.size), replace=True)
    low, high = np.quantile(np.median(resampled, axis=1), [0.025, 0.975])
    return float(np.median(ratios)), float(low), float(high)


def format_comparisons(rows: list[Row]) -> str:
    """Each comparison of `COMPARISONS` whose rows ran, as its paired per-round ratio,
    then `NULL`'s."""
    by_name = {r["name"]: r for r in rows}
    lines = ["ours / peer, per round (median, 95% interval):"]

    def add(label: str, mine: str, theirs: str, key: str) -> None:
        if mine in by_name and theirs in by_name:
            ours, peer = by_name[mine]["rounds"][key], by_name[theirs]["rounds"][key]
            mid, low, high = paired_ratio(ours, peer)
            lines.append(f"  {label:<36} {mid:5.3f}  [{low:5.3f}, {high:5.3f}]")

    for comparison in COMPARISONS:
        add(*comparison)
    if len(lines) == 1:
        lines.append("  none: no peer ran (see the notes)")
    add(*NULL)
    return "\n".join(lines)


def format_table(rows: list[Row]) -> str:
    base = rows[0]
    lines = [
        f"{'row':<22} {'logits err':>10} {'fwd ms':>8} {'x f32':>6} {'step ms':>8} "
        f"{'x f32':>6} {'param bytes':>12} {'temp bytes':>11}",
    ]
    for r in rows:
        step = (
            f"{r['step_ms']:8.2f} {r['step_ms'] / base['step_ms']:6.2f}"
            if r["step_ms"]
            else (f"{'-':>8} {'-':>6}")
        )
        lines.append(
            f"{r['name']:<22} {r['err']:10.2e} {r['fwd_ms']:8.2f} "
            f"{r['fwd_ms'] / base['fwd_ms']:6.2f} {step} {r['bytes']:12,} {r['temp']:11,}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--model", choices=("mlp", "block"), default="mlp",
                   help="mlp: 784-width-width-10; block: two transformer MLP blocks "
                        "(LayerNorm, width-4width-width GELU, residual)")  # fmt: skip
    args = p.parse_args(argv)
    rows, notes = run(args.width, args.batch, args.repeats, args.model)
    dev = jax.devices()[0]
    what = (
        f"MLP 784-{args.width}-{args.width}-10"
        if args.model == "mlp"
        else f"two transformer MLP blocks, d={args.width} (4d hidden)"
    )
    print(f"{what}, batch {args.batch}, jax {jax.__version__}, {dev.platform} ({dev.device_kind})")
    print(format_table(rows))
    print(format_comparisons(rows))
    for note in notes:
        print("note:", note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
