"""Our W8A8 training step under Qwix's rule against itself and against Qwix's, alone.

`peers.py` times every row in each round, and one run of it cannot resolve a few
percent (its `null` comparison). This script times three AOT-compiled steps of
the same MLP and nothing else: ours (`Contract("int8", backward_operands="original")`),
the same traced and compiled a second time, and Qwix's `QtProvider` W8A8 step;
each round calls the three in a freshly shuffled order, and it prints the medians
over rounds of the same-round ratios ours2/ours1 (the floor), ours1/Qwix and
ours2/Qwix, each with its 95% interval (`peers.paired_ratio`). Run it several
times: each process compiles afresh. `--row ptq` compares the W8A8 PTQ forward
instead (int8 kernels per output channel, `peers.py`'s row), `--model block` the
transformer MLP blocks (with `--width 512 --batch 512`, `peers.py`'s).

`--cpus 0` runs the process on those CPUs alone (Linux; set before JAX starts its
thread pools): on one core the steps' work is compared without XLA:CPU's
scheduling of kernels over two threads.

    python benchmarks/step_pair.py --rounds 100
    python benchmarks/step_pair.py --rounds 100 --cpus 0
    python benchmarks/step_pair.py --rounds 100 --row ptq --model block --width 512 --batch 512
"""

from __future__ import annotations

import argparse
import os
import random
import time

import jax
import jax.numpy as jnp
import numpy as np
import peers
import qwix

import dtypes
import precision


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--model", choices=("mlp", "block"), default="mlp")
    p.add_argument("--row", choices=("step", "ptq"), default="step")
    p.add_argument(
        "--cpus",
        type=lambda s: {int(c) for c in s.split(",")},
        help="comma-separated CPU numbers to run on (Linux), e.g. 0",
    )
    args = p.parse_args(argv)
    if args.cpus is not None:  # before the first JAX call creates the client's pools
        os.sched_setaffinity(0, args.cpus)
    k_init, k_x, k_y = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k_x, (args.batch, 784), jnp.float32)
    labels = jax.random.randint(k_y, (args.batch,), 0, 10)
    model = peers._model(args.width, kind=args.model)
    params = model.init(k_init, x)

    if args.row == "step":
        rule = precision.Contract("int8", backward_operands="original")
        qt_rule = qwix.QtRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)
        qt_model = qwix.quantize_model(model, qwix.QtProvider([qt_rule]))
        theirs, their_params = qt_model.apply, params

        def ours():
            return precision.apply(model.apply, contract=rule), params

        def compiled(forward, params):
            step = peers._sgd_step(peers._loss(forward, labels))
            return jax.jit(step).lower(params, x).compile(), params

    else:  # the PTQ forward: stored int8 kernels against Qwix's quantized parameters
        stored = precision.to_reduced_precision(
            params, "int8", scaling=dtypes.PerAxis(-1), where="kernel"
        )
        ptq_rule = qwix.QuantizationRule(
            module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8
        )
        ptq_model = qwix.quantize_model(model, qwix.PtqProvider([ptq_rule]))
        abstract = jax.eval_shape(ptq_model.init, k_init, x)
        their_params = {"params": qwix.quantize_params(params["params"], abstract["params"])}
        theirs = ptq_model.apply

        def ours():
            return precision.apply(model.apply, contract="int8"), stored

        def compiled(forward, params):
            return jax.jit(forward).lower(params, x).compile(), params

    steps = {
        "ours1": compiled(*ours()),
        "ours2": compiled(*ours()),
        "qwix": compiled(theirs, their_params),
    }
    for f, params in steps.values():
        jax.block_until_ready(f(params, x))
    times: dict[str, list[float]] = {k: [] for k in steps}
    order, shuffle = list(steps), random.Random(0).shuffle
    for _ in range(args.rounds):
        shuffle(order)
        for k in order:
            f, params = steps[k]
            start = time.perf_counter()
            jax.block_until_ready(f(params, x))
            times[k].append(time.perf_counter() - start)
    ratios = [
        f"{a}/{b} {mid:.3f} [{low:.3f}, {high:.3f}]"
        for a, b in (("ours2", "ours1"), ("ours1", "qwix"), ("ours2", "qwix"))
        for mid, low, high in [peers.paired_ratio(times[a], times[b])]
    ]
    print(
        "  ".join(ratios),
        f"(qwix {args.row} {1000 * np.median(times['qwix']):.2f} ms, {args.model}, "
        f"{args.rounds} rounds, "
        f"jax {jax.__version__}, {jax.devices()[0].device_kind}, "
        f"{len(os.sched_getaffinity(0))} CPUs)",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
