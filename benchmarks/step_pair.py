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

`--profile 30` also profiles that many calls of ours and of Qwix's (JAX's profiler) and
prints, per call (medians), the time of the kernels that are dots, of all the other
kernels, and how long after the call's first kernel its first dot starts: where the two
programs' work differs, and where XLA:CPU's ordering of it does.

    python benchmarks/step_pair.py --rounds 100
    python benchmarks/step_pair.py --rounds 100 --cpus 0
    python benchmarks/step_pair.py --rounds 20 --profile 30
    python benchmarks/step_pair.py --rounds 100 --row ptq --model block --width 512 --batch 512
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import re
import tempfile
import time
from typing import Any

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
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="CALLS",
        help="also profile this many calls of ours and of Qwix's",
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
    for k in ("ours1", "qwix") if args.profile else ():
        f, params = steps[k]
        dots, others, first = _profile(f, params, x, args.profile)
        print(
            f"  {k}: dots {dots:.2f} ms, other kernels {others:.2f} ms a call; the first dot "
            f"starts {first:.2f} ms after the call's first kernel (medians of {args.profile})"
        )
    return 0


def _profile(compiled: Any, params: Any, x: jax.Array, calls: int) -> tuple[float, float, float]:
    """(dot kernels' ms, other kernels' ms, ms from the first kernel to the first dot's
    start), medians over `calls` profiled calls of `compiled`."""
    hlo = compiled.as_text()
    bodies = dict(re.findall(r"\n(%\S+) [^\n]*\{\n(.*?)\n\}", hlo, flags=re.S))
    kinds: dict[str, str] = {}  # kernel name -> "dot" / "other" (conditionals: neither)
    for name, opcode, rest in re.findall(r"%(\S+) = \S+ ([\w-]+)\((.*)", hlo):
        called = re.search(r"calls=(%\S+?)[,\s]", rest)
        body = bodies.get(called.group(1), "") if called else ""
        if opcode == "dot" or " dot(" in body:
            kinds[name] = "dot"
        elif opcode in ("fusion", "copy", "custom-call", "reduce", "reduce-window", "sort"):
            kinds[name] = "other"
    for _ in range(3):
        jax.block_until_ready(compiled(params, x))
    with tempfile.TemporaryDirectory() as where:
        with jax.profiler.trace(where):
            for _ in range(calls):
                jax.block_until_ready(compiled(params, x))
        data = jax.profiler.ProfileData.from_file(
            glob.glob(f"{where}/**/*.xplane.pb", recursive=True)[0]
        )
    calls_at, kernels = [], []
    for plane in data.planes:
        for line in plane.lines:
            for ev in line.events:
                if ev.name == "CommonPjRtLoadedExecutable::ExecuteHelperOnSingleDevice":
                    calls_at.append(ev.start_ns)
                elif ev.name in kinds:
                    kernels.append((ev.start_ns, ev.duration_ns, kinds[ev.name]))
    calls_at.sort()
    per_call = []
    for start, end in zip(calls_at, [*calls_at[1:], float("inf")], strict=True):
        mine = sorted(k for k in kernels if start <= k[0] < end)
        dot_starts = [k[0] for k in mine if k[2] == "dot"]
        if not mine or not dot_starts:
            continue
        per_call.append(
            (
                sum(k[1] for k in mine if k[2] == "dot") / 1e6,
                sum(k[1] for k in mine if k[2] == "other") / 1e6,
                (dot_starts[0] - mine[0][0]) / 1e6,
            )
        )
    dots, others, first = np.median(np.asarray(per_call), axis=0)
    return float(dots), float(others), float(first)


if __name__ == "__main__":
    raise SystemExit(main())
