"""Calibrated weight conversion (`precision.calibrate`) on small models trained here.

Run:  python benchmarks/calibration.py               # 6 layers, d 384: ~15 min training, once
      python benchmarks/calibration.py --quick       # 2 layers, d 64: about a minute
      python benchmarks/calibration.py --retrain     # ignore the cached weights

Text: a byte-level decoder-only transformer (Flax linen; pre-LayerNorm blocks with separate
q, k, v Dense layers, causal softmax attention, a 4d gelu MLP, an untied Dense head) trained
with AdamW on the `.py` files of the standard library of the Python running it (sorted, read
as bytes, concatenated; site-packages left out): the first 90% trains, the last 10% is held
out. Training runs for a wall-clock budget (warmup then cosine, as fractions of that budget),
so the step count depends on the machine; the weights are cached under
`$XDG_CACHE_HOME/precision/calibration-bench/` (else `~/.cache/...`) and reused, so later
runs evaluate the same model. Each row reports bits per byte on `--eval-windows` held-out
windows (evenly spaced), the loss against float32 with twice its standard error (paired over
the windows), and the seconds `calibrate` took (recording included, compilation too).
Calibration batches are random windows of the training split, never of the held-out one.

Rows: float32; int4 per block of 128 by round-to-nearest, GPTQ and AWQ (weights decoded at
use); int8 per output channel by round-to-nearest; W8A8 (`apply(..., contract="int8")`,
int8 activations per row) on round-to-nearest and SmoothQuant int8 weights. A method that
`calibrate` refuses is printed as n/a with its message. The targets follow the table.

Digits: a small ResNet-style network on scikit-learn's 8 x 8 digits, its held-out accuracy
and cross-entropy in float32, RTN int4 and GPTQ int4. `calibrate` records `dot_general`
contractions only, so its 3 x 3 convolutions are written as patch extraction (slicing and
concatenation) followed by `nn.Dense`; `--skip-digits` leaves this part out.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import platform
import sys
import sysconfig
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import dtypes
import precision


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int = 6
    width: int = 384
    heads: int = 6
    context: int = 128
    batch: int = 16
    lr: float = 2e-3
    minutes: float = 15.0
    seed: int = 0

    def name(self) -> str:
        return (
            f"gpt-L{self.layers}-d{self.width}-h{self.heads}-T{self.context}-b{self.batch}"
            f"-lr{self.lr:g}-{self.minutes:g}min-seed{self.seed}.npz"
        )


# (row, method, format, scaling, contract)
ROWS = [
    ("float32", None, None, None, None),
    ("RTN int4 g128", "rtn", "int4", dtypes.PerBlock(128), None),
    ("GPTQ int4 g128", "gptq", "int4", dtypes.PerBlock(128), None),
    ("AWQ int4 g128", "awq", "int4", dtypes.PerBlock(128), None),
    ("RTN int8 per-channel", "rtn", "int8", dtypes.PerAxis(), None),
    ("W8A8 RTN", "rtn", "int8", dtypes.PerAxis(), "int8"),
    ("W8A8 SmoothQuant", "smoothquant", "int8", dtypes.PerAxis(), "int8"),
]


def stdlib_bytes() -> np.ndarray:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)
    )
    return np.frombuffer(b"".join(p.read_bytes() for p in files), np.uint8)


class Block(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x):
        b, t, d = x.shape
        h = nn.LayerNorm()(x)
        q, k, v = (nn.Dense(d)(h).reshape(b, t, self.heads, -1) for _ in range(3))
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d // self.heads)
        causal = np.tril(np.ones((t, t), bool))  # a constant: no iota in the traced graph
        weights = jax.nn.softmax(jnp.where(causal, scores, jnp.finfo(scores.dtype).min), -1)
        x = x + nn.Dense(d)(jnp.einsum("bhts,bshd->bthd", weights, v).reshape(b, t, d))
        h = nn.Dense(4 * d)(nn.LayerNorm()(x))
        return x + nn.Dense(d)(nn.gelu(h))


class ByteGPT(nn.Module):
    layers: int
    width: int
    heads: int
    context: int

    @nn.compact
    def __call__(self, tokens):
        pos = self.param("pos", nn.initializers.normal(0.02), (self.context, self.width))
        x = nn.Embed(256, self.width)(tokens) + pos[: tokens.shape[1]]
        for _ in range(self.layers):
            x = Block(self.heads)(x)
        return nn.Dense(256)(nn.LayerNorm()(x))


def model_of(cfg: Config) -> ByteGPT:
    return ByteGPT(cfg.layers, cfg.width, cfg.heads, cfg.context)


def windows(data: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    return np.stack([data[s : s + length] for s in starts]).astype(np.int32)


def nats(logits, targets):
    """Mean cross-entropy per window (nats)."""
    logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), -1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1)[..., 0], axis=-1)


def train(cfg: Config, data: np.ndarray, say=print):
    model, rng = model_of(cfg), np.random.default_rng(cfg.seed)
    params = model.init(jax.random.key(cfg.seed), np.zeros((1, cfg.context), np.int32))
    decay = jax.tree_util.tree_map(lambda a: a.ndim > 1, params)
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.scale_by_adam(b2=0.98),
        optax.add_decayed_weights(0.1, mask=decay),
    )

    @jax.jit
    def step(params, state, xy, lr):
        def loss(p):
            return jnp.mean(nats(model.apply(p, xy[:, :-1]), xy[:, 1:]))

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = tx.update(grads, state, params)
        return jax.tree_util.tree_map(lambda p, u: p - lr * u, params, updates), state, value

    def rate(frac: float) -> float:  # warmup over 5% of the budget, cosine to 10% of peak
        if frac < 0.05:
            return cfg.lr * frac / 0.05
        return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (frac - 0.05) / 0.95))))

    state, budget, steps, last = tx.init(params), 60 * cfg.minutes, 0, 0.0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < budget:
        starts = rng.integers(0, len(data) - cfg.context - 1, cfg.batch)
        xy = windows(data, starts, cfg.context + 1)
        params, state, value = step(params, state, xy, rate(elapsed / budget))
        value, steps = float(value), steps + 1  # waits for the step: the clock sees its work
        if elapsed - last >= budget / 12 or steps == 1:
            say(f"  step {steps:5d}  {elapsed:6.0f} s  loss {value / math.log(2):.3f} bit/B")
            last = elapsed
    return params, steps


def cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "precision" / "calibration-bench"


def save_params(path: pathlib.Path, params, steps: int) -> None:
    flat = {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_leaves_with_path(params)
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
        np.savez(f, __steps__=np.int64(steps), **flat)
    os.replace(f.name, path)


def load_params(path: pathlib.Path, cfg: Config):
    shapes = jax.eval_shape(model_of(cfg).init, jax.random.key(0), jnp.zeros((1, cfg.context), int))
    with np.load(path) as z:
        leaves = [
            z[jax.tree_util.keystr(k)] for k, _ in jax.tree_util.tree_leaves_with_path(shapes)
        ]
        steps = int(z["__steps__"])
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), leaves), steps


def trained(cfg: Config, data: np.ndarray, retrain: bool):
    path = cache_dir() / cfg.name()
    if path.exists() and not retrain:
        params, steps = load_params(path, cfg)
        print(f"weights: {path} ({steps} steps, cached)")
        return params
    print(f"training {cfg.name()[:-4]} for {cfg.minutes:g} min on {len(data):,} bytes")
    params, steps = train(cfg, data)
    save_params(path, params, steps)
    print(f"weights: {path} ({steps} steps, written)")
    return params


def convert(f, params, batches, method, fmt, scaling):
    """(converted params, seconds) or (None, reason)."""
    start = time.perf_counter()
    try:
        q = precision.calibrate(f, params, batches, method=method, format=fmt, scaling=scaling)
    except precision.CalibrationError as err:
        return None, str(err).splitlines()[0]
    except Exception as err:  # a failure, not a refusal: shown as such, the other rows go on
        return None, f"ERROR {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    jax.block_until_ready(q)
    return q, time.perf_counter() - start


def evaluate(f, params, inputs, targets, contract=None, chunk=32) -> np.ndarray:
    """Mean nats per window of `f` under `precision.apply` (plain `f` for float arrays)."""
    run = precision.apply(f, contract=contract)
    per_window = jax.jit(lambda p, x, y: nats(precision.to_full_precision(run(p, x)), y))
    out = [
        np.asarray(per_window(params, inputs[i : i + chunk], targets[i : i + chunk]))
        for i in range(0, len(inputs), chunk)
    ]
    return np.concatenate(out)


def text_rows(cfg: Config, args) -> dict[str, tuple]:
    data = stdlib_bytes()
    cut = int(0.9 * len(data))
    train_data, held = data[:cut], data[cut:]
    print(f"text: {len(data):,} bytes of stdlib .py; train {cut:,}, held out {len(held):,}")
    params = trained(cfg, train_data, args.retrain)
    f = model_of(cfg).apply
    starts = np.linspace(0, len(held) - cfg.context - 1, args.eval_windows).astype(int)
    xy = windows(held, starts, cfg.context + 1)
    rng = np.random.default_rng(cfg.seed + 1)
    batches = [
        windows(train_data, rng.integers(0, cut - cfg.context, 8), cfg.context)
        for _ in range(args.calib_batches)
    ]
    print(
        f"\n{args.eval_windows} held-out windows of {cfg.context} bytes, "
        f"{len(batches)} calibration batches of 8"
    )
    print(f"{'row':<22} {'bit/B':>9} {'loss':>9} {'2 se':>8} {'calib s':>9}")
    results = {}
    for row, method, fmt, scaling, contract in ROWS:
        q, took = (
            (params, None) if method is None else convert(f, params, batches, method, fmt, scaling)
        )
        if q is None:
            results[row] = (None, took)
        else:
            results[row] = (evaluate(f, q, xy[:, :-1], xy[:, 1:], contract) / math.log(2), took)
        print_row(row, results[row], results["float32"][0])
    return results


def print_row(row, result, base) -> None:
    bits, took = result
    if bits is None:
        print(f"{row:<22} n/a ({took})", flush=True)
        return
    diff = bits - base
    se = 2 * diff.std(ddof=1) / math.sqrt(len(diff)) if row != "float32" else 0.0
    secs = "-" if took is None else f"{took:.1f}"
    print(f"{row:<22} {bits.mean():>9.4f} {diff.mean():>+9.4f} {se:>8.4f} {secs:>9}", flush=True)


def loss_of(results, row):
    bits = results[row][0]
    return None if bits is None else float(bits.mean() - results["float32"][0].mean())


def half_check(results, row, base_row) -> str:
    lost, base = loss_of(results, row), loss_of(results, base_row)
    if lost is None or base is None:
        return f"n.a. ({row if lost is None else base_row} missing)"
    if base <= 0:
        return f"n.a. ({base_row} loses nothing: {base:+.4f})"
    verdict = "PASS" if lost <= 0.5 * base else "FAIL"
    return f"{verdict} ({lost:+.4f} vs {base:+.4f} bit/B, ratio {lost / base:.2f})"


def print_checks(results, cfg: Config) -> None:
    print("\ntargets:")
    for row in ("GPTQ int4 g128", "AWQ int4 g128"):
        print(
            f"  {row} loses at most half of RTN int4: {half_check(results, row, 'RTN int4 g128')}"
        )
    sq = half_check(results, "W8A8 SmoothQuant", "W8A8 RTN")
    print(f"  SmoothQuant W8A8 loses at most half of W8A8 RTN: {sq}")
    for row in ("GPTQ int4 g128", "AWQ int4 g128", "W8A8 SmoothQuant"):
        took = results[row][1]
        if results[row][0] is None:
            verdict = "n.a. (method unavailable)"
        elif cfg.layers != 6:
            verdict = f"n.a. ({cfg.layers}-layer model: {took:.1f} s)"
        else:
            verdict = f"{'PASS' if took <= 120 else 'FAIL'} ({took:.1f} s)"
        print(f"  {row} calibration of the 6-layer model <= 2 minutes: {verdict}")


def patches(x):
    """3 x 3 neighbourhoods of each pixel (zero padded), stacked on the channel axis."""
    _, h, w, _ = x.shape
    p = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    return jnp.concatenate([p[:, i : i + h, j : j + w] for i in range(3) for j in range(3)], -1)


class ResBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        c = x.shape[-1]
        h = nn.relu(nn.Dense(c)(patches(nn.LayerNorm()(x))))
        return x + nn.Dense(c)(patches(h))


class DigitsNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(32)(patches(x)))
        x = ResBlock()(ResBlock()(x))
        x = nn.avg_pool(x, (2, 2), (2, 2))
        x = ResBlock()(ResBlock()(nn.Dense(64)(x)))
        return nn.Dense(10)(nn.LayerNorm()(jnp.mean(x, axis=(1, 2))))


def digits(args) -> None:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    order = np.random.default_rng(0).permutation(len(x))
    tr, te = order[: int(0.8 * len(x))], order[int(0.8 * len(x)) :]
    model, rng = DigitsNet(), np.random.default_rng(0)
    params = model.init(jax.random.key(0), x[:1])
    steps = args.digits_epochs * (len(tr) // 64)
    tx = optax.adamw(optax.cosine_decay_schedule(3e-3, steps), weight_decay=1e-4)

    @jax.jit
    def step(params, state, xb, yb):
        grads = jax.grad(lambda p: jnp.mean(nats(model.apply(p, xb)[:, None], yb[:, None])))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state, start = tx.init(params), time.perf_counter()
    for _ in range(steps):
        idx = rng.choice(tr, 64, replace=False)
        params, state = step(params, state, x[idx], y[idx])
    print(
        f"\ndigits: {len(tr)} train / {len(te)} held-out images, {steps} steps, "
        f"{time.perf_counter() - start:.1f} s"
    )
    batches = [x[tr[i : i + 64]] for i in range(0, 16 * 64, 64)]
    block = dtypes.PerBlock(args.digits_block)
    print(f"{'row':<22} {'accuracy':>9} {'nats':>9} {'calib s':>9}")
    for row, method in (
        ("float32", None),
        (f"RTN int4 g{args.digits_block}", "rtn"),
        (f"GPTQ int4 g{args.digits_block}", "gptq"),
    ):
        q, took = (
            (params, None)
            if method is None
            else convert(model.apply, params, batches, method, "int4", block)
        )
        if q is None:
            print(f"{row:<22} n/a ({took})")
            continue
        logits = np.asarray(precision.to_full_precision(precision.apply(model.apply)(q, x[te])))
        acc = float(np.mean(logits.argmax(-1) == y[te]))
        ce = float(np.mean(nats(logits[:, None], y[te][:, None])))
        print(f"{row:<22} {acc:>9.4f} {ce:>9.4f} {'-' if took is None else f'{took:.1f}':>9}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 layers, d 64, 20 s of training")
    parser.add_argument("--retrain", action="store_true", help="ignore the cached weights")
    parser.add_argument("--train-minutes", type=float, default=15.0)
    parser.add_argument("--eval-windows", type=int, default=None, help="default 256 (quick: 32)")
    parser.add_argument("--calib-batches", type=int, default=16, help="of 8 windows each")
    parser.add_argument("--skip-digits", action="store_true")
    parser.add_argument("--digits-epochs", type=int, default=20)
    parser.add_argument("--digits-block", type=int, default=32)
    args = parser.parse_args(argv)
    if args.train_minutes > 15:
        parser.error("--train-minutes must be at most 15")
    if args.quick:
        cfg = Config(layers=2, width=64, heads=4, context=64, batch=16, lr=3e-3, minutes=1 / 3)
        args.eval_windows = args.eval_windows or 32
        args.calib_batches = min(args.calib_batches, 4)
    else:
        cfg = Config(minutes=args.train_minutes)
        args.eval_windows = args.eval_windows or 256
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"python {platform.python_version()}, jax {jax.__version__} ({jax.default_backend()}), "
        f"precision {precision.__version__}; load {os.getloadavg()[0]:.1f}"
    )
    print(f"model: {cfg}")
    results = text_rows(cfg, args)
    print_checks(results, cfg)
    if not args.skip_digits:
        digits(args)
    print(f"\nload at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
