"""`precision convert` and `report` on a GPT-2-small-sized checkpoint, against plain scripts.

Writes a random float32 checkpoint with GPT-2 small's 148 tensor names and
shapes (124M parameters, 475 MiB) and, per target format, times two child
processes and reads their peak resident set size from `wait4`:

* the plain script: `safetensors.numpy.load_file`, a numpy/ml_dtypes cast
  (bfloat16, float16) or a textbook absmax quantization (int8 per tensor;
  int4 per block of 32, two codes per byte), `safetensors.numpy.save_file`;
* `precision convert --keep none -q` with the same format and scaling
  (statistics on, the default), and again with `--no-stats`.

Then `precision report` of the int8 result. The packages are byte-compiled
first, as `pip install` does. Every tensor is converted by
both (no --keep), so the work is the same.

Run:  python benchmarks/convert.py [--formats bf16,fp16,int8,int4] [--dir /tmp] [--repeat 1]
      [--small]  (a 71 MiB checkpoint of the same names instead)
Needs about 1.5 GiB of free disk in --dir.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

MiB = 1 << 20

PLAIN = r"""
import sys, numpy as np, ml_dtypes, safetensors.numpy as st
src, dst, fmt = sys.argv[1:4]
durable = sys.argv[4:] == ["fsync"]
tensors = st.load_file(src)
out = {}
for name, x in tensors.items():
    if fmt == "bf16":
        out[name] = x.astype(ml_dtypes.bfloat16)
    elif fmt == "fp16":
        out[name] = x.astype(np.float16)
    elif fmt == "int8":  # per tensor
        scale = np.float32(np.abs(x).max() / 127) or np.float32(1)
        out[name] = np.clip(np.rint(x / scale), -127, 127).astype(np.int8)
        out[name + ":scale"] = np.array([scale], np.float32)
    elif fmt == "int4":  # per block of 32 along the last axis, two codes per byte
        g = x.reshape(-1, 32)
        scale = (np.abs(g).max(axis=1, keepdims=True) / 7).astype(np.float32)
        scale[scale == 0] = 1
        q = (np.clip(np.rint(g / scale), -7, 7).astype(np.int8) & 0xF).astype(np.uint8)
        out[name] = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(*x.shape[:-1], -1)
        out[name + ":scale"] = scale.reshape(*x.shape[:-1], -1)
    del x
st.save_file(out, dst)
if durable:  # on disk before it is reported written, as precision convert does
    import os
    fd = os.open(dst, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
"""

# format, scaling, whether the conversion compiles (imports JAX: the numpy paths
# do not, tests/precision/test_cli.py checks which)
FORMATS = {
    "bf16": ("bfloat16", "none", False),
    "fp16": ("float16", "none", False),
    "int8": ("int8", "per-tensor", False),
    "int4": ("int4", "per-block:32", True),
}


def gpt2_small(small: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    """GPT-2 small's tensor names and shapes (475 MiB); `small`: the same names at width
    384, 6 layers and a 20,000-token vocabulary (18.7M parameters, 71 MiB)."""
    d, layers, vocab, ctx = (384, 6, 20000, 1024) if small else (768, 12, 50257, 1024)
    out = [("wte.weight", (vocab, d)), ("wpe.weight", (ctx, d))]
    for i in range(layers):
        p = f"h.{i}."
        out += [
            (p + "ln_1.weight", (d,)), (p + "ln_1.bias", (d,)),
            (p + "attn.c_attn.weight", (d, 3 * d)), (p + "attn.c_attn.bias", (3 * d,)),
            (p + "attn.c_proj.weight", (d, d)), (p + "attn.c_proj.bias", (d,)),
            (p + "ln_2.weight", (d,)), (p + "ln_2.bias", (d,)),
            (p + "mlp.c_fc.weight", (d, 4 * d)), (p + "mlp.c_fc.bias", (4 * d,)),
            (p + "mlp.c_proj.weight", (4 * d, d)), (p + "mlp.c_proj.bias", (d,)),
        ]  # fmt: skip
    return [*out, ("ln_f.weight", (d,)), ("ln_f.bias", (d,))]


def write_checkpoint(path: str, small: bool) -> int:
    import safetensors.numpy

    rng = np.random.default_rng(0)
    shapes = gpt2_small(small)
    tensors = {n: (rng.standard_normal(s, dtype=np.float32) * 0.02) for n, s in shapes}
    safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})
    return sum(int(np.prod(s)) for _, s in shapes)


def measure(cmd: list[str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, stderr) of a child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
    return elapsed, usage.ru_maxrss * 1024, err


def best(cmd: list[str], repeat: int) -> tuple[float, int]:
    runs = [measure(cmd)[:2] for _ in range(repeat)]
    return min(r[0] for r in runs), max(r[1] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="bf16,fp16,int8,int4")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--repeat", type=int, default=1, help="best of N runs (time), max RSS")
    ap.add_argument("--small", action="store_true", help="a 71 MiB checkpoint (see gpt2_small)")
    ap.add_argument("--write", metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:
        write_checkpoint(args.write, args.small)
        return
    # byte-compiled first, as `pip install` does (an editable install writes
    # the bytecode on its first run, unless PYTHONDONTWRITEBYTECODE is set)
    for package in ("precision", "dtypes"):
        spec = importlib.util.find_spec(package)  # found, not imported: this process stays small
        assert spec is not None
        assert spec.submodule_search_locations
        compileall.compile_dir(spec.submodule_search_locations[0], quiet=1)
    work = tempfile.mkdtemp(dir=args.dir)
    try:
        src = os.path.join(work, "model.safetensors")
        # Written by a child: a child's peak RSS counts from the size of the
        # process it was forked from, so this one must stay small.
        small = ["--small"] if args.small else []
        subprocess.run([sys.executable, __file__, "--write", src, *small], check=True)
        params = sum(int(np.prod(s)) for _, s in gpt2_small(args.small))
        largest = max(int(np.prod(s)) * 4 for _, s in gpt2_small(args.small))
        print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
              f"Python {platform.python_version()}")  # fmt: skip
        size = os.path.getsize(src) / MiB
        print(f"# checkpoint: {params / 1e6:.1f}M float32 parameters, {size:.0f} MiB, "
              f"largest tensor {largest / MiB:.0f} MiB")  # fmt: skip
        base_t, base_rss = best([sys.executable, "-c", "import precision, jax"], args.repeat)
        print(f"# import precision, jax: {base_t:.2f} s, {base_rss / MiB:.0f} MiB (report's start)")
        print("# start: the same convert command with --dry-run (imports, header, plan); memory")
        print("# above it counts from importing precision and JAX where a conversion compiles")
        print("# plain + fsync: the plain script, then its output fsynced (precision convert")
        print("# writes a temporary file, fsyncs it and renames it: never a half-written file)")
        print("| format | plain script | plain + fsync | precision convert | ratio | ratio to"
              " plain + fsync | --no-stats | ratio | plain peak RSS | precision peak RSS |"
              " start | precision RSS - start |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        pcmd = [sys.executable, "-m", "precision", "convert"]
        for name in args.formats.split(","):
            fmt, scaling, compiles = FORMATS[name]
            out = os.path.join(work, f"out-{name}.safetensors")
            plain_t, plain_rss = best([sys.executable, "-c", PLAIN, src, out, name], args.repeat)
            os.unlink(out)
            durable_t, _ = best([sys.executable, "-c", PLAIN, src, out, name, "fsync"], args.repeat)
            os.unlink(out)
            cmd = [*pcmd, src, "-o", out, "--to", fmt, "--scaling", scaling, "--keep", "none"]
            cmd += ["-q", "--overwrite", "--warn-sqnr=-inf"]
            t, rss = best(cmd, args.repeat)
            t_ns, _ = best([*cmd, "--no-stats"], args.repeat)
            start_t, start_rss = best([*cmd, "--dry-run"], args.repeat)
            # a conversion that compiles starts by importing JAX, which --dry-run does not
            base = max(start_rss, base_rss) if compiles else start_rss
            print(f"| {fmt} ({scaling}) | {plain_t:.2f} s | {durable_t:.2f} s | {t:.2f} s | "
                  f"{t / plain_t:.2f}x | {t / durable_t:.2f}x | "
                  f"{t_ns:.2f} s | {t_ns / plain_t:.2f}x | {plain_rss / MiB:.0f} MiB | "
                  f"{rss / MiB:.0f} MiB | {start_t:.2f} s, {start_rss / MiB:.0f} MiB | "
                  f"{(rss - base) / MiB:.0f} MiB "
                  f"({(rss - base) / largest:.2f}x largest) |")  # fmt: skip
            if name == "int8":
                rt, rrss = best(
                    [sys.executable, "-m", "precision", "report", src, out, "-q"], args.repeat
                )
                report = (rt, rrss)
            os.unlink(out)
        if "int8" in args.formats.split(","):
            rt, rrss = report
            print(f"\nreport (float32 vs int8): {rt:.2f} s, peak RSS {rrss / MiB:.0f} MiB, "
                  f"{(rrss - base_rss) / MiB:.0f} MiB above importing precision and jax "
                  f"({(rrss - base_rss) / largest:.2f}x the largest tensor)")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
