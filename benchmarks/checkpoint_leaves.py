"""`precision.save` and `precision.load` on a checkpoint of many tiny tensors.

The per-leaf cost of a checkpoint: a flat tree of 65,536 one-element float32
arrays (`{f"t{i}": np.float32([i])}`, the most arrays one file may hold, 16 MB
on disk, nearly all of it header) saved and loaded by `precision`, against
`safetensors.numpy.save_file` / `load_file` on the same tree in the same run.
Every side runs `--repeat` times, alternately; the table holds the best run.

Run:  python benchmarks/checkpoint_leaves.py [--leaves 65536] [--repeat 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _best(fn: Callable[[], Any], times: list[float]) -> None:
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=65536)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()

    import jax
    import safetensors
    import safetensors.numpy as st

    import precision

    tree = {f"t{i}": np.array([i], np.float32) for i in range(args.leaves)}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        ours, theirs = os.path.join(tmp, "ours.safetensors"), os.path.join(tmp, "st.safetensors")
        names = ["save", "load", "load as_arrays", "st save_file", "st load_file"]
        times: dict[str, list[float]] = {k: [] for k in names}
        jax.numpy.zeros(1).block_until_ready()  # start the backend outside the timings
        for _ in range(args.repeat):
            _best(lambda: precision.save(ours, tree, overwrite=True), times["save"])
            _best(lambda: precision.load(ours), times["load"])
            _best(lambda: precision.load(ours, as_arrays=True), times["load as_arrays"])
            _best(lambda: st.save_file(tree, theirs), times["st save_file"])
            _best(lambda: st.load_file(theirs), times["st load_file"])
        loaded = precision.load(ours, as_arrays=True)
        assert len(loaded) == args.leaves
        assert float(loaded[f"t{args.leaves - 1}"][0]) == args.leaves - 1
        size = os.path.getsize(ours)

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    print(
        f"checkpoint of {args.leaves:,} one-element float32 tensors ({size / 1e6:.1f} MB), "
        f"best of {args.repeat}"
    )
    print(
        f"machine: {cpu}, {os.cpu_count()} cores; python {platform.python_version()}, "
        f"jax {jax.__version__} ({jax.default_backend()}), numpy {np.__version__}, "
        f"safetensors {safetensors.__version__}; load avg {os.getloadavg()[0]:.1f}"
    )
    print()
    print("| operation                  | seconds | us per leaf | / safetensors |")
    print("|----------------------------|---------|-------------|---------------|")
    for name in names[:3]:
        best = min(times[name])
        ref = min(times["st save_file" if name == "save" else "st load_file"])
        print(
            f"| precision {name:<16} | {best:7.2f} | {best / args.leaves * 1e6:11.1f} | "
            f"{best / ref:13.1f} |"
        )
    for name in names[3:]:
        best = min(times[name])
        print(f"| {name:<26} | {best:7.2f} | {best / args.leaves * 1e6:11.1f} | {'':13} |")


if __name__ == "__main__":
    main()
