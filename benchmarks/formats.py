"""Encode/decode speed of every storage format under `jax.jit` against numpy + ml_dtypes.

Usage:
    python benchmarks/formats.py                # 64M float32 values (256 MiB per array)
    python benchmarks/formats.py --quick        # 1M values, a smoke run
    python benchmarks/formats.py --packed-and-scaled   # only packed fp6, E8M0, NVFP4, NF4
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/formats.py

Every timing is the best of `--repeat` runs after one warm-up run (compilation
excluded), with `block_until_ready` on the result. The "ref ÷ jit" column is the
reference time divided by the jitted time, so above 1 means the jitted path is
faster; for the rows that compare two jitted paths the reference is the path
named in the "reference" column. The allocator setting matters on CPU: XLA
writes each result into a fresh buffer and pays a page fault per 4 KiB page of
it unless glibc is told to back large allocations with huge pages
(`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, read once at process start).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import dtypes


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    """Best wall time (seconds) of `repeat` calls of `fn`, after one warm-up call."""
    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        jax.block_until_ready(out)
        best = min(best, time.perf_counter() - start)
        del out
    return best


def best_of_pair(fn: Callable[[], Any], ref: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Best times of `fn` and `ref`, run alternately so both see the same machine load."""
    jax.block_until_ready(fn())
    jax.block_until_ready(ref())
    best = [float("inf"), float("inf")]
    for _ in range(repeat):
        for i, f in enumerate((fn, ref)):
            start = time.perf_counter()
            out = f()
            jax.block_until_ready(out)
            best[i] = min(best[i], time.perf_counter() - start)
            del out
    return best[0], best[1]


def machine() -> str:
    cpu = platform.processor() or "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores; python {platform.python_version()}, jax {jax.__version__} "
        f"({jax.default_backend()}), ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}"
    )


def allocator() -> str:
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    huge = "glibc.malloc.hugetlb" in tunables
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read().strip()
    except OSError:
        thp = "unknown"
    setting = f"GLIBC_TUNABLES={tunables!r}" if tunables else "GLIBC_TUNABLES unset"
    return (
        f"{setting} -> glibc.malloc.hugetlb {'ON' if huge else 'off'}; transparent_hugepage: {thp}"
    )


def load() -> str:
    """1-minute load average: above the core count, timings include waiting for a core."""
    return f"{os.getloadavg()[0]:.1f}"


class Table:
    def __init__(self):
        self.rows: list[tuple[str, float, str, float | None, str]] = []

    def add(self, case: str, jit_s: float, ref_name: str = "", ref_s: float | None = None,
            target: str = "") -> None:  # fmt: skip
        self.rows.append((case, jit_s, ref_name, ref_s, target))

    def render(self) -> str:
        head = ("case", "jit ms", "reference", "ref ms", "ref ÷ jit", "target", "met")
        lines = []
        for case, jit_s, ref_name, ref_s, target in self.rows:
            ratio = "" if ref_s is None else f"{ref_s / jit_s:.2f}"
            met = ""
            if target and ref_s is not None:
                met = "yes" if ref_s / jit_s >= float(target.split()[1]) else "NO"
            ref_ms = "" if ref_s is None else f"{ref_s * 1e3:.1f}"
            lines.append((case, f"{jit_s * 1e3:.1f}", ref_name, ref_ms, ratio, target, met))
        widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]

        def fmt(r):
            return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

        sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        return "\n".join([fmt(head), sep, *(fmt(r) for r in lines)])


def copy_rows(table: Table, x: jax.Array, x_np: np.ndarray, repeat: int) -> None:
    """The memory ceiling: the cheapest jitted pass that reads and writes float32."""
    scale2 = jax.jit(lambda v: v * 2)
    t_copy, t_np = best_of_pair(lambda: scale2(x), lambda: x_np * 2, repeat)
    table.add("copy x*2 (fresh output)", t_copy, "numpy x*2", t_np)
    donated = jax.jit(lambda v: v * 2, donate_argnums=0)
    holder = [jnp.array(x)]

    def step():
        holder[0] = donated(holder[0])
        return holder[0]

    table.add("copy x*2 (donated, in place)", best_of(step, repeat))


def encode_fn(fmt: dtypes.Format, x: jax.Array, **kw) -> Callable[[], Any]:
    key = jax.random.key(0)
    f = jax.jit(lambda v, k: fmt.encode(v, key=k, **kw))
    return lambda: f(x, key)


def decode_fn(enc: dtypes.Encoded) -> Callable[[], Any]:
    f = jax.jit(lambda e: e.decode())
    return lambda: f(enc)


def native_rows(table, fmt, x, x_np, repeat, target) -> None:
    """Encode and decode against ml_dtypes `astype`."""
    t_enc, t_ref = best_of_pair(encode_fn(fmt, x), lambda: x_np.astype(fmt.native_dtype), repeat)
    table.add(f"encode {fmt.name}", t_enc, "ml_dtypes astype", t_ref, target)
    enc = fmt.encode(x)
    codes = np.asarray(enc.data)
    t_dec, t_dec_ref = best_of_pair(decode_fn(enc), lambda: codes.astype(np.float32), repeat)
    table.add(f"decode {fmt.name}", t_dec, "ml_dtypes astype", t_dec_ref)


def numpy_int8(v: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """The integer rule (docs/design.md §2): one reciprocal per tensor, then per value a
    multiply and a round-half-even."""
    absmax = np.max(np.abs(v))
    inv = np.float32(127) / absmax
    return np.clip(np.rint(v * inv), -127, 127).astype(np.int8), absmax / np.float32(127)


def int_rows(table, x, x_np, repeat) -> None:
    t_int8, t_ref = best_of_pair(encode_fn(dtypes.int8, x), lambda: numpy_int8(x_np), repeat)
    table.add("quantize int8 per-tensor", t_int8, "numpy formula", t_ref, ">= 3")
    codes, scale = numpy_int8(x_np)
    t_dec, t_ref_dec = best_of_pair(
        decode_fn(dtypes.int8.encode(x)), lambda: codes.astype(np.float32) * scale, repeat
    )
    table.add("dequantize int8 per-tensor", t_dec, "numpy formula", t_ref_dec)
    for fmt in (dtypes.int4, dtypes.int1):
        table.add(f"quantize+pack {fmt.name} per-tensor", best_of(encode_fn(fmt, x), repeat))
        t_dec = best_of(decode_fn(fmt.encode(x)), repeat)
        table.add(f"unpack+dequantize {fmt.name}", t_dec)


def unpacked_fp6(fmt: dtypes.FloatFormat) -> tuple[Callable, Callable]:
    """Encode to one uint8 code per value and decode it: fp6 as it was stored before packing."""
    from dtypes import _custom_float_bits, _float_codec

    def encode(v: jax.Array) -> jax.Array:
        return _custom_float_bits.to_codes(
            fmt, _float_codec.round_values(fmt, v, "nearest_even", None)
        )

    enc = jax.jit(encode)
    dec = jax.jit(lambda c: _custom_float_bits.from_codes(fmt, c))
    return enc, dec


def packed_and_scaled_rows(table: Table, x: jax.Array, x_np: np.ndarray, repeat: int) -> None:
    """Dense fp6 packing, E8M0 and e4m3 (NVFP4) scales, the NF4 code book."""
    fp6 = dtypes.get("float6_e3m2fn")
    enc_unpacked, dec_unpacked = unpacked_fp6(fp6)
    t, t_ref = best_of_pair(encode_fn(fp6, x), lambda: enc_unpacked(x), repeat)
    table.add("encode float6_e3m2fn packed", t, "jit unpacked fp6", t_ref, ">= 0.67")
    t, t_ref = best_of_pair(encode_fn(fp6, x), lambda: x_np.astype(ml_dtypes.float6_e3m2fn), repeat)
    table.add("encode float6_e3m2fn packed", t, "ml_dtypes astype", t_ref)
    codes = enc_unpacked(x)
    t, t_ref = best_of_pair(decode_fn(fp6.encode(x)), lambda: dec_unpacked(codes), repeat)
    table.add("decode float6_e3m2fn packed", t, "jit unpacked fp6", t_ref)
    codes_np = x_np.astype(ml_dtypes.float6_e3m2fn)
    t, t_ref = best_of_pair(decode_fn(fp6.encode(x)), lambda: codes_np.astype(np.float32), repeat)
    table.add("decode float6_e3m2fn packed", t, "ml_dtypes astype", t_ref)

    f32_mx = dtypes.PerBlock(32, power_of_two=True)
    for name in ("mxfp8_e4m3", "mxfp4", "mxint8"):
        fmt = dtypes.get(name)
        t, t_ref = best_of_pair(encode_fn(fmt, x), encode_fn(fmt, x, scaling=f32_mx), repeat)
        table.add(f"encode {name} (E8M0 scales)", t, "float32 pow2 scales", t_ref, ">= 1")
        t, t_ref = best_of_pair(
            decode_fn(fmt.encode(x)), decode_fn(fmt.encode(x, scaling=f32_mx)), repeat
        )
        table.add(f"decode {name} (E8M0 scales)", t, "float32 pow2 scales", t_ref, ">= 1")

    nvfp4, mxfp4 = dtypes.get("nvfp4"), dtypes.get("mxfp4")
    t, t_ref = best_of_pair(encode_fn(nvfp4, x), encode_fn(mxfp4, x), repeat)
    table.add("encode nvfp4 (e4m3 + tensor scale)", t, "jit mxfp4 encode", t_ref)
    t, t_ref = best_of_pair(decode_fn(nvfp4.encode(x)), decode_fn(mxfp4.encode(x)), repeat)
    table.add("decode nvfp4", t, "jit mxfp4 decode", t_ref)

    nf4 = dtypes.get("nf4")
    g64 = dtypes.PerBlock(64)
    t, t_ref = best_of_pair(encode_fn(nf4, x), encode_fn(dtypes.int4, x, scaling=g64), repeat)
    table.add("encode nf4 (PerBlock(64))", t, "jit int4 PerBlock(64)", t_ref)
    t, t_ref = best_of_pair(
        decode_fn(nf4.encode(x)), decode_fn(dtypes.int4.encode(x, scaling=g64)), repeat
    )
    table.add("decode nf4", t, "jit int4 PerBlock(64)", t_ref)

    g128, g128_bf16 = dtypes.PerBlock(128), dtypes.PerBlock(128, scale_format="bfloat16")
    t, t_ref = best_of_pair(
        encode_fn(dtypes.int4, x, scaling=g128_bf16),
        encode_fn(dtypes.int4, x, scaling=g128),
        repeat,
    )
    table.add("encode int4 g128 (bf16 scales)", t, "float32 scales", t_ref)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=64 * 2**20, help="number of float32 values")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per case (best kept)")
    parser.add_argument("--quick", action="store_true", help="1M values, 3 repeats")
    parser.add_argument(
        "--packed-and-scaled",
        action="store_true",
        help="only the rows of packed fp6, E8M0/NVFP4 scales and NF4",
    )
    args = parser.parse_args(argv)
    n, repeat = (2**20, 3) if args.quick else (args.n, args.repeat)

    load_at_start = load()
    x_np = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    x = jax.device_put(x_np)
    table = Table()
    copy_rows(table, x, x_np, repeat)
    if args.packed_and_scaled:
        packed_and_scaled_rows(table, x, x_np, repeat)
        _report(n, repeat, load_at_start, table)
        return

    targets = {"bfloat16": ">= 0.75", "float16": ">= 3", "float8_e4m3fn": ">= 3",
               "float8_e5m2": ">= 3"}  # fmt: skip
    for name, target in targets.items():
        native_rows(table, dtypes.get(name), x, x_np, repeat, target)

    # tf32 and layouts with no native dtype, against the bf16 encode ("within 2x").
    fp6 = dtypes.FloatFormat(3, 2, finite=True)  # OCP float6_e3m2fn layout (uint8 codes)
    fp4 = dtypes.FloatFormat(2, 1, finite=True)  # OCP float4_e2m1fn, MXFP4's elements (packed)
    bf16 = encode_fn(dtypes.bfloat16, x)
    for fmt in (dtypes.tf32, fp6, fp4):
        t, t_ref = best_of_pair(encode_fn(fmt, x), bf16, repeat)
        table.add(f"encode {fmt.name}", t, "jit bfloat16 encode", t_ref, ">= 0.5")
        table.add(f"decode {fmt.name}", best_of(decode_fn(fmt.encode(x)), repeat))

    # Stochastic rounding against nearest-even of the same format ("at most 2.5x").
    for fmt in (dtypes.bfloat16, dtypes.tf32, dtypes.float8_e4m3fn, fp4):
        stochastic = encode_fn(fmt, x, rounding="stochastic")
        t, t_ref = best_of_pair(stochastic, encode_fn(fmt, x), repeat)
        table.add(f"encode {fmt.name} stochastic", t, "jit nearest_even", t_ref, ">= 0.4")

    int_rows(table, x, x_np, repeat)
    packed_and_scaled_rows(table, x, x_np, repeat)

    mx = dtypes.PerBlock(32, power_of_two=True)  # float32 scales; E8M0 rows come below
    for name, fmt in (("MXFP8", dtypes.float8_e4m3fn), ("MXFP4", fp4), ("MXINT8", dtypes.int8)):
        table.add(f"encode {name} ({fmt.name}, PerBlock(32) pow2)",
                  best_of(encode_fn(fmt, x, scaling=mx), repeat))  # fmt: skip

    _report(n, repeat, load_at_start, table)


def _report(n: int, repeat: int, load_at_start: str, table: Table) -> None:
    print(f"precision format benchmark: n = {n:,} float32 values ({n * 4 / 2**20:.0f} MiB), "
          f"best of {repeat} after a warm-up")  # fmt: skip
    print(f"machine:   {machine()}")
    print(f"allocator: {allocator()}")
    print(f"load avg:  {load_at_start} at start, {load()} at end (other processes share the CPU)")
    print()
    print(table.render())


if __name__ == "__main__":
    main()
