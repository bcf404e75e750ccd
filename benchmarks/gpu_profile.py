"""Where the time of the accelerator rows goes: the kernels of one call, from JAX's profiler.

Usage:
    python benchmarks/gpu_profile.py --out DIR            # on a GPU machine
    python benchmarks/gpu_profile.py --out DIR --quick    # small sizes (tries it on a CPU)

For each program below it compiles, warms up, traces a few calls with
`jax.profiler.trace`, and prints the kernels of one call: the XLA op (or kernel)
name, microseconds per call and its share, grouped into GEMMs, transposes and
copies, and the rest (the quantizing and rounding fusions). The optimized HLO and
the raw profiles go to `DIR/profiles.tar.gz` for a closer look on another machine.

Programs: the bf16 GEMM that is every ratio's baseline; the quantized contractions of
`benchmarks/accelerator.py` part 4 (W8A8 on float32 operands and on a stored int8
weight in both layouts, fp8 per tensor on float32 operands and on a stored fp8 weight
in both layouts, fp8 per row); the GPT-2-small-like forward of `benchmarks/models.py`
under `apply(compute="bfloat16")` and as plain JAX with the bfloat16 policy.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import dtypes
import precision
from precision import Tensor

sys.path.insert(0, os.path.dirname(__file__))

CALLS = 5


def _kind(name: str) -> str:
    low = name.lower()
    if any(s in low for s in ("gemm", "cublas", "matmul", "dot", "xmma", "cutlass", "triton_gemm")):
        return "GEMM"
    if any(s in low for s in ("transpose", "copy")):
        return "transpose/copy"
    return "other"


def _device_lines(path: str) -> dict[str, list[tuple[str, float]]]:
    """{line name: [(event name, ns)]} of the accelerator's planes (the host's op lines when
    there is no accelerator plane: a CPU run)."""
    data = jax.profiler.ProfileData.from_file(path)
    planes = [p for p in data.planes if p.name.startswith("/device:")]
    if not planes:
        planes = [p for p in data.planes if p.name == "/host:CPU"]
    lines: dict[str, list[tuple[str, float]]] = collections.defaultdict(list)
    for plane in planes:
        for line in plane.lines:
            for event in line.events:
                if event.duration_ns > 0:
                    lines[f"{plane.name} {line.name}"].append((event.name, event.duration_ns))
    return lines


def profile(label: str, fn: Callable[..., Any], args: tuple[Any, ...], keep: str) -> None:
    compiled = jax.jit(fn).lower(*args).compile()
    safe = "".join(c if c.isalnum() else "_" for c in label)[:60]
    with open(os.path.join(keep, f"{safe}.hlo.txt"), "w") as f:
        f.write(compiled.as_text())
    for _ in range(3):
        jax.block_until_ready(compiled(*args))
    start = time.perf_counter()
    for _ in range(CALLS):
        jax.block_until_ready(compiled(*args))
    wall = (time.perf_counter() - start) / CALLS
    trace = tempfile.mkdtemp()
    with jax.profiler.trace(trace):
        for _ in range(CALLS):
            jax.block_until_ready(compiled(*args))
    found = glob.glob(f"{trace}/**/*.xplane.pb", recursive=True)
    print(f"\n### {label}: {wall * 1e6:.0f} us per call (wall, untraced)")
    if not found:
        print("no profile written")
        return
    os.replace(found[0], os.path.join(keep, f"{safe}.xplane.pb"))
    lines = _device_lines(os.path.join(keep, f"{safe}.xplane.pb"))
    # the line of XLA ops where there is one (GPU), else every line (kernels by stream)
    ops = {k: v for k, v in lines.items() if k.endswith("XLA Ops")}
    chosen = ops or lines
    per: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.defaultdict(int)
    for events in chosen.values():
        for name, ns in events:
            per[name] += ns / CALLS
            count[name] += 1
    total = sum(per.values())
    kinds: dict[str, float] = collections.defaultdict(float)
    for name, ns in per.items():
        kinds[_kind(name)] += ns
    print(
        f"lines: {', '.join(sorted(chosen))}; busy {total / 1e3:.0f} us per call; "
        + ", ".join(f"{k} {v / 1e3:.0f} us" for k, v in sorted(kinds.items()))
    )
    print("| op | launches per call | us per call | share |\n|---|---:|---:|---:|")
    for name, ns in sorted(per.items(), key=lambda kv: -kv[1])[:14]:
        print(f"| {name[:70]} | {count[name] / CALLS:.0f} | {ns / 1e3:.1f} | {ns / total:.0%} |")
    kernels = {k: v for k, v in lines.items() if "Stream" in k}
    if ops and kernels:  # the kernels behind the ops, by name (the GEMM's configuration)
        knames: dict[str, float] = collections.defaultdict(float)
        for events in kernels.values():
            for name, ns in events:
                knames[name] += ns / CALLS
        top = sorted(knames.items(), key=lambda kv: -kv[1])[:6]
        print("kernels: " + "; ".join(f"{n[:90]} {ns / 1e3:.1f} us" for n, ns in top))


def contractions(m: int, keep: str) -> None:
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((m, m), np.float32))
    b = jnp.asarray(rng.standard_normal((m, m), np.float32))
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    profile(
        "bf16 GEMM -> f32 (the baseline)",
        lambda p, q: jax.lax.dot(p, q, preferred_element_type=jnp.float32),
        (a16, b16),
        keep,
    )
    e4m3 = precision.Contract("float8_e4m3fn")
    w8 = dict(scaling=dtypes.PerAxis(1))
    f8 = dict(scaling=dtypes.PerTensor())
    cases: tuple[tuple[str, Any, Any], ...] = (
        ("W8A8, float32 operands", "int8", b),
        ("W8A8, stored int8 weight", "int8", Tensor(b).to_reduced_precision("int8", **w8)),
        (
            "W8A8, stored int8 weight held transposed",
            "int8",
            Tensor(b).to_reduced_precision("int8", layout="transposed", **w8),
        ),
        ("fp8 per tensor, float32 operands", e4m3, b),
        (
            "fp8 per tensor, stored fp8 weight held transposed",
            e4m3,
            Tensor(b).to_reduced_precision("float8_e4m3fn", layout="transposed", **f8),
        ),
        ("fp8 per row", precision.Contract("float8_e4m3fn", scaling="rowwise"), b),
    )
    for label, contract, rhs in cases:
        profile(label, precision.apply(lambda p, q: p @ q, contract=contract), (a, rhs), keep)


def gpt2(quick: bool, keep: str) -> None:
    import models

    model, shape, _ = models._models(quick)["gpt2"]
    tokens = jax.random.randint(jax.random.key(0), shape, 0, model.vocab)
    variables = jax.jit(model.init)(jax.random.key(1), tokens)

    def cast(tree: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda a: a.astype(jnp.bfloat16) if jnp.issubdtype(a.dtype, jnp.floating) else a,
            tree,
        )

    profile(
        "GPT-2 forward, plain JAX with the bf16 policy",
        lambda v, t: model.apply(cast(v), t),
        (variables, tokens),
        keep,
    )
    profile(
        'GPT-2 forward, apply(compute="bfloat16")',
        precision.apply(model.apply, compute="bfloat16"),
        (variables, tokens),
        keep,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for profiles.tar.gz")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="cg", help="c: contractions, g: GPT-2")
    args = parser.parse_args()
    dev = jax.devices()[0]
    print(f"machine: jax {jax.__version__}, {dev.platform} ({dev.device_kind})")
    keep = tempfile.mkdtemp()
    try:
        if "c" in args.parts:
            contractions(512 if args.quick else 8192, keep)
        if "g" in args.parts:
            gpt2(args.quick, keep)
    finally:
        with tarfile.open(os.path.join(args.out, "profiles.tar.gz"), "w:gz") as tar:
            tar.add(keep, arcname="profiles")


if __name__ == "__main__":
    main()
