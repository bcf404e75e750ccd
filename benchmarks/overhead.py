"""What `precision.apply` costs over hand-written JAX.

Usage:
    python benchmarks/overhead.py            # full run (a minute or two on a laptop CPU)
    python benchmarks/overhead.py --quick    # fewer repeats, smaller MLP

Three measurements, printed as one table with the machine it ran on:

1. Eager dispatch: `Tensor + Tensor` (bfloat16 storage, 1000 elements) against
   `jnp.add` on float32 arrays of the same size. Both are one cached compiled
   call; the difference is the Python around it. Target: at most 1.3x.
2. A jitted bf16 MLP training step (784-1024-1024-10, batch 256, SGD, float32
   master weights converted inside the loss) written with Tensors through
   `apply`, against the hand-written raw-JAX step computing the same values:
   `lax.reduce_precision` onto the bfloat16 grid after every operation, with
   the same matmuls `apply` uses. Twice: with float32 matmuls (the CPU default)
   and with bfloat16 matmuls accumulating in float32 (GPUs, and CPUs with
   `PRECISION_CPU_BF16_DOTS=1`). Target: at most 1.05x.
3. First-call time (trace + compile) of both float32-dot steps.

Timings are medians of interleaved repeats (the two sides alternate, so
machine load hits both alike), with `block_until_ready` on every result.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import precision
from precision import Tensor
from precision._compute import _contractions


def _time(fn: Callable[[], Any], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / number


def interleaved(a: Callable[[], Any], b: Callable[[], Any], number: int, rounds: int):
    """Median seconds per call of `a` and of `b`, measured alternately."""
    jax.block_until_ready(a())
    jax.block_until_ready(b())
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(_time(a, number))
        tb.append(_time(b, number))
    return statistics.median(ta), statistics.median(tb)


# -- 1. eager dispatch ----------------------------------------------------------------
def eager_add(rounds: int) -> tuple[float, float]:
    x = jnp.asarray(np.random.default_rng(0).random(1000, np.float32))
    y = x * 2
    a = Tensor(x).to_reduced_precision()
    b = Tensor(y).to_reduced_precision()
    return interleaved(lambda: a + b, lambda: jnp.add(x, y), number=500, rounds=rounds)


# -- 2. MLP training step ----------------------------------------------------------------
def _rp(x):
    return lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)


def _init(sizes):
    key = jax.random.key(0)
    params = []
    for i in range(len(sizes) - 1):
        k = jax.random.fold_in(key, i)
        w = jax.random.normal(k, (sizes[i], sizes[i + 1])) * np.sqrt(2 / sizes[i])
        params.append((w, jnp.zeros(sizes[i + 1])))
    return params


def _mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b[None, :])
    w, b = params[-1]
    return jax.nn.log_softmax(x @ w + b[None, :])


def _nll(logits, labels):
    return -jnp.mean(jnp.take_along_axis(logits, labels[:, None], axis=1))


def loss_apply(params, x, labels):
    p = jax.tree.map(lambda a: Tensor(a).to_reduced_precision("bfloat16"), params)
    logits = precision.apply(_mlp)(p, Tensor(x).to_reduced_precision("bfloat16"))
    return _nll(precision.to_full_precision(logits), labels)


def _log_softmax_rounded(z):
    # log_softmax as jax.nn writes it, every intermediate rounded like apply does
    m = lax.stop_gradient(jnp.max(z, axis=1, keepdims=True))
    shifted = _rp(z - m)
    s = _rp(jnp.sum(_rp(jnp.exp(shifted)), axis=1, keepdims=True))
    return _rp(shifted - _rp(jnp.log(s)))


def _dot_f32(x, w):
    return x @ w


def _dot_bf16(x, w):
    return lax.dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=x.dtype)


def _loss_raw(dot):
    def loss(params, x, labels):
        x = _rp(x)
        for w, b in params[:-1]:
            x = jnp.maximum(_rp(_rp(dot(x, _rp(w))) + _rp(b)[None, :]), 0)
        w, b = params[-1]
        return _nll(_log_softmax_rounded(_rp(_rp(dot(x, _rp(w))) + _rp(b)[None, :])), labels)

    return loss


def _step(loss):
    @jax.jit
    def step(params, x, labels):
        value, grads = jax.value_and_grad(loss)(params, x, labels)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value

    return step


def _set_cpu_bf16_dots(on: bool) -> None:
    """Switch `apply`'s opt-in native bfloat16 dots on CPU (read once per process)."""
    os.environ["PRECISION_CPU_BF16_DOTS"] = "1" if on else "0"
    _contractions._cpu_native_formats.cache_clear()


def mlp_steps(sizes, batch, rounds, bf16_dots: bool):
    """Times of the apply step and of the raw step doing the same dots."""
    _set_cpu_bf16_dots(bf16_dots)
    params = _init(sizes)
    x = jax.random.normal(jax.random.key(1), (batch, sizes[0]))
    labels = jax.random.randint(jax.random.key(2), (batch,), 0, sizes[-1])
    step_apply = _step(loss_apply)
    step_raw = _step(_loss_raw(_dot_bf16 if bf16_dots else _dot_f32))
    t0 = time.perf_counter()
    jax.block_until_ready(step_apply(params, x, labels))
    compile_apply = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(step_raw(params, x, labels))
    compile_raw = time.perf_counter() - t0
    # the two steps compute (nearly) the same values
    va, vr = step_apply(params, x, labels)[1], step_raw(params, x, labels)[1]
    t_apply, t_raw = interleaved(
        lambda: step_apply(params, x, labels),
        lambda: step_raw(params, x, labels),
        number=3,
        rounds=rounds,
    )
    return t_apply, t_raw, compile_apply, compile_raw, float(va), float(vr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small MLP, few repeats")
    args = parser.parse_args()
    rounds = 5 if args.quick else 15
    sizes = [784, 256, 256, 10] if args.quick else [784, 1024, 1024, 10]
    batch = 64 if args.quick else 256

    t_tensor, t_jnp = eager_add(rounds)
    f32 = mlp_steps(sizes, batch, rounds, bf16_dots=False)
    bf16 = mlp_steps(sizes, batch, rounds, bf16_dots=True)

    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"jax {jax.__version__} on {jax.default_backend()} ({jax.devices()[0].device_kind})"
    )
    print(f"machine: {machine}")
    print(f"MLP {'-'.join(map(str, sizes))}, batch {batch}")
    print(f"losses (float32 dots) {f32[4]:.5f} (apply) vs {f32[5]:.5f} (raw JAX)")
    print(f"losses (bf16 dots)    {bf16[4]:.5f} (apply) vs {bf16[5]:.5f} (raw JAX)")
    rows = [
        ("eager Tensor+Tensor vs jnp.add (1000 el.)", t_tensor, t_jnp, "<= 1.3"),
        ("jitted bf16 MLP step, float32 dots (default)", f32[0], f32[1], "<= 1.05"),
        ("jitted bf16 MLP step, bf16 dots (opt-in)", bf16[0], bf16[1], "<= 1.05"),
        ("first call (trace+compile), float32 dots", f32[2], f32[3], "-"),
    ]
    print(f"| {'measurement':44} | {'precision':>11} | {'raw JAX':>11} | ratio | target |")
    print(f"|{'-' * 46}|{'-' * 13}|{'-' * 13}|-------|--------|")
    for name, ours, theirs, target in rows:
        print(
            f"| {name:44} | {_fmt(ours):>11} | {_fmt(theirs):>11} | "
            f"{ours / theirs:5.2f} | {target:>6} |"
        )


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


if __name__ == "__main__":
    main()
