"""Why AWQ Q4_0 is no better than ggml's round-to-nearest on the `--small` model of
`calibration_gguf.py`: per-layer output error against bits per byte.

Run:  python benchmarks/calibration_awq_q4_0.py    # the cached 4-layer, d 128 model; minutes

For every matrix it rounds onto Q4_0's grid four ways, as `calibrate(method="awq",
format="q4_0")` does in parts: RTN (ggml's rule), AWQ's scales only, AWQ's clip search
only, and both (what `calibrate` writes), and prints

1. the output error `trace(D^T H D)` of each, as a fraction of RTN's, on the calibration
   batches (where AWQ searched), on other training windows ("val") and on the held-out
   windows of `calibration_gguf.py`;
2. each variant's loss in bits per byte against float32 (this library's forward), on 512
   training windows none of the calibration batches chose and on the held-out windows;
3. the first-order part of that loss, `<dL/dW, Q(W) - W>` per matrix, with `dL/dW`
   taken on 128 training windows, and `<dL/dW, W>` (what growing a matrix would do).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]
import calibration as bench  # noqa: E402

from precision._calibrate._smooth import awq_clip, awq_scales  # noqa: E402
from precision._checkpoint import _q4_0  # noqa: E402

VARIANTS = ("rtn", "scale", "clip", "both")


def capture(model, params, tokens) -> dict[str, np.ndarray]:
    """Each Dense's input rows (n, inputs), keyed by its module path."""
    out: dict[str, list[np.ndarray]] = {}

    def intercept(next_fun, args, kwargs, context):
        if isinstance(context.module, nn.Dense) and context.method_name == "__call__":
            x = np.asarray(args[0], np.float64)
            out.setdefault("/".join(getattr(context.module.scope, "path", ())), []).append(
                x.reshape(-1, x.shape[-1])
            )
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(intercept):
        model.apply(params, tokens)
    return {k: np.concatenate(v) for k, v in out.items()}


def stats(model, params, batches) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
    """(H = X^T X, sum |x|, rows) of each Dense's inputs over `batches`."""
    acc: dict[str, tuple] = {}
    for b in batches:
        for k, x in capture(model, params, jnp.asarray(b)).items():
            h, s, n = acc.get(k, (0, 0, 0))
            acc[k] = (h + x.T @ x, s + np.abs(x).sum(0), n + len(x))
    return acc


def kernel(tree, name: str) -> np.ndarray:
    d = tree["params"]
    for part in name.split("/"):
        d = d[part]
    return np.asarray(d["kernel"], np.float64)


def err(d: np.ndarray, h: np.ndarray) -> float:
    return float(np.sum((h @ d) * d))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-steps", type=int, default=None, help=bench.STEPS_HELP)
    args = parser.parse_args(argv)
    cfg = bench.Config(layers=4, width=128, heads=4, lr=3e-3, steps=args.train_steps)
    data = bench.stdlib_bytes()
    cut = int(0.9 * len(data))
    train, held = data[:cut], data[cut:]
    params = jax.tree.map(jnp.asarray, bench.trained(cfg, train, False))
    model = bench.model_of(cfg)
    starts = np.linspace(0, len(held) - cfg.context - 1, 128).astype(int)
    xy = bench.windows(held, starts, cfg.context + 1)
    rng = np.random.default_rng(cfg.seed + 1)  # calibration_gguf.py's batches
    batches = [
        bench.windows(train, rng.integers(0, cut - cfg.context, 8), cfg.context) for _ in range(16)
    ]
    other = np.random.default_rng(12345)
    val = bench.windows(train, other.integers(0, cut - cfg.context - 1, 512), cfg.context + 1)

    cal = stats(model, params, batches)
    splits = {
        "calib": cal,
        "val": stats(model, params, [val[i : i + 8, :-1] for i in range(0, 128, 8)]),
        "held": stats(model, params, [xy[i : i + 8, :-1] for i in range(0, 128, 8)]),
    }
    q = _q4_0.decoded
    folds = {f"Block_{i}/Dense_0": [f"Block_{i}/Dense_{j}" for j in range(3)] for i in range(4)}
    folds |= {f"Block_{i}/Dense_4": [f"Block_{i}/Dense_4"] for i in range(4)}
    folds["Dense_0"] = ["Dense_0"]
    scales: dict[str, np.ndarray] = {}
    for key, members in folds.items():
        h, s, n = cal[key]
        ws = [(kernel(params, m).astype(np.float32), 0) for m in members]
        sc, alpha = awq_scales(h, s / n, ws, q, 20)
        span = f"{sc.min():.3f}..{sc.max():.3f}"
        print(f"AWQ scales for {', '.join(members)}: alpha {alpha:.2f}, {span}")
        scales |= dict.fromkeys(members, sc)

    names = sorted(cal)
    variants = {}
    for m in names:
        w = kernel(params, m)
        s = scales.get(m, np.ones(w.shape[0]))
        ws = (w * s[:, None]).astype(np.float32)
        hs = cal[m][0] / np.outer(s, s)
        variants[m] = {
            "rtn": q(w.astype(np.float32), 0),
            "scale": q(ws, 0) / s[:, None],
            "clip": q(awq_clip(w.astype(np.float32), 0, cal[m][0], 32, q, 20), 0),
            "both": q(awq_clip(ws, 0, hs, 32, q, 20), 0) / s[:, None],
        }

    print("\n1. output error trace(D^T H D) / RTN's (rtn scale clip both)")
    print(f"{'matrix':<16}" + "".join(f"{k:>29}" for k in splits))
    for m in names:
        w = kernel(params, m)
        row = f"{m:<16}"
        for split in splits.values():
            h = split[m][0]
            base = err(w - variants[m]["rtn"], h)
            row += "  " + "".join(f"{err(w - variants[m][v], h) / base:7.3f}" for v in VARIANTS)
        print(row)

    run = model.apply
    base_v, base_h = bench.evaluate(run, params, val), bench.evaluate(run, params, xy)
    print("\n2. loss in bit/B against float32 (± 2 se over windows)")
    for v in VARIANTS:
        p = jax.tree_util.tree_map(np.asarray, params)
        for m in names:
            d = p["params"]
            for part in m.split("/"):
                d = d[part]
            d["kernel"] = np.asarray(variants[m][v], np.float32)
        lv, lh = bench.evaluate(run, p, val) - base_v, bench.evaluate(run, p, xy) - base_h
        se_v, se_h = 2 * lv.std() / np.sqrt(len(lv)), 2 * lh.std() / np.sqrt(len(lh))
        print(
            f"  {v:<6} 512 training windows {lv.mean():+.5f} ± {se_v:.5f}"
            f"   128 held-out {lh.mean():+.5f} ± {se_h:.5f}"
        )

    def loss(p, w):
        return jnp.mean(bench.nats(model.apply(p, w[:, :-1]), w[:, 1:])) / np.log(2)

    grad = jax.jit(jax.grad(loss))
    parts = [grad(params, jnp.asarray(val[i : i + 16])) for i in range(0, 128, 16)]
    g = jax.tree.map(lambda *a: sum(np.asarray(x, np.float64) for x in a) / len(a), *parts)
    print("\n3. first-order loss <dL/dW, Q(W) - W> (bit/B), and <dL/dW, W>")
    print(f"{'matrix':<16}{'<g,W>':>9}" + "".join(f"{v:>9}" for v in VARIANTS))
    total = dict.fromkeys(VARIANTS, 0.0)
    for m in names:
        w, gw = kernel(params, m), kernel(g, m)
        row = f"{m:<16}{np.sum(gw * w):+9.5f}"
        for v in VARIANTS:
            t = float(np.sum(gw * (variants[m][v] - w)))
            total[v] += t
            row += f"{t:+9.5f}"
        print(row)
    print(f"{'total':<25}" + "".join(f"{total[v]:+9.5f}" for v in VARIANTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
