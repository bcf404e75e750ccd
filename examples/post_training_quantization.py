"""Post-training quantization: train in float32, convert to int8 and int4, compare.

Trains a small MLP on scikit-learn's handwritten digits in float32 (a few
seconds), then converts its kernels to int8 and int4 with one scale per output
channel, leaving the biases in float32, and evaluates every version on the
held-out images. The stored kernels really are 8 or 4 bits a weight plus one
float32 scale per output channel (the byte column); for inference they are
decoded back to float32 values, which sit exactly on the integer grid.

    python examples/post_training_quantization.py
    python examples/post_training_quantization.py --steps 100    # quicker
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_digits

import dtypes
import precision


def mlp(params, x):
    h = jax.nn.relu(x @ params["hidden"]["kernel"] + params["hidden"]["bias"].reshape(1, -1))
    return h @ params["out"]["kernel"] + params["out"]["bias"].reshape(1, -1)


def train(x, y, steps: int) -> dict:
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {
        "hidden": {"kernel": jax.random.normal(k1, (64, 256)) * 0.18, "bias": jnp.zeros(256)},
        "out": {"kernel": jax.random.normal(k2, (256, 10)) * 0.06, "bias": jnp.zeros(10)},
    }

    def loss_fn(p, xb, yb):
        logp = jax.nn.log_softmax(mlp(p, xb))
        return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))

    @jax.jit
    def step(p, xb, yb):
        grads = jax.grad(loss_fn)(p, xb, yb)
        return jax.tree_util.tree_map(lambda w, g: w - 0.1 * g, p, grads)

    rng = np.random.default_rng(0)
    for _ in range(steps):
        idx = rng.integers(0, len(x), 64)
        params = step(params, x[idx], y[idx])
    return params


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="float32 training steps")
    args = parser.parse_args(argv)

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.data))
    x = jnp.asarray(digits.data[order] / 16.0, jnp.float32)
    y = jnp.asarray(digits.target[order])
    split = int(0.8 * len(x))
    params = train(x[:split], y[:split], args.steps)

    def kernels_to(fmt):
        # Kernels only, one scale per output channel (the last axis).
        return precision.to_reduced_precision(
            params, fmt, scaling=dtypes.PerAxis(-1), where="kernel"
        )

    def accuracy(p) -> float:
        # The biases stay float32 arrays; decode the kernels to full precision at use.
        logits = mlp(precision.to_full_precision(p), x[split:])
        return float(jnp.mean(jnp.argmax(logits, axis=-1) == y[split:]))

    base = accuracy(params)
    print(f"{'model':<10} {'test accuracy':>14} {'change':>8} {'param bytes':>12}")
    print(f"{'float32':<10} {100 * base:>13.2f}% {'':>8} {precision.tree_nbytes(params):>12,}")
    for fmt in ("int8", "int4"):
        q = kernels_to(fmt)
        acc = accuracy(q)
        print(
            f"{fmt:<10} {100 * acc:>13.2f}% {100 * (acc - base):>+7.2f} "
            f"{precision.tree_nbytes(q):>12,}"
        )


if __name__ == "__main__":
    main()
