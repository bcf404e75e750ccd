"""Real models under `precision.apply`: step time, XLA temporaries and peak memory.

Usage:
    python benchmarks/models.py                 # GPT-2-small-like and ResNet-18, full size
    python benchmarks/models.py --quick         # small versions (a couple of minutes)
    python benchmarks/models.py --model gpt2    # one model

Models (Flax linen, random weights): a GPT-2-small-like decoder (12 layers,
d 768, 12 heads, T 256, vocabulary 50257, causal mask, LayerNorm, tied
embedding) and a ResNet-18 (BatchNorm in eval mode, 32 x 32 inputs, batch 8).
Each row runs in a fresh subprocess (so peak RSS is its own):

- `fp32`: plain JAX on float32 weights (the baseline of the weight-only rows);
- `bf16-cast`: plain JAX with weights and input cast to bfloat16 once,
  outside the timed call (a bfloat16 model: the baseline of `bf16`);
- `bf16-policy`: plain JAX given float32 weights, cast to bfloat16 inside the
  call as a mixed-precision policy does (the baseline of the other
  bf16-compute rows: they too are given float32 weights or storage);
- `apply-bf16`: `precision.apply(model.apply, compute="bfloat16")` on float32
  weights;
- `bf16`: the same on bfloat16 Tensors of every float parameter;
- `int8`, `int4`, `fp8` (weight-only: int8 per output channel, int4 per
  block of 32, float8_e4m3fn per tensor; norms, biases and embeddings kept
  float32) with float32 compute, and the same with `compute="bfloat16"`.

Forward rows time the jitted forward pass; `qat` rows time a jitted gradient
step with the conversion inside the loss (quantization-aware training). Each
row's process also builds its baseline (`fp32`, or `bf16-policy` / `bf16-cast`
for bfloat16 compute) and calls the two in turn, so the ratio is taken under one load; the
peak RSS is read before the baseline exists.
Targets on CPU: weight-only forward <= 1.15x fp32, bf16-compute forward
<= 1.1x the plain bf16 model given the same weights; int4 memory <= storage
+ 2 decoded layers + activations.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

ROWS = [
    ("fp32", None, None),
    ("bf16-cast", None, None),
    ("bf16-policy", None, None),
    ("apply-bf16", None, "bfloat16"),
    ("bf16", "bfloat16", "bfloat16"),
    ("int8", "int8", None),
    ("int4", "int4", None),
    ("fp8", "float8_e4m3fn", None),
    ("int8/bf16", "int8", "bfloat16"),
    ("int4/bf16", "int4", "bfloat16"),
    ("fp8/bf16", "float8_e4m3fn", "bfloat16"),
]


def _models(quick: bool):
    import flax.linen as nn
    import jax.numpy as jnp

    class Block(nn.Module):
        heads: int

        @nn.compact
        def __call__(self, x, mask):
            h = nn.LayerNorm()(x)
            h = nn.MultiHeadDotProductAttention(self.heads)(h, h, mask=mask)
            x = x + h
            h = nn.LayerNorm()(x)
            h = nn.Dense(4 * x.shape[-1])(h)
            return x + nn.Dense(x.shape[-1])(nn.gelu(h))

    class GPT(nn.Module):
        vocab: int
        width: int
        depth: int
        heads: int
        length: int

        @nn.compact
        def __call__(self, tokens):
            embed = nn.Embed(self.vocab, self.width)
            pos = self.param("pos", nn.initializers.normal(0.02), (self.length, self.width))
            x = embed(tokens) + pos[None, : tokens.shape[1]]
            mask = nn.make_causal_mask(tokens)
            for _ in range(self.depth):
                x = Block(self.heads)(x, mask)
            return embed.attend(nn.LayerNorm()(x))

    class Residual(nn.Module):
        channels: int
        stride: int

        @nn.compact
        def __call__(self, x):
            y = nn.Conv(self.channels, (3, 3), self.stride, use_bias=False)(x)
            y = nn.relu(nn.BatchNorm(use_running_average=True)(y))
            y = nn.Conv(self.channels, (3, 3), use_bias=False)(y)
            y = nn.BatchNorm(use_running_average=True)(y)
            if x.shape != y.shape:
                x = nn.Conv(self.channels, (1, 1), self.stride, use_bias=False)(x)
                x = nn.BatchNorm(use_running_average=True)(x)
            return nn.relu(x + y)

    class ResNet(nn.Module):
        stages: tuple[int, ...]

        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(64, (3, 3))(x)))
            for i, width in enumerate(self.stages):
                x = Residual(width, 1 if i == 0 else 2)(x)
                x = Residual(width, 1)(x)
            return nn.Dense(10)(jnp.mean(x, axis=(1, 2)))

    if quick:
        gpt = GPT(vocab=4096, width=256, depth=4, heads=4, length=128)
        resnet = ResNet(stages=(64, 128))
        return {"gpt2": (gpt, (1, 128), "tokens"), "resnet": (resnet, (8, 32, 32, 3), "image")}
    gpt = GPT(vocab=50257, width=768, depth=12, heads=12, length=256)
    resnet = ResNet(stages=(64, 128, 256, 512))
    return {"gpt2": (gpt, (1, 256), "tokens"), "resnet": (resnet, (8, 32, 32, 3), "image")}


def _alternating(fn, ref, repeats: int) -> tuple[float, float]:
    """Median seconds of `fn` and of `ref`, called in turn (each warmed up first)."""
    import jax

    jax.block_until_ready(fn())
    jax.block_until_ready(ref())
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for f, out in ((fn, times[0]), (ref, times[1])):
            start = time.perf_counter()
            jax.block_until_ready(f())
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def run_one(model_name: str, row: str, quick: bool, mode: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import dtypes
    import precision

    model, shape, kind = _models(quick)[model_name]
    key = jax.random.key(0)
    if kind == "tokens":
        x = jax.random.randint(key, shape, 0, model.vocab)
    else:
        x = jax.random.normal(key, shape)
    variables = jax.jit(model.init)(jax.random.key(1), x)
    _, fmt, compute = next(r for r in ROWS if r[0] == row)
    scalings = {
        "int8": dtypes.PerAxis(-1),
        "int4": dtypes.PerBlock(32),
        "float8_e4m3fn": dtypes.PerTensor(),
    }
    bf16 = jnp.bfloat16

    def kernels(path, leaf):
        name = jax.tree_util.keystr(path)
        return leaf.ndim > 1 and "embedding" not in name and "pos" not in name

    def convert(params):
        if fmt == "bfloat16":  # every float leaf, as the bf16-cast model has it
            return precision.to_reduced_precision(params, fmt)
        return precision.to_reduced_precision(params, fmt, scaling=scalings[fmt], where=kernels)

    def cast(tree):
        return jax.tree_util.tree_map(
            lambda a: a.astype(bf16) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree
        )

    def loss_of(out):
        return jnp.mean(precision.to_full_precision(out).astype(jnp.float32) ** 2)

    def build(row: str, fmt: str | None, compute: str | None):
        """(forward, its arguments, the timed function, its arguments) of one row."""
        if row == "fp32":
            forward, args = jax.jit(model.apply), (variables, x)

            def step(v, x):
                return jax.grad(lambda v: loss_of(model.apply(v, x)))(v)
        elif row == "bf16-cast":  # weights cast once, outside: a bfloat16 model
            forward, args = jax.jit(model.apply), (cast(variables), cast(x))

            def step(v, x):
                return jax.grad(lambda v: loss_of(model.apply(v, x)))(v)
        elif row == "bf16-policy":  # float32 weights cast in every call (a jmp-style policy)
            forward, args = jax.jit(lambda v, x: model.apply(cast(v), cast(x))), (variables, x)

            def step(v, x):
                return jax.grad(lambda v: loss_of(model.apply(cast(v), cast(x))))(v)
        elif fmt is None:
            run = precision.apply(model.apply, compute=compute)
            forward, args = jax.jit(run), (variables, x)

            def step(v, x):
                return jax.grad(lambda v: loss_of(run(v, x)))(v)
        else:
            run = precision.apply(model.apply, compute=compute)
            forward, args = jax.jit(run), (convert(variables), x)

            def step(v, x):
                return jax.grad(lambda v: loss_of(run(convert(v), x)))(v)

        if mode == "qat":
            qat_args = (variables if row != "bf16-cast" else args[0]), args[1]
            return forward, args, jax.jit(step), qat_args
        return forward, args, forward, args

    forward, args, fn, fn_args = build(row, fmt, compute)
    compiled = fn.lower(*fn_args).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    jax.block_until_ready(fn(*fn_args))
    stored = precision.tree_nbytes(args[0])
    out = np.asarray(precision.to_full_precision(forward(*args)), np.float32)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # before the baseline exists
    # The baseline runs in this process too, its calls alternating with the row's, so
    # that a machine whose load changes moves both alike and the ratio stays honest.
    # bfloat16 compute is compared with plain JAX given the same weights: float32
    # weights cast in the call (`apply-bf16`), bfloat16 ones (`bf16`), storage
    # decoded in the call (int8/int4/fp8 with bfloat16 compute) against the cast policy.
    ref = "fp32"
    if compute == "bfloat16" and mode == "forward":
        ref = "bf16-cast" if fmt == "bfloat16" else "bf16-policy"
    _, _, ref_fn, ref_args = build(ref, None, None)
    seconds, ref_seconds = _alternating(
        lambda: fn(*fn_args), lambda: ref_fn(*ref_args), 5 if quick else 7
    )
    return {
        "model": model_name,
        "row": row,
        "mode": mode,
        "seconds": seconds,
        "ref": ref,
        "ref_seconds": ref_seconds,
        "temp_bytes": temp,
        "param_bytes": stored,
        "peak_rss": rss,
        "finite": bool(np.all(np.isfinite(out))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", choices=["gpt2", "resnet", "all"], default="all")
    parser.add_argument("--modes", default="forward,qat")
    parser.add_argument("--rows", help="only these rows, comma-separated (apply-bf16,int8/bf16)")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "ROW", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(*args.one[:2], args.quick, args.one[2])))
        return 0
    models = ["gpt2", "resnet"] if args.model == "all" else [args.model]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(
        f"{'model':<7} {'mode':<8} {'row':<11} {'ms':>9} {'ratio':>7} {'vs':<9} "
        f"{'temp MiB':>9} {'params MiB':>11} {'RSS MiB':>8} finite"
    )
    for model in models:
        for mode in args.modes.split(","):
            if mode == "qat":
                rows = [r for r in ROWS if r[1] is not None or r[0] == "fp32"]
            else:
                rows = ROWS
            if args.rows:
                rows = [r for r in rows if r[0] in args.rows.split(",")]
            for row, _fmt, _compute in rows:
                cmd = [sys.executable, __file__, "--one", model, row, mode]
                if args.quick:
                    cmd.append("--quick")
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if proc.returncode:
                    print(f"{model:<7} {mode:<8} {row:<11} failed: {proc.stderr.strip()[-300:]}")
                    continue
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                ratio = r["seconds"] / r["ref_seconds"]
                print(
                    f"{model:<7} {mode:<8} {row:<11} {1e3 * r['seconds']:>9.1f} {ratio:>7.2f} "
                    f"{r['ref']:<9} {r['temp_bytes'] / 2**20:>9.1f} "
                    f"{r['param_bytes'] / 2**20:>11.1f} "
                    f"{r['peak_rss'] / 2**20:>8.0f} {r['finite']}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
