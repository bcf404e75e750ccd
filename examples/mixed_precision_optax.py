"""Mixed-precision training with an Optax optimizer: float32 masters, reduced compute.

A small MLP on scikit-learn's handwritten digits. Each step casts the float32
master parameters to the policy's compute format (precision Tensors), runs the
model through `precision.apply`, computes the loss in float32, and updates the
masters with Adam. With a float16 policy a dynamic loss scale keeps small
gradients from flushing to zero and skips the steps whose gradients overflow.

    python examples/mixed_precision_optax.py                      # bfloat16 compute
    python examples/mixed_precision_optax.py --policy mixed_float16
    python examples/mixed_precision_optax.py --steps 20           # quicker
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import dtypes
import precision


def mlp(params, x):
    """A plain JAX model: 64 -> 128 -> 10."""
    h = jax.nn.relu(x @ params["hidden"]["w"] + params["hidden"]["b"].reshape(1, -1))
    return h @ params["out"]["w"] + params["out"]["b"].reshape(1, -1)


def init(key):
    k1, k2 = jax.random.split(key)
    return {
        "hidden": {"w": jax.random.normal(k1, (64, 128)) * 0.18, "b": jnp.zeros(128)},
        "out": {"w": jax.random.normal(k2, (128, 10)) * 0.09, "b": jnp.zeros(10)},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--policy", default="mixed_bfloat16", help="e.g. mixed_float16, p=f32,c=tf32"
    )
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)

    policy = precision.Policy.parse(args.policy)
    loss_scale = (
        precision.DynamicLossScale(jnp.float32(2.0**15), period=100)
        if policy.compute == dtypes.float16
        else precision.NoOpLossScale()
    )
    digits = load_digits()
    x = jnp.asarray(digits.data / 16.0, jnp.float32)
    y = jnp.asarray(digits.target)
    x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]

    model = precision.apply(mlp)

    def forward(params, xb):
        logits = model(policy.cast_to_compute(params), policy.cast_to_compute(xb))
        return policy.cast_to_output(logits)  # float32 logits for the loss

    def loss_fn(params, xb, yb, ls):
        logp = jax.nn.log_softmax(forward(params, xb))
        loss = -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))
        return ls.scale(loss), loss

    opt = optax.adam(3e-3)

    @jax.jit
    def step(params, opt_state, ls, xb, yb):
        grads, loss = jax.grad(loss_fn, has_aux=True)(params, xb, yb, ls)
        grads = ls.unscale(grads)
        finite = precision.all_finite(grads)
        updates, new_state = opt.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        # Skip the step (keep params and optimizer state) if the gradients overflowed.
        params = precision.select_tree(finite, new_params, params)
        opt_state = precision.select_tree(finite, new_state, opt_state)
        return params, opt_state, ls.adjust(finite), loss

    params = init(jax.random.key(0))
    opt_state = opt.init(params)
    rng = np.random.default_rng(0)
    for i in range(args.steps):
        idx = rng.integers(0, len(x_train), 128)
        params, opt_state, loss_scale, loss = step(
            params, opt_state, loss_scale, x_train[idx], y_train[idx]
        )
        if i % max(1, args.steps // 5) == 0 or i == args.steps - 1:
            print(
                f"step {i:4d}  loss {float(loss):.4f}  loss scale {float(loss_scale.loss_scale):g}"
            )
    predict = jax.jit(lambda p, xb: jnp.argmax(forward(p, xb), axis=-1))
    accuracy = float(jnp.mean(predict(params, x_test) == y_test))
    print(f"policy {policy}: test accuracy {100 * accuracy:.2f}%")


if __name__ == "__main__":
    main()
