"""Calibrated weight conversion (`precision.calibrate`): quality and time on models trained here.

Run:  python benchmarks/calibration.py            # 6 layers, d 384: 15 min of training, once
      python benchmarks/calibration.py --quick    # 2 layers, d 64: about a minute end to end
      python benchmarks/calibration.py --retrain  # train again instead of reusing the cache

Text: a byte-level decoder-only transformer (Flax linen, pre-LayerNorm blocks: separate q, k, v
Dense layers, causal softmax attention, a 4d gelu MLP; an untied Dense head) trained with AdamW
on the standard library's `.py` files of the running Python (sorted, site-packages left out,
concatenated as bytes): the first 90% trains, the last 10% is held out. Training runs for a
wall-clock budget (warmup then cosine over fractions of it; `--train-steps N` trains for N
steps instead, the same model on every machine), so its step count depends on the
machine and its load; the weights are cached in `$XDG_CACHE_HOME/precision/calibration-bench/`
(or `~/.cache/...`) and reused, so later runs evaluate the same model. Each row gives bits per
byte on `--eval-windows` evenly spaced held-out windows, the loss against float32 with twice
its standard error (paired over the windows), and the seconds `calibrate` took (recording
and its compilation included). Calibration batches are random windows of the training split.

Rows: float32; int4 in blocks of 128 inputs by round-to-nearest, GPTQ and AWQ (decoded at
use), with Qwix's round-to-nearest and GPTQ beside ours (see `qwix_int4`; skipped with a note
when qwix is not installed: `pip install -e ".[peers]"`); int8 per output channel by
round-to-nearest; W8A8 (`apply(..., contract="int8")`, int8 activations per row) on
round-to-nearest and on SmoothQuant int8 weights; then W8A8 again on the same model
reparametrised to have activation outliers (`with_outliers`: a few LayerNorm features 128x
larger, the rows reading them 128x smaller, float32 bits unchanged), the case
SmoothQuant exists for. A method that `calibrate` refuses prints as `n/a` with its message, a
failure as `ERROR`. Targets follow, and our int4 rows against Qwix's, paired over the windows.

Digits: a small ResNet (`nn.Conv` 3 x 3 residual blocks) on scikit-learn's 8 x 8 digits:
held-out accuracy and cross-entropy in float32, RTN int4 and GPTQ int4 (blocks along each
kernel's input channels; `calibrate` records a convolution through its input patches).
`--skip-digits` leaves it out.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
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

#: Tokens: the 256 bytes, then two that the text never holds but llama.cpp's byte-level
#: vocabulary needs (one merge, "ĠĠ", and an end-of-text token): see `benchmarks/gguf_export.py`.
VOCAB = 258


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int = 6
    width: int = 384
    heads: int = 6
    context: int = 128
    batch: int = 16
    lr: float = 2e-3
    minutes: float = 15.0
    steps: int | None = None  # a fixed number of steps instead of the time budget
    seed: int = 0
    vocab: int = VOCAB

    def name(self) -> str:
        return (
            f"gpt-L{self.layers}-d{self.width}-h{self.heads}-T{self.context}-b{self.batch}"
            f"-lr{self.lr:g}-{self.budget()}-seed{self.seed}-V{self.vocab}.npz"
        )

    def budget(self) -> str:
        """The training's length as the cache name and messages give it."""
        return f"{self.steps}steps" if self.steps else f"{60 * self.minutes:g}s"


STEPS_HELP = (
    "train for this many steps (learning rate scheduled by step) instead of --train-minutes: "
    "the same model on every machine, in however long the machine takes"
)

# (row, method, format, scaling, contract)
ROWS = [
    ("float32", None, None, None, None),
    ("RTN int4 g128", "rtn", "int4", dtypes.PerBlock(128), None),
    ("Qwix RTN int4 g128", "qwix-rtn", "int4", dtypes.PerBlock(128), None),
    ("GPTQ int4 g128", "gptq", "int4", dtypes.PerBlock(128), None),
    ("GPTQ int4 g128 (paper)", "gptq-paper", "int4", dtypes.PerBlock(128), None),
    ("Qwix GPTQ int4 g128", "qwix-gptq", "int4", dtypes.PerBlock(128), None),
    ("AWQ int4 g128", "awq", "int4", dtypes.PerBlock(128), None),
    ("AWQ+GPTQ int4 g128", "awq+gptq", "int4", dtypes.PerBlock(128), None),
    ("RTN int8 per-channel", "rtn", "int8", dtypes.PerAxis(), None),
    ("W8A8 RTN", "rtn", "int8", dtypes.PerAxis(), "int8"),
    ("W8A8 SmoothQuant", "smoothquant", "int8", dtypes.PerAxis(), "int8"),
]


# W8A8 again on the same model given outlier channels (see `with_outliers`)
OUTLIER_ROWS = [
    ("float32 + outliers", None, None, None, None),
    ("W8A8 RTN + outliers", "rtn", "int8", dtypes.PerAxis(), "int8"),
    ("W8A8 SQ + outliers", "smoothquant", "int8", dtypes.PerAxis(), "int8"),
]
# A power of two (the reparametrised model computes the same numbers), about the hundredfold
# range of the outlier channels large language models grow; 32 here is within noise.
OUTLIER_FACTOR = 128.0
OUTLIER_CHANNELS = 4


def with_outliers(params, cfg: Config):
    """The same function with activation outliers, as large language models grow them.

    In every block, `OUTLIER_CHANNELS` features of each LayerNorm's output are made
    `OUTLIER_FACTOR` times larger (its scale and bias) and the rows of the Dense
    kernels reading them (q, k, v after the first norm; the MLP's first layer after
    the second) are divided by the same factor. A power of two times a float32 and
    divided back is exact, so float32 logits are bit for bit the original's; only
    an int8 quantization of the activations sees the outliers.
    """
    rng = np.random.default_rng(cfg.seed + 2)
    tree = jax.tree.map(np.array, params)  # a copy to edit
    for layer in range(cfg.layers):
        block = tree["params"][f"Block_{layer}"]
        for norm, readers in (
            ("LayerNorm_0", ("Dense_0", "Dense_1", "Dense_2")),
            ("LayerNorm_1", ("Dense_4",)),
        ):
            idx = rng.choice(cfg.width, OUTLIER_CHANNELS, replace=False)
            for leaf in ("scale", "bias"):
                block[norm][leaf][idx] *= np.float32(OUTLIER_FACTOR)
            for dense in readers:
                block[dense]["kernel"][idx, :] /= np.float32(OUTLIER_FACTOR)
    return jax.tree.map(jnp.asarray, tree)


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
        x = nn.Embed(VOCAB, self.width)(tokens) + pos[: tokens.shape[1]]
        for _ in range(self.layers):
            x = Block(self.heads)(x)
        # no bias on the head: GPT-2's (and so llama.cpp's gpt2) has none
        return nn.Dense(VOCAB, use_bias=False)(nn.LayerNorm()(x))


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

    def done() -> float | None:
        """The fraction of the training done, or None when it is over: of the steps
        where a step count is set (the same model on every machine), else of the
        wall-clock budget (as many steps as the machine makes in it)."""
        if cfg.steps:
            return steps / cfg.steps if steps < cfg.steps else None
        elapsed = time.perf_counter() - start
        return elapsed / budget if elapsed < budget else None

    while (frac := done()) is not None:
        starts = rng.integers(0, len(data) - cfg.context - 1, cfg.batch)
        xy = windows(data, starts, cfg.context + 1)
        params, state, value = step(params, state, xy, rate(frac))
        value, steps = float(value), steps + 1  # waits for the step: the clock sees its work
        elapsed = time.perf_counter() - start
        if frac - last >= 1 / 12 or steps == 1:
            say(f"  step {steps:5d}  {elapsed:6.0f} s  loss {value / math.log(2):.3f} bit/B")
            last = frac
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
        try:
            np.savez(f, __steps__=np.int64(steps), **flat)
        except BaseException:
            os.unlink(f.name)
            raise
    os.chmod(f.name, 0o644)  # as a plain write would leave it (the temporary file is 0600)
    os.replace(f.name, path)  # whole or not at all, even with two runs at once


def load_params(path: pathlib.Path, cfg: Config):
    shapes = jax.eval_shape(
        model_of(cfg).init, jax.random.key(0), np.zeros((1, cfg.context), np.int32)
    )
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
    print(f"training {cfg.name()[:-4]} ({cfg.budget()}) on {len(data):,} bytes")
    params, steps = train(cfg, data)
    save_params(path, params, steps)
    print(f"weights: {path} ({steps} steps, written)")
    return params


# GPTQ as published (inputs in order, each group's whole range), as Qwix's GPTQ runs it
PAPER = {"gptq-paper": ("gptq", {"act_order": False, "clip": False})}


def convert(f, params, batches, method, fmt, scaling):
    """(converted params, seconds), or (None, why): `n/a` a refusal, `ERROR` a failure."""
    if method is None:
        return params, None
    method, options = PAPER.get(method, (method, {}))
    start = time.perf_counter()
    try:
        q = precision.calibrate(
            f, params, batches, method=method, format=fmt, scaling=scaling, **options
        )
    except precision.CalibrationError as err:
        return None, f"n/a ({str(err).splitlines()[0]})"
    except Exception as err:  # not a refusal: shown as a failure, and the other rows go on
        return None, f"ERROR ({type(err).__name__}: {(str(err) or '-').splitlines()[0]})"
    jax.block_until_ready(q)
    return q, time.perf_counter() - start


def qwix_int4(cfg: Config, params, batches, xy, method: str, block: int):
    """Qwix's int4 weights on the same model: (bits per window, seconds) or (None, why).

    The same Dense kernels as `calibrate` selects (every `nn.Dense`; the attention
    `einsum`s read no weight), int4 in tiles of `block` inputs (`tile_size`; the whole
    input axis where it is narrower, as `PerBlock` does), absmax scales. "qwix-gptq"
    records the Hessians with `GptqCalibrationProvider` (one jitted `apply` per batch, as
    Qwix's tests drive it) and converts with `qwix.contrib.gptq.quantize_params` (GPTQ
    block 128, damping 0.01, as ours); "qwix-rtn" is `qwix.quantize_params` alone. The
    converted tree runs through Qwix's own `PtqProvider` model. The seconds count what
    ours do: from the float32 parameters to the converted ones, tracing and compilation
    included. What differs from ours: Qwix's int4 scale is `absmax / 7.5` with codes -8..7
    (ours `absmax / 7`, codes -7..7), and its GPTQ runs in float32 JAX, eagerly, column by
    column (ours in float64 numpy).
    """
    try:
        import qwix
        from qwix.contrib import gptq
    except ImportError as err:
        return None, f"skipped (qwix is not installed: pip install -e '.[peers]'; {err})"
    model = model_of(cfg)
    start = time.perf_counter()
    try:
        params = jax.tree.map(jnp.asarray, params)  # Qwix takes jax arrays, not numpy's
        tiles: dict[int, list[str]] = {}
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            names = [str(getattr(k, "key", k)) for k in path]
            if names[-1] == "kernel" and leaf.ndim == 2:
                tiles.setdefault(min(block, leaf.shape[0]), []).append("/".join(names[1:-1]))
        rule = gptq.GptqRule if method == "qwix-gptq" else qwix.QuantizationRule
        rules = [
            rule(module_path="|".join(paths), weight_qtype=jnp.int4, tile_size=tile)
            for tile, paths in tiles.items()
        ]
        ptq = qwix.quantize_model(model, qwix.PtqProvider(rules))
        abstract = jax.eval_shape(ptq.init, jax.random.key(0), batches[0])["params"]
        if method == "qwix-gptq":
            recorder = qwix.quantize_model(model, gptq.GptqCalibrationProvider(rules))
            record = jax.jit(lambda v, x: recorder.apply(v, x, mutable="quant_stats")[1])
            variables = dict(params)
            for batch in batches:
                variables.update(record(variables, batch))
            q = gptq.quantize_params(
                params["params"],
                abstract,
                variables["quant_stats"],
                gptq_block_size=128,
                gptq_damping_factor=0.01,
            )
        else:
            q = qwix.quantize_params(params["params"], abstract)
        jax.block_until_ready(q)
    except Exception as err:  # a peer's failure is a row's note, not the benchmark's end
        return None, f"ERROR ({type(err).__name__}: {(str(err) or '-').splitlines()[0]})"
    took = time.perf_counter() - start
    return evaluate(ptq.apply, {"params": q}, xy), took


def evaluate(run, params, xy, chunk=32) -> np.ndarray:
    """Bits per byte of each window, the model run as `run(params, tokens)`."""
    per_window = jax.jit(lambda p, x, y: nats(precision.to_full_precision(run(p, x)), y))
    parts = [
        per_window(params, xy[i : i + chunk, :-1], xy[i : i + chunk, 1:])
        for i in range(0, len(xy), chunk)
    ]
    return np.concatenate([np.asarray(p) for p in parts]) / math.log(2)


def text_rows(cfg: Config, args) -> dict[str, tuple]:
    data = stdlib_bytes()
    cut = int(0.9 * len(data))
    train_data, held = data[:cut], data[cut:]
    print(f"text: {len(data):,} bytes of stdlib .py; train {cut:,}, held out {len(held):,}")
    params, f = trained(cfg, train_data, args.retrain), model_of(cfg).apply
    starts = np.linspace(0, len(held) - cfg.context - 1, args.eval_windows).astype(int)
    xy = windows(held, starts, cfg.context + 1)
    rng = np.random.default_rng(cfg.seed + 1)
    batches = [
        windows(train_data, rng.integers(0, cut - cfg.context, 8), cfg.context)
        for _ in range(args.calib_batches)
    ]
    print(
        f"\n{len(xy)} held-out windows of {cfg.context} bytes; {len(batches)} calibration "
        "batches of 8 training windows; loss = bit/B over float32, paired over the windows"
    )
    print(f"{'row':<22} {'bit/B':>8} {'loss':>8} {'2 se':>7} {'calib s':>8}")
    results: dict[str, tuple] = {}
    for row, method, fmt, scaling, contract in ROWS:
        if method is not None and method.startswith("qwix-"):
            assert isinstance(scaling, dtypes.PerBlock)
            results[row] = qwix_int4(cfg, params, batches, xy, method, scaling.size)
        else:
            q, took = convert(f, params, batches, method, fmt, scaling)
            run = precision.apply(f, contract=contract)
            results[row] = (None if q is None else evaluate(run, q, xy), took)
        print_row(row, *results[row], results["float32"][0])
    print(
        f"the same model with {OUTLIER_CHANNELS} outlier channels x{OUTLIER_FACTOR:g} after "
        "each LayerNorm (an exact reparametrisation; loss against float32 + outliers):"
    )
    loud = with_outliers(params, cfg)
    for row, method, fmt, scaling, contract in OUTLIER_ROWS:
        q, took = convert(f, loud, batches, method, fmt, scaling)
        run = precision.apply(f, contract=contract)
        results[row] = (None if q is None else evaluate(run, q, xy), took)
        print_row(row, *results[row], results["float32 + outliers"][0])
    return results


def mean_2se(x: np.ndarray) -> tuple[float, float]:
    return float(x.mean()), float(2 * x.std(ddof=1) / math.sqrt(len(x)))


def print_row(row, bits, took, base, width: int = 22) -> None:
    if bits is None:
        print(f"{row:<{width}} {took}", flush=True)
        return
    loss, se = mean_2se(bits - base)
    secs = "-" if took is None else f"{took:.1f}"
    print(f"{row:<{width}} {bits.mean():>8.4f} {loss:>+8.4f} {se:>7.4f} {secs:>8}", flush=True)


def half_check(results, row, base_row, reference="float32") -> str:
    """Does `row` lose at most half of what `base_row` loses? Paired over the windows."""
    f32, bits, base = results[reference][0], results[row][0], results[base_row][0]
    if bits is None or base is None:
        return f"n.a. ({row if bits is None else base_row} did not run)"
    base_loss, base_se = mean_2se(base - f32)
    if base_loss <= base_se:
        return f"n.a. ({base_row} loses {base_loss:+.4f} ± {base_se:.4f} bit/B: within noise)"
    loss = float((bits - f32).mean())
    margin, se = mean_2se((bits - f32) - 0.5 * (base - f32))
    verdict = "PASS" if margin <= 0 else "FAIL"
    noise = "; within noise" if abs(margin) <= se else ""
    return (
        f"{verdict} ({loss:+.4f} vs {base_loss:+.4f} bit/B, ratio {loss / base_loss:.2f}; "
        f"loss - half of it {margin:+.4f} ± {se:.4f}{noise})"
    )


def side_by_side(results, ours: str, theirs: str) -> str:
    """Our row's bits per byte minus Qwix's, paired over the windows, and both times."""
    (a, a_s), (b, b_s) = results[ours], results[f"Qwix {theirs} int4 g128"]
    if a is None or b is None:
        return "n.a. (a row did not run)"
    diff, se = mean_2se(a - b)
    return f"{diff:+.4f} ± {se:.4f} bit/B; calibration {a_s:.1f} s vs {b_s:.1f} s"


def print_checks(results, cfg: Config) -> None:
    print("\ntargets:")
    for row in ("GPTQ int4 g128", "AWQ int4 g128", "AWQ+GPTQ int4 g128"):
        print(f"  {row} loses <= half of RTN int4: {half_check(results, row, 'RTN int4 g128')}")
    qwix_rtn = half_check(results, "Qwix GPTQ int4 g128", "Qwix RTN int4 g128")
    print(f"  Qwix GPTQ int4 g128 loses <= half of Qwix RTN int4: {qwix_rtn}")
    for ours, theirs in (
        ("RTN int4 g128", "RTN"),
        ("GPTQ int4 g128", "GPTQ"),
        ("GPTQ int4 g128 (paper)", "GPTQ"),
    ):
        print(f"  {ours} - Qwix {theirs}: {side_by_side(results, ours, theirs)}")
    sq = half_check(results, "W8A8 SmoothQuant", "W8A8 RTN")
    print(f"  W8A8 SmoothQuant loses <= half of W8A8 RTN: {sq}")
    sq = half_check(results, "W8A8 SQ + outliers", "W8A8 RTN + outliers", "float32 + outliers")
    print(f"  with outlier channels, the same: {sq}")
    same = np.array_equal(results["float32"][0], results["float32 + outliers"][0])
    print(f"  float32 with outliers computes the same bits per byte: {same}")
    for row in ("GPTQ int4 g128", "AWQ int4 g128", "AWQ+GPTQ int4 g128", "W8A8 SmoothQuant"):
        took = results[row][1]
        if results[row][0] is None:
            verdict = "n.a. (did not run)"
        elif cfg.layers != 6:
            verdict = f"n.a. ({cfg.layers}-layer model: {took:.1f} s)"
        else:
            verdict = f"{'PASS' if took <= 120 else 'FAIL'} ({took:.1f} s)"
        print(f"  {row}: calibration of the 6-layer model <= 2 minutes: {verdict}")


class ResBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        c = x.shape[-1]
        h = nn.relu(nn.Conv(c, (3, 3))(nn.LayerNorm()(x)))
        return x + nn.Conv(c, (3, 3))(h)


class DigitsNet(nn.Module):
    """A small ResNet: a 3 x 3 stem, two residual blocks, 2 x 2 pooling, a 1 x 1 widening,
    two more blocks, global average pooling and a Dense head."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(32, (3, 3))(x))
        x = ResBlock()(ResBlock()(x))
        x = nn.avg_pool(x, (2, 2), (2, 2))
        x = ResBlock()(ResBlock()(nn.Conv(64, (1, 1))(x)))
        return nn.Dense(10)(jnp.mean(x, axis=(1, 2)))


def train_digits(x, y, epochs: int):
    model, rng = DigitsNet(), np.random.default_rng(0)
    params = model.init(jax.random.key(0), x[:1])
    steps = epochs * (len(x) // 64)
    tx = optax.adamw(optax.cosine_decay_schedule(3e-3, steps), weight_decay=1e-4)

    @jax.jit
    def step(params, state, xb, yb):
        grads = jax.grad(lambda p: jnp.mean(nats(model.apply(p, xb)[:, None], yb[:, None])))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state = tx.init(params)
    for _ in range(steps):
        idx = rng.choice(len(x), 64, replace=False)
        params, state = step(params, state, x[idx], y[idx])
    return model.apply, jax.block_until_ready(params), steps


def digits(epochs: int, block: int) -> None:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    order = np.random.default_rng(0).permutation(len(x))
    tr, te = order[: int(0.8 * len(x))], order[int(0.8 * len(x)) :]
    start = time.perf_counter()
    f, params, steps = train_digits(x[tr], y[tr], epochs)
    took = time.perf_counter() - start
    print(f"\ndigits: {len(tr)} train / {len(te)} held-out images, {steps} steps in {took:.0f} s")
    print(f"{'row':<22} {'accuracy':>8} {'nats':>8} {'calib s':>8}")
    batches = [x[tr[i : i + 64]] for i in range(0, 16 * 64, 64)]
    for row, method in (("float32", None), ("RTN int4", "rtn"), ("GPTQ int4", "gptq")):
        row += "" if method is None else f" g{block}"
        q, took = convert(f, params, batches, method, "int4", dtypes.PerBlock(block))
        if q is None:
            print(f"{row:<22} {took}")
            continue
        logits = np.asarray(precision.to_full_precision(precision.apply(f)(q, x[te])))
        acc = float(np.mean(logits.argmax(-1) == y[te]))
        ce = float(np.mean(nats(logits[:, None], y[te][:, None])))
        print(f"{row:<22} {acc:>8.4f} {ce:>8.4f} {'-' if took is None else f'{took:.1f}':>8}")


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 layers, d 64, 20 s of training")
    parser.add_argument("--retrain", action="store_true", help="ignore the cached weights")
    parser.add_argument("--train-minutes", type=float, default=15.0)
    parser.add_argument("--train-steps", type=int, default=None, help=STEPS_HELP)
    parser.add_argument("--eval-windows", type=int, default=None, help="default 256 (quick: 32)")
    parser.add_argument("--calib-batches", type=int, default=16, help="of 8 windows each")
    parser.add_argument("--skip-digits", action="store_true")
    parser.add_argument("--digits-epochs", type=int, help="default 12 (quick: 4)")
    parser.add_argument("--digits-block", type=int, default=32, help="int4 block (inputs)")
    args = parser.parse_args(argv)
    if not 0 < args.train_minutes <= 15:
        parser.error("--train-minutes must be within (0, 15]")
    if args.train_steps is not None and args.train_steps < 1:
        parser.error("--train-steps must be at least 1")
    if args.quick:
        cfg = Config(layers=2, width=64, heads=4, context=64, batch=16, lr=3e-3, minutes=1 / 3,
                     steps=args.train_steps)  # fmt: skip
        args.eval_windows = args.eval_windows or 32
        args.calib_batches = min(args.calib_batches, 4)
    else:
        cfg = Config(minutes=args.train_minutes, steps=args.train_steps)
        args.eval_windows = args.eval_windows or 256
    start = time.perf_counter()
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"python {platform.python_version()}, jax {jax.__version__} ({jax.default_backend()}), "
        f"precision {precision.__version__}, flax {version('flax')}, qwix {version('qwix')}; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"model: {cfg}")
    results = text_rows(cfg, args)
    print_checks(results, cfg)
    if not args.skip_digits:
        digits(args.digits_epochs or (4 if args.quick else 12), args.digits_block)
    took = time.perf_counter() - start
    print(f"\nload at end: {os.getloadavg()[0]:.1f}; {took:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
