"""The accelerator paths: bit-identity with the CPU and ml_dtypes, native matmuls, speed.

Usage (on a machine with a GPU or TPU; on CPU it runs but compares CPU with itself):
    python benchmarks/accelerator.py            # full run
    python benchmarks/accelerator.py --quick    # fewer values, smaller matrices
    python benchmarks/accelerator.py --matrix 2048 --values 16777216   # sized for a CPU

Six parts, printed as tables with the machine they ran on:

1. Bit-identity. Every format in every rounding mode encodes the same values on
   the accelerator and on the host CPU (the same program, two backends), byte
   for byte, codes and scales; in nearest-even the float formats also match
   ml_dtypes' casts. Inputs: random float32 bit patterns over the whole finite
   range (subnormals included) plus every edge value of the format.
2. Contractions. `Tensor @ Tensor` under `jit` for bf16, fp16, fp8 and int8:
   which dot XLA compiled (operand and result element types read from the
   optimized HLO) and the largest error against a float64 product of the
   decoded values (0 for int8: its int32 accumulation is exact).
3. Speed. Jitted `Tensor @ Tensor` against the same product written by hand in
   raw JAX (ratio 1.00 means zero overhead), and encode throughput of each
   format against a bare `astype(bfloat16)` of the same array.
4. Quantized contractions (`apply(f, contract=...)`): W8A8 on float32 operands
   and on a stored int8 weight, fp8 e4m3 per tensor (the HYBRID forward), per
   row and MX: the dot XLA compiled (on a GPU the fp8 rows should name a
   cuBLASLt fp8 GEMM, `__cublas$lt$matmul$f8`), the error against the float32
   product, and the jitted time against a plain float32 matmul.
5. The floor under part 4: bare bf16, fp8 and int8 GEMMs of operands quantized
   beforehand, both layouts of the right operand and two result types, and one
   operand's per-tensor encode alone, against the bf16 GEMM.
6. The encodes of part 3 still above their target, eager and jitted, with the
   number of kernels XLA compiled each into.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import dtypes
import precision
from precision import Tensor, _hlo

FP6 = dtypes.FloatFormat(3, 2, finite=True, name="float6_e3m2fn")  # OCP float6 layout
FP4 = dtypes.FloatFormat(2, 1, finite=True, name="float4_e2m1fn")  # MXFP4's elements
FLOATS = (dtypes.bfloat16, dtypes.float16, dtypes.float8_e4m3fn, dtypes.float8_e5m2)
FLOATS += (dtypes.tf32, FP6, FP4)
INTS = (dtypes.int8, dtypes.int4, dtypes.int2, dtypes.int1)


def _inputs(n: int, fmt: dtypes.Format) -> np.ndarray:
    """Random finite float32 bit patterns, plus the format's edges and midpoints."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    if isinstance(fmt, dtypes.FloatFormat):
        # values around the format's own range, where rounding decides most
        lo, hi = np.log2(fmt.smallest_subnormal) - 2, np.log2(fmt.max) + 1
        near = np.exp2(rng.uniform(lo, hi, n // 2)).astype(np.float32)
        near *= rng.choice(np.array([-1, 1], np.float32), n // 2)
        edges = [fmt.max, fmt.min_normal, fmt.smallest_subnormal, fmt.smallest_subnormal / 2]
        if not fmt.has_inf and fmt.saturate is False:
            x = x[np.abs(x) <= fmt.max]  # out-of-range input is refused or NaN there
        x = np.concatenate([x, near, np.float32(edges), -np.float32(edges), [0.0, -0.0]])
    return np.ascontiguousarray(x.astype(np.float32))


def _encode_on(device, fmt, x, rounding, key, scaling):
    with jax.default_device(device):
        xd = jax.device_put(x, device)
        kd = jax.device_put(key, device)
        enc = fmt.encode(xd, rounding=rounding, key=kd, scaling=scaling)
        data = np.asarray(enc.data)
        scale = None if enc.scale is None else np.asarray(enc.scale)
    return data, scale


def bit_identity(n: int) -> list[tuple[str, str, int, str]]:
    accel, cpu = jax.devices()[0], jax.devices("cpu")[0]
    key = jax.random.key(7)
    rows = []
    for fmt in FLOATS + INTS:
        name = fmt.name
        x = _inputs(n, fmt)
        for rounding in dtypes.ROUNDING_MODES:
            scalings = [None]
            if isinstance(fmt, dtypes.IntFormat):
                scalings = [dtypes.PerTensor(), dtypes.PerBlock(32, axis=0)]
                if fmt.bits > 1:
                    scalings.append(dtypes.PerBlock(32, axis=0, power_of_two=True))
            for scaling in scalings:
                xs = x[: len(x) // 32 * 32] if scaling is not None else x
                got = _encode_on(accel, fmt, xs, rounding, key, scaling)
                want = _encode_on(cpu, fmt, xs, rounding, key, scaling)
                same = np.array_equal(got[0].view(np.uint8), want[0].view(np.uint8)) and (
                    got[1] is None
                    or np.array_equal(got[1].view(np.uint32), want[1].view(np.uint32))
                )
                verdict = "identical" if same else "DIFFERENT"
                if (
                    rounding == "nearest_even"
                    and isinstance(fmt, dtypes.FloatFormat)
                    and fmt.native_dtype is not None
                ):
                    with np.errstate(over="ignore"):  # out of range: inf, as in XLA
                        ref = xs.astype(fmt.native_dtype)
                    ok = np.array_equal(got[0].view(np.uint8), ref.view(np.uint8))
                    verdict += ", = ml_dtypes" if ok else ", ml_dtypes DIFFERENT"
                label = name if scaling is None else f"{name} {scaling!r}"
                rows.append((label, rounding, xs.size, verdict))
    return rows


def _dot_types(compiled_text: str) -> str:
    """The dots (or library matmul calls) of optimized HLO: result <- operand types."""
    types = dict(re.findall(r"(%[\w.\-]+) = \(?(\w+)\[", compiled_text))
    found = []
    for line in compiled_text.splitlines():
        m = re.search(r"= \(?(\w+)\[[^=]*?\b(dot|convolution|custom-call)\((.*?)\)", line)
        if m is None:
            continue
        target = re.search(r'custom_call_target="([^"]+)"', line)
        if m.group(2) == "custom-call" and not (target and re.search("gemm|matmul", target[1])):
            continue
        operands = re.findall(r"(\w+)\[", m.group(3))[:2]
        if not operands:  # operands printed by name only
            operands = [types.get(o, "?") for o in re.findall(r"%[\w.\-]+", m.group(3))[:2]]
        what = target[1] if target else m.group(2)
        found.append(f"{what}: {m.group(1)} <- {' x '.join(operands)}")
    return "; ".join(dict.fromkeys(found)) or "(no dot found)"


def contractions(m: int) -> list[tuple[str, str, float, float]]:
    """(format, dots, max relative error, share of outputs equal to the correctly
    rounded float64 product) of a jitted `Tensor @ Tensor`."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, m), np.float32)
    b = rng.standard_normal((m, m), np.float32)
    matmul = jax.jit(lambda p, q: p @ q)
    rows = []
    for name in ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "int8"):
        ta = Tensor(a).to_reduced_precision(name)
        tb = Tensor(b).to_reduced_precision(name)
        hlo = matmul.lower(ta, tb).compile().as_text()
        out = matmul(ta, tb)
        da = np.asarray(ta.to_full_precision(), np.float64)
        db = np.asarray(tb.to_full_precision(), np.float64)
        ref = da @ db
        got = np.asarray(out.to_full_precision(), np.float64)
        rel = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        # the result is stored in the format again: compare with the float64
        # product rounded once into it (same scaling for the integer formats)
        want = Tensor(ref.astype(np.float32)).to_reduced_precision(name, scaling=out.scaling)
        equal = float(np.mean(got == np.asarray(want.to_full_precision(), np.float64)))
        rows.append((name, _dot_types(hlo), rel, equal))
    return rows


def _median_time(fn: Callable[[], Any], number: int, rounds: int) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(number):
            out = fn()
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times)


def speed(m: int, n: int, rounds: int) -> Iterator[tuple[str, float, float, str]]:
    rng = np.random.default_rng(2)
    a = jnp.asarray(rng.standard_normal((m, m), np.float32))
    b = jnp.asarray(rng.standard_normal((m, m), np.float32))
    matmul = jax.jit(lambda p, q: p @ q)
    for name, native in (
        ("bfloat16", jnp.bfloat16),
        ("float16", jnp.float16),
        ("float8_e4m3fn", jnp.float8_e4m3fn),
    ):
        ta = Tensor(a).to_reduced_precision(name)
        tb = Tensor(b).to_reduced_precision(name)
        na, nb = a.astype(native), b.astype(native)
        raw = jax.jit(lambda p, q: jax.lax.dot(p, q, preferred_element_type=jnp.float32))
        t_ours = _median_time(lambda: matmul(ta, tb), 10, rounds)  # noqa: B023
        t_raw = _median_time(lambda: raw(na, nb), 10, rounds)  # noqa: B023
        yield f"{m}^3 matmul, {name} Tensor vs raw dot", t_ours, t_raw, "raw JAX"
    ta = Tensor(a).to_reduced_precision("int8")
    tb = Tensor(b).to_reduced_precision("int8")
    ca, cb = ta.encoded.data, tb.encoded.data
    raw_int = jax.jit(lambda p, q: jax.lax.dot(p, q, preferred_element_type=jnp.int32))
    t_ours = _median_time(lambda: matmul(ta, tb), 10, rounds)
    t_raw = _median_time(lambda: raw_int(ca, cb), 10, rounds)
    yield f"{m}^3 matmul, int8 Tensor vs raw int8 dot", t_ours, t_raw, "raw JAX"

    x = jnp.asarray(rng.standard_normal(n, np.float32))
    bare = jax.jit(lambda v: v.astype(jnp.bfloat16))
    t_bare = _median_time(lambda: bare(x), 10, rounds)
    for fmt in (dtypes.bfloat16, dtypes.float16, dtypes.float8_e4m3fn, FP6, FP4):
        name = fmt.name
        t = _median_time(lambda: fmt.encode(x), 10, rounds)  # noqa: B023
        yield f"encode {n:,} values, {name}", t, t_bare, "astype(bf16)"
    key = jax.random.key(0)
    fmt = dtypes.bfloat16
    t = _median_time(lambda: fmt.encode(x, rounding="stochastic", key=key), 10, rounds)
    yield f"encode {n:,} values, bfloat16 stochastic", t, t_bare, "astype(bf16)"
    fmt = dtypes.int8
    t = _median_time(lambda: fmt.encode(x), 10, rounds)
    yield f"encode {n:,} values, int8 per-tensor", t, t_bare, "astype(bf16)"


def floors(m: int, rounds: int) -> Iterator[tuple[str, str, float, float]]:
    """(row, dots, time, bfloat16 GEMM time): the bare narrow GEMMs under part 4, their
    operands quantized beforehand, in both layouts of the right operand ((k, n) as a
    matmul has it, (n, k) with k minor, the layout cuBLASLt's fp8 GEMM takes), and
    result types; what a quantized contraction costs before any quantization."""
    rng = np.random.default_rng(4)
    a = jnp.asarray(rng.standard_normal((m, m), np.float32))
    b = jnp.asarray(rng.standard_normal((m, m), np.float32))
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    f32, bf16 = jnp.float32, jnp.bfloat16

    def dot(out: Any, rhs_nk: bool) -> Any:
        dims = (((1,), (1 if rhs_nk else 0,)), ((), ()))
        return jax.jit(lambda p, q: jax.lax.dot_general(p, q, dims, preferred_element_type=out))

    base = dot(f32, False)
    t_bf16 = _median_time(lambda: base(a16, b16), 10, rounds)
    for name, typ, out in (
        ("bf16 -> f32", bf16, f32),
        ("bf16 -> bf16", bf16, bf16),
        ("f8e4m3fn -> f32", jnp.float8_e4m3fn, f32),
        ("f8e4m3fn -> bf16", jnp.float8_e4m3fn, bf16),
        ("s8 -> s32", jnp.int8, jnp.int32),
    ):
        if typ == jnp.int8:
            p, q = (jnp.clip(jnp.round(v * 40), -127, 127).astype(typ) for v in (a, b))
        else:
            p, q = a.astype(typ), b.astype(typ)
        for rhs_nk in (False, True):
            fn = dot(out, rhs_nk)
            # square operands: the same array serves as (k, n) and as (n, k)
            hlo = fn.lower(p, q).compile().as_text()
            t = _median_time(lambda: fn(p, q), 10, rounds)  # noqa: B023
            layout = "rhs (n, k)" if rhs_nk else "rhs (k, n)"
            yield f"{name}, {layout}", _dot_types(hlo), t, t_bf16
    for label, fmt in (("int8", dtypes.int8), ("float8_e4m3fn", dtypes.float8_e4m3fn)):
        enc = jax.jit(lambda v: fmt.encode(v, scaling=dtypes.PerTensor()))  # noqa: B023
        t = _median_time(lambda: enc(a), 10, rounds)  # noqa: B023
        yield f"encode one ({m}, {m}) float32 operand, {label} per tensor", "", t, t_bf16


def quantized(
    m: int, rounds: int, hlo_dir: str | None = None
) -> Iterator[tuple[str, str, float, float, float, float]]:
    """(row, dots, relative error vs float32, time, float32 matmul time, bfloat16 matmul
    time) of jitted `apply(matmul, contract=...)` on (m, m) operands, quantization of
    every float32 operand included (the bfloat16 baseline's operands are cast already:
    the GEMM alone, as GEMM-level fp8 comparisons are made)."""
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((m, m), np.float32))
    b = jnp.asarray(rng.standard_normal((m, m), np.float32))
    f32 = jax.jit(lambda p, q: p @ q)
    bf16 = jax.jit(lambda p, q: jax.lax.dot(p, q, preferred_element_type=jnp.float32))
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    ref = np.asarray(f32(a, b), np.float64)
    t_f32 = _median_time(lambda: f32(a, b), 10, rounds)
    t_bf16 = _median_time(lambda: bf16(a16, b16), 10, rounds)
    w8 = Tensor(b).to_reduced_precision("int8", scaling=dtypes.PerAxis(1))
    f8 = Tensor(b).to_reduced_precision("float8_e4m3fn", scaling=dtypes.PerTensor())
    # the same codes held (n, k): no transpose before the GEMM (`layout="transposed"`)
    w8t = Tensor(b).to_reduced_precision("int8", scaling=dtypes.PerAxis(1), layout="transposed")
    f8t = Tensor(b).to_reduced_precision(
        "float8_e4m3fn", scaling=dtypes.PerTensor(), layout="transposed"
    )
    e4m3 = precision.Contract("float8_e4m3fn")
    cases = (
        ("W8A8, float32 operands", "int8", b),
        ("W8A8 dynamic, stored int8 weight", "int8", w8),
        ("W8A8 dynamic, stored int8 weight held transposed", "int8", w8t),
        ("fp8 e4m3 per tensor", e4m3, b),
        ("fp8 e4m3 per tensor, stored fp8 weight", e4m3, f8),
        ("fp8 e4m3 per tensor, stored fp8 weight held transposed", e4m3, f8t),
        ("fp8 e4m3 per row", precision.Contract("float8_e4m3fn", scaling="rowwise"), b),
        ("MXFP8 e4m3 blocks of 32", precision.Contract("float8_e4m3fn", scaling="mx"), b),
    )
    for label, contract, rhs in cases:
        fn = jax.jit(precision.apply(lambda p, q: p @ q, contract=contract))
        hlo = fn.lower(a, rhs).compile().as_text()
        if hlo_dir:
            _save_hlo(hlo_dir, "part4.hlo.txt", label, hlo)
        got = np.asarray(jnp.asarray(fn(a, rhs)), np.float64)
        rel = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        t = _median_time(lambda: fn(a, rhs), 10, rounds)  # noqa: B023
        yield label, _dot_types(hlo), rel, t, t_f32, t_bf16


def _save_hlo(folder: str, file: str, label: str, hlo: str) -> None:
    """Append one optimized program to a file of them (few files travel back easily)."""
    with open(f"{folder}/{file}", "a") as f:
        f.write(f"\n\n######## {label}\n{hlo}")


def encodes(n: int, rounds: int, hlo_dir: str | None = None) -> Iterator[tuple[str, float, float]]:
    """(row, time, astype(bfloat16) time): the encodes of part 3 whose target is not met,
    eager (as part 3 times them: value checks included) and inside `jit` (the kernel
    alone), with the number of kernels XLA launches for each."""
    x = jnp.asarray(np.random.default_rng(5).standard_normal(n, np.float32))
    bare = jax.jit(lambda v: v.astype(jnp.bfloat16))
    t_bare = _median_time(lambda: bare(x), 10, rounds)
    for label, fmt in (
        ("float4_e2m1fn", FP4),
        ("float6_e3m2fn", FP6),
        ("int8 per tensor", dtypes.int8),
        ("float8_e4m3fn", dtypes.float8_e4m3fn),
    ):
        jitted = jax.jit(fmt.encode)
        hlo = jitted.lower(x).compile().as_text()
        if hlo_dir:
            _save_hlo(hlo_dir, "encodes.hlo.txt", label, hlo)
        kernels = _hlo.kernels(hlo)
        t_eager = _median_time(lambda: fmt.encode(x), 10, rounds)  # noqa: B023
        yield f"encode {n:,} values, {label}, eager", t_eager, t_bare
        t_jit = _median_time(lambda: jitted(x), 10, rounds)  # noqa: B023
        yield f"encode {n:,} values, {label}, jitted ({kernels} kernels)", t_jit, t_bare


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e3:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer values, smaller matrices")
    parser.add_argument("--matrix", type=int, help="matrix size of the speed rows (8192)")
    parser.add_argument("--values", type=int, help="values of the encode rows (2**28)")
    parser.add_argument("--parts", default="123456", help="which sections to run (e.g. 34)")
    parser.add_argument("--hlo", help="write parts 4 and 6's optimized programs to this folder")
    args = parser.parse_args()
    n_bits, m, n, rounds = (20_000, 512, 2**20, 3) if args.quick else (1_000_000, 8192, 2**28, 7)
    m, n = args.matrix or m, args.values or n

    dev = jax.devices()[0]
    print(
        f"machine: jax {jax.__version__}, ml_dtypes {ml_dtypes.__version__}, "
        f"{dev.platform} ({dev.device_kind}), compared with the host CPU backend"
    )

    if "1" in args.parts:
        print("\n## 1. Bit-identity, accelerator vs host CPU (and ml_dtypes in nearest-even)\n")
        print("| format | rounding | values | result |\n|---|---|---:|---|")
        rows = bit_identity(n_bits)
        for label, rounding, size, verdict in rows:
            print(f"| {label} | {rounding} | {size:,} | {verdict} |")
        bad = [r for r in rows if "DIFFERENT" in r[3]]
        print(f"\n{len(rows) - len(bad)} of {len(rows)} cases identical")

    if "2" in args.parts:
        print("\n## 2. Contractions under jit\n")
        print("| format | dot in optimized HLO | max rel. error | = rounded float64 product |")
        print("|---|---|---:|---:|")
        for name, kinds, rel, equal in contractions(min(m, 1024)):
            print(f"| {name} | {kinds} | {rel:.2e} | {equal:.2%} |")

    if "3" in args.parts:
        print("\n## 3. Speed (medians of interleaved repeats)\n")
        print(
            "| measurement | precision | baseline | baseline is | ratio |\n|---|---:|---:|---|---:|"
        )
        for name, ours, base, what in speed(m, n, rounds):
            print(
                f"| {name} | {_fmt(ours)} | {_fmt(base)} | {what} | {ours / base:.2f} |", flush=True
            )

    if "4" in args.parts:
        print("\n## 4. Quantized contractions (apply(f, contract=...)), jitted\n")
        print(
            "| contract | dot in optimized HLO | max rel. error vs f32 | time | f32 | bf16 GEMM |"
        )
        print("|---|---|---:|---:|---:|---:|")
        for label, kinds, rel, t, t32, t16 in quantized(m, rounds, args.hlo):
            print(
                f"| {label} ({m}^3) | {kinds} | {rel:.2e} | {_fmt(t)} | {t / t32:.2f}x | "
                f"{t / t16:.2f}x |",
                flush=True,
            )

    if "5" in args.parts:
        print("\n## 5. The floor: bare narrow GEMMs, operands quantized beforehand\n")
        print("| GEMM | dot in optimized HLO | time | vs bf16 -> f32 GEMM |\n|---|---|---:|---:|")
        for label, kinds, t, t16 in floors(m, rounds):
            print(f"| {label} ({m}^3) | {kinds} | {_fmt(t)} | {t / t16:.2f}x |", flush=True)

    if "6" in args.parts:
        print("\n## 6. Encodes eager and jitted\n")
        print("| measurement | time | vs astype(bf16) |\n|---|---:|---:|")
        for label, t, t_bare in encodes(n, rounds, args.hlo):
            print(f"| {label} | {_fmt(t)} | {t / t_bare:.2f} |", flush=True)


if __name__ == "__main__":
    main()
