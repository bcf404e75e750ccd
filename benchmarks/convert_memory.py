"""Peak memory of `precision convert` on a generated checkpoint of >= 1 GiB.

`convert` reads, converts and writes one tensor at a time, so the memory it
needs beyond a bare `import precision, jax` should be about one tensor (the
input buffer plus the output codes), not the whole model twice. This script
writes a plain safetensors file (8 float32 tensors of 128 MiB plus small
ones) to a temporary directory, runs `python -m precision convert` on it in
a child process for each target format, and reads the child's peak resident
set size from `wait4`. The baseline is the peak RSS of a child that only
imports precision and jax and runs one jitted op.

Run:  python benchmarks/convert_memory.py [--formats int8,int4@per-block:32,bfloat16] [--dir /tmp]
(`FORMAT@SCALING` passes `--scaling SCALING`.)
Needs about 2.3 GiB of free disk in --dir (input plus one output at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

MiB = 1 << 20


def layout(big: int, big_shape: tuple[int, int], small: int) -> list[tuple[str, tuple]]:
    tensors = [(f"layers.{i}.weight", big_shape) for i in range(big)]
    tensors += [(f"layers.{i % big}.norm.{i}", (big_shape[1],)) for i in range(small)]
    return tensors


def write_plain_safetensors(path: str, tensors: list[tuple[str, tuple]], seed: int) -> None:
    """A plain safetensors file (F32, no metadata), written one tensor at a time."""
    header, offset = {}, 0
    for name, shape in tensors:
        n = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, shape in tensors:
            rng.standard_normal(shape, dtype=np.float32).tofile(f)


def peak_rss(cmd: list[str]) -> tuple[int, float, str]:
    """(peak RSS in bytes, wall seconds, stdout) of a child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err}")
    return usage.ru_maxrss * 1024, wall, out  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="int8,int4,int4@per-block:32,bfloat16")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--big", type=int, default=8, help="number of 128 MiB tensors")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--write", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()

    big_shape = (8192, 4096)  # 128 MiB of float32
    tensors = layout(args.big, big_shape, small=16)
    if args.write:
        write_plain_safetensors(args.write, tensors, seed=0)
        return
    work = tempfile.mkdtemp(prefix="precision-convert-memory-", dir=args.dir)
    try:
        src = os.path.join(work, "model.safetensors")
        t0 = time.perf_counter()
        # Written by a child: a child's peak RSS counts from the peak of the
        # process it was forked from, so this one must never hold a tensor.
        subprocess.run(
            [sys.executable, __file__, "--write", src, "--big", str(args.big)], check=True
        )
        size = os.path.getsize(src)
        largest = max(int(np.prod(s)) * 4 for _, s in tensors)
        print(
            f"checkpoint: {len(tensors)} tensors, {size / MiB:.0f} MiB, largest "
            f"{largest / MiB:.0f} MiB (written in {time.perf_counter() - t0:.1f} s)"
        )
        baseline, _, _ = peak_rss(
            [
                sys.executable,
                "-c",
                "import precision, jax, jax.numpy as jnp; jax.jit(lambda x: x + 1)(jnp.ones(8))",
            ]
        )
        print(f"baseline (import precision, jax; one jitted op): {baseline / MiB:.0f} MiB peak RSS")
        rows = []
        for fmt in args.formats.split(","):
            name, _, scaling = fmt.partition("@")
            dst = os.path.join(work, "model-out.safetensors")
            cmd = [sys.executable, "-m", "precision", "convert", src, "-o", dst, "--to", name, "-q"]
            cmd += ["--keep", "none"]
            cmd += ["--scaling", scaling] if scaling else []
            peak, wall, out = peak_rss(cmd)
            extra = peak - baseline
            rows.append((fmt, peak, extra, extra / largest, wall, os.path.getsize(dst)))
            worst = [line for line in out.splitlines() if line.startswith("worst SQNR")]
            print(f"  {fmt}: done in {wall:.1f} s; {worst[0] if worst else ''}")
            os.unlink(dst)
        print()
        print(
            "| target | peak RSS | extra over baseline | extra / largest tensor | wall time "
            "| output size |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for fmt, peak, extra, ratio, wall, out_size in rows:
            print(
                f"| {fmt} | {peak / MiB:.0f} MiB | {extra / MiB:.0f} MiB | {ratio:.2f}x | "
                f"{wall:.1f} s | {out_size / MiB:.0f} MiB |"
            )
        print()
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, {platform.system()} {platform.release()}"
        )
        print("target: extra / largest tensor <= 1.50x")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
