"""Every quantizing kernel against the plain `jnp` expression of its rule, jitted, one run.

Usage:
    python benchmarks/kernels.py              # 2**21 float32 values, 15 rounds
    python benchmarks/kernels.py --quick      # 2**20 values, 5 rounds (under a minute)
    python benchmarks/kernels.py --only int8  # the rows whose name contains "int8"
    python benchmarks/kernels.py --registry   # also every registry entry x scaling x mode

For each kernel the library's call (`ours`) and the plain expression of the same rule
(`plain`, what a user would write with `jnp` and `astype`) are compiled once, then
timed alternately, round by round, so both see the same machine load; the figure is
the median over rounds of `ours / plain` (each round takes the best of three calls of
each). `instr` counts the instructions of the compiled program (`compile().as_text()`,
fused computations included), the number `tests/test_kernel_budgets.py` holds each
kernel to. The plain expressions are the floor: they are what XLA makes of the rule
with none of the library's guarantees (correct rounding of the scale on every
backend, NaN and inf found in any group, subnormals the same on every backend, the
chosen rounding mode), and `ours` must stay within the row's target of them.

The same table, the machine and the command are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

import dtypes

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One row: the library's call and the plain expression of its rule, on the same
    arguments (`args(n)` makes them for about `n` float32 values)."""

    name: str
    ours: Callable[..., Any]
    plain: Callable[..., Any]
    target: float | None
    args: Callable[[int], tuple[Any, ...]]


def _values(n: int, cols: int = 1024) -> tuple[jax.Array]:
    rows = max(n // cols, 1)
    return (jax.random.normal(jax.random.key(0), (rows, cols), F32),)


def _values_key(n: int) -> tuple[jax.Array, jax.Array]:
    return (*_values(n), jax.random.key(1))


def _matrices(n: int) -> tuple[Any, ...]:
    """Two square operands with about n elements each (the dot's own time dominates
    above a few hundred rows, so the rounding is measured at (256, k) x (k, 256))."""
    k = 256
    a = jax.random.normal(jax.random.key(2), (256, k), F32)
    b = jax.random.normal(jax.random.key(3), (k, 256), F32)
    return a, b


# ---- plain expressions --------------------------------------------------------------


def _absmax(x: jax.Array, axis: Any) -> jax.Array:
    return jnp.max(jnp.abs(x), axis=axis, keepdims=True)


def _blocks(x: jax.Array, size: int) -> jax.Array:
    return x.reshape(*x.shape[:-1], x.shape[-1] // size, size)


def _plain_int(q: int, axis: Any, block: int | None = None) -> Callable[[jax.Array], Any]:
    """clip(round(x / (absmax / q)), -q, q) per group, packed below 8 bits."""

    def f(x: jax.Array) -> Any:
        shape = x.shape
        if block is not None:
            x = _blocks(x, block)
        s = _absmax(x, -1 if block is not None else axis) / q
        codes = jnp.clip(jnp.round(x / s), -q, q).astype(jnp.int8).reshape(shape)
        return _pack(codes, {127: 8, 7: 4, 1: 2}[q]), s

    return f


def _pack(codes: jax.Array, bits: int) -> jax.Array:
    """Codes of `bits` bits packed along the last axis, the first in the low bits."""
    if bits == 8:
        return codes
    per = 8 // bits
    u = (codes.astype(jnp.uint8) & jnp.uint8((1 << bits) - 1)).reshape(
        *codes.shape[:-1], codes.shape[-1] // per, per
    )
    shifts = jnp.arange(per, dtype=jnp.uint8) * jnp.uint8(bits)
    return jnp.bitwise_or.reduce(u << shifts, axis=-1)


def _plain_scaled_float(dtype: Any, top: float, axis: Any) -> Callable[[jax.Array], Any]:
    """(x / (absmax / top)).astype(fp8), per tensor or per row."""

    def f(x: jax.Array) -> Any:
        s = _absmax(x, axis) / top
        return (x / s).astype(dtype), s

    return f


def _plain_mx(dtype: Any, emax: int, bits: int | None = None) -> Callable[[jax.Array], Any]:
    """OCP MX: per block of 32, scale 2**(floor(log2 absmax) - emax), elements astype."""

    def f(x: jax.Array) -> Any:
        b = _blocks(x, 32)
        e = jnp.floor(jnp.log2(_absmax(b, -1))) - emax
        scale = jnp.exp2(e)
        codes = (b / scale).astype(dtype).reshape(x.shape)
        if bits is not None:
            codes = _pack(lax_bits(codes, bits), bits)
        return codes, (e + 127).astype(jnp.uint8)

    return f


def lax_bits(codes: jax.Array, bits: int) -> jax.Array:
    """The bit patterns of 4-bit float codes, one per byte."""
    assert bits == 4
    return jax.lax.bitcast_convert_type(codes, jnp.uint4).astype(jnp.uint8)


def _plain_nvfp4(x: jax.Array) -> Any:
    """NVFP4: a float32 tensor scale, e4m3 scales per 16, e2m1 elements."""
    g = (448.0 * 6.0) / jnp.max(jnp.abs(x))
    b = _blocks(x, 16)
    s = (_absmax(b, -1) / 6.0 * g).astype(jnp.float8_e4m3fn)
    codes = (b * (g / s.astype(F32))).astype(jnp.float4_e2m1fn).reshape(x.shape)
    return _pack(lax_bits(codes, 4), 4), s, 1 / g


_NF4 = np.array(dtypes.get("nf4").values, np.float32)


def _plain_nf4(x: jax.Array) -> Any:
    """NF4: absmax per block of 64, the nearest of 16 code values (midpoint search)."""
    b = _blocks(x, 64)
    s = _absmax(b, -1)
    mid = jnp.asarray((_NF4[1:] + _NF4[:-1]) / 2)
    codes = jnp.searchsorted(mid, (b / s).reshape(-1)).astype(jnp.uint8).reshape(x.shape)
    return _pack(codes, 4), s


def _plain_uint(levels: int, block: int | None) -> Callable[[jax.Array], Any]:
    """Asymmetric: scale (max - min) / levels, zero point round(-min / scale)."""

    def f(x: jax.Array) -> Any:
        b = _blocks(x, block) if block else x.reshape(1, -1)
        lo = jnp.minimum(jnp.min(b, axis=-1, keepdims=True), 0)
        hi = jnp.maximum(jnp.max(b, axis=-1, keepdims=True), 0)
        s = (hi - lo) / levels
        z = jnp.round(-lo / s)
        codes = jnp.clip(jnp.round(b / s) + z, 0, levels).astype(jnp.uint8).reshape(x.shape)
        return _pack(codes, 8 if levels == 255 else 4), s, z

    return f


def _round_trip(dtype: Any) -> Callable[[jax.Array], jax.Array]:
    """x.astype(narrow).astype(float32), kept apart by an optimization barrier so that
    XLA cannot delete the round trip (it may, where excess precision is allowed)."""
    return lambda x: jax.lax.optimization_barrier(x.astype(dtype)).astype(F32)


def _stochastic_int8(x: jax.Array, key: jax.Array) -> Any:
    """int8 per tensor with stochastic rounding: floor(x / s + uniform)."""
    s = _absmax(x, None) / 127
    u = jax.random.uniform(key, x.shape, F32)
    return jnp.clip(jnp.floor(x / s + u), -127, 127).astype(jnp.int8), s


def _stochastic_bf16(x: jax.Array, key: jax.Array) -> jax.Array:
    """bfloat16 with stochastic rounding: add 16 random low bits, truncate."""
    bits = jax.random.bits(key, x.shape, jnp.uint32) >> 16
    u = jax.lax.bitcast_convert_type(x, jnp.uint32) + bits
    return jax.lax.bitcast_convert_type(u & jnp.uint32(0xFFFF0000), F32)


# ---- the library's calls ------------------------------------------------------------


def _encode(name: str, scaling: Any = None, rounding: str = "nearest_even"):
    fmt = dtypes.get(name)
    if rounding == "stochastic":
        return lambda x, key: fmt.encode(x, scaling=scaling, rounding=rounding, key=key)
    return lambda x: fmt.encode(x, scaling=scaling, rounding=rounding)


def _round(name: str, scaling: Any = None, rounding: str = "nearest_even"):
    fmt = dtypes.get(name)
    if rounding == "stochastic":
        return lambda x, key: fmt.round(x, scaling=scaling, rounding=rounding, key=key)
    return lambda x: fmt.round(x, scaling=scaling, rounding=rounding)


def _group_absmax(scaling: Any) -> Callable[[jax.Array], jax.Array]:
    from dtypes._per_group import group_absmax

    return lambda x: group_absmax(x, scaling)


def _tensor_matmul(
    name: str, *, native: bool = True
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """`Tensor @ Tensor` in `name`, and the plain expression: the operands cast, the dot
    summed in float32, the result cast. With `native=False` (bfloat16 on a CPU) the plain
    dot takes the operands as float32 values on the bfloat16 grid, as the library's CPU
    path does, so the row measures the rounding around the dot rather than two unlike
    dots: XLA:CPU gives a bfloat16 dot to the processor's BF16 instructions where it has
    them, whose sums are the processor's (`PRECISION_CPU_BF16_DOTS=1` lets the library
    take it too)."""
    import precision

    fmt = dtypes.get(name)

    def ours(a: jax.Array, b: jax.Array) -> Any:
        ta = precision.Tensor(a).to_reduced_precision(fmt)
        tb = precision.Tensor(b).to_reduced_precision(fmt)
        return (ta @ tb).encoded.data

    def plain(a: jax.Array, b: jax.Array) -> Any:
        c = fmt.container
        if native:
            out = jnp.dot(a.astype(c), b.astype(c), preferred_element_type=F32)
        else:  # (reduce_precision: a convert round trip XLA could remove)
            on_grid = lambda v: lax.reduce_precision(v, exponent_bits=8, mantissa_bits=7)
            out = jnp.dot(on_grid(a), on_grid(b), preferred_element_type=F32)
        return out.astype(c)

    return ours, plain


def _activation(name: str, scaling: str) -> Callable[[jax.Array], Any]:
    """The activation operand's quantization under `apply(contract=...)`."""
    from precision._compute import _operand_layouts, _quantized

    fmt = dtypes.get(name)
    layout = _operand_layouts.Layout((0, 0), (0,), (1,))

    def f(x: jax.Array) -> Any:
        return _quantized.quantize(x, dataclasses.replace(layout, shape=x.shape), fmt, scaling)

    return f


def kernels() -> list[Kernel]:
    """The rows of the table, in order; targets from issue 35's acceptance."""
    T, R, B = dtypes.PerTensor(), dtypes.PerAxis(0), dtypes.PerBlock(32)
    rows: list[Kernel] = []
    for name, dt in (
        ("bfloat16", jnp.bfloat16),
        ("float16", jnp.float16),
        ("float8_e4m3fn", jnp.float8_e4m3fn),
        ("float8_e5m2", jnp.float8_e5m2),
    ):
        rows.append(Kernel(f"{name} encode", _encode(name), lambda x, d=dt: x.astype(d),
                           1.2, _values))  # fmt: skip
        rows.append(Kernel(f"{name} round", _round(name), _round_trip(dt), 1.2, _values))
    tf32 = lambda x: jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)
    rows.append(Kernel("tf32 encode", _encode("tf32"), tf32, 1.2, _values))
    rows.append(Kernel("tf32 round", _round("tf32"), tf32, 1.2, _values))
    for name, q in (("int8", 127), ("int4", 7), ("int2", 1)):
        for label, scaling, axis, block in (
            ("per tensor", T, None, None),
            ("per row", R, -1, None),
            ("per block 32", B, None, 32),
        ):
            plain = _plain_int(q, axis, block)
            rows.append(Kernel(f"{name} {label} encode", _encode(name, scaling), plain, 1.2,
                               _values))  # fmt: skip
            rows.append(Kernel(f"{name} {label} round", _round(name, scaling),
                               _plain_round_int(q, axis, block), 1.2, _values))  # fmt: skip
    for name, dt, top in (("float8_e4m3fn", jnp.float8_e4m3fn, 448.0),
                          ("float8_e5m2", jnp.float8_e5m2, 57344.0)):  # fmt: skip
        for label, scaling, axis in (("per tensor", T, None), ("per row", R, -1)):
            rows.append(Kernel(f"{name} {label} encode", _encode(name, scaling),
                               _plain_scaled_float(dt, top, axis), 1.2, _values))  # fmt: skip
    rows.append(Kernel("contract int8 rowwise (activation)", _activation("int8", "rowwise"),
                       _plain_int(127, -1), 1.2, _values))  # fmt: skip
    for label, axis in (("tensorwise", None), ("rowwise", -1)):
        rows.append(Kernel(f"contract e4m3 {label} (activation)",
                           _activation("float8_e4m3fn", label),
                           _plain_scaled_float(jnp.float8_e4m3fn, 448.0, axis), 1.2,
                           _values))  # fmt: skip
    ours, plain = _tensor_matmul("bfloat16", native=False)
    rows.append(Kernel("Tensor @ Tensor bfloat16 (result rounding)", ours, plain, 1.2,
                       _matrices))  # fmt: skip
    ours, plain = _tensor_matmul("float16")
    rows.append(Kernel("Tensor @ Tensor float16 (result rounding)", ours, plain, 1.2,
                       _matrices))  # fmt: skip
    # (no target: the float32 sums of the library's CPU path against the processor's
    # bfloat16 dot, a choice of numerics, not of rounding)
    ours, plain = _tensor_matmul("bfloat16")
    rows.append(Kernel("Tensor @ Tensor bfloat16 (vs the native bf16 dot)", ours, plain, None,
                       _matrices))  # fmt: skip
    rows += [
        Kernel("mxfp8_e4m3 encode", _encode("mxfp8_e4m3"), _plain_mx(jnp.float8_e4m3fn, 8),
               1.5, _values),
        Kernel("mxfp4 encode", _encode("mxfp4"), _plain_mx(jnp.float4_e2m1fn, 2, 4), 1.5,
               _values),
        Kernel("nvfp4 encode", _encode("nvfp4"), _plain_nvfp4, 1.5, _values),
        Kernel("nf4 encode", _encode("nf4"), _plain_nf4, 1.5, _values),
        Kernel("uint8 per tensor encode", _encode("uint8"), _plain_uint(255, None), 1.5,
               _values),
        Kernel("uint4 per block 32 encode", _encode("uint4", B), _plain_uint(15, 32), 1.5,
               _values),
        Kernel("float6_e2m3fn per block 32 encode", _encode("float6_e2m3fn", B),
               _plain_scaled_block(jnp.float6_e2m3fn, 7.5, 6), 1.5, _values),
        Kernel("float4_e2m1fn per block 32 encode", _encode("float4_e2m1fn", B),
               _plain_scaled_block(jnp.float4_e2m1fn, 6.0, 4), 1.5, _values),
        Kernel("int8 per tensor stochastic encode", _encode("int8", T, "stochastic"),
               _stochastic_int8, 1.2, _values_key),
        Kernel("bfloat16 stochastic round", _round("bfloat16", None, "stochastic"),
               _stochastic_bf16, 1.2, _values_key),
        # the integer and fp8 rows' absmax alone (NaN found in the same pass): a part
        Kernel("absmax per tensor (part)", _group_absmax(T), lambda x: _absmax(x, None), None,
               _values),
        Kernel("absmax per row (part)", _group_absmax(R), lambda x: _absmax(x, -1), None,
               _values),
    ]  # fmt: skip
    return rows


def _plain_round_int(q: int, axis: Any, block: int | None) -> Callable[[jax.Array], Any]:
    """The int rule's quantize-dequantize: codes times the group's scale, as float32."""

    def f(x: jax.Array) -> jax.Array:
        b = _blocks(x, block) if block is not None else x
        s = _absmax(b, -1 if block is not None else axis) / q
        return (jnp.clip(jnp.round(b / s), -q, q) * s).reshape(x.shape)

    return f


def _plain_scaled_block(dtype: Any, top: float, bits: int) -> Callable[[jax.Array], Any]:
    """A sub-byte float per block of 32 with float32 absmax scales, packed."""

    def f(x: jax.Array) -> Any:
        b = _blocks(x, 32)
        s = _absmax(b, -1) / top
        if bits == 4:
            codes = (b / s).astype(dtype).reshape(x.shape)
            return _pack(lax_bits(codes, 4), 4), s
        # XLA:CPU has no convert to float6 (an F6E2M3FN program does not compile there):
        # the grid by reduce_precision, kept one value a byte in a float8 container that
        # holds every e2m3 value (JAX has no 6-bit integer to pack fp6 codes through)
        grid = jax.lax.reduce_precision(b / s, exponent_bits=2, mantissa_bits=3)
        return grid.astype(jnp.float8_e4m3fn).reshape(x.shape), s

    return f


# ---- measuring ----------------------------------------------------------------------

_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%\S+\s*=\s")


def instructions(fn: Callable[..., Any], *args: Any) -> int:
    """Instructions of the compiled program of `jit(fn)(*args)`, fused computations
    included (what XLA emits, not what the Python traced)."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    return sum(1 for line in text.splitlines() if _INSTRUCTION.match(line))


CLOCK = time.perf_counter


def _best(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    best = float("inf")
    for _ in range(calls):
        start = CLOCK()
        jax.block_until_ready(fn(*args))
        best = min(best, CLOCK() - start)
    return best


def ratio(ours: Callable[..., Any], plain: Callable[..., Any], args: tuple[Any, ...],
          rounds: int) -> tuple[float, float, float]:  # fmt: skip
    """(median of ours / plain over interleaved rounds, ours' best ms, plain's best ms)."""
    fo, fp = jax.jit(ours), jax.jit(plain)
    jax.block_until_ready(fo(*args))
    jax.block_until_ready(fp(*args))
    ratios, best_o, best_p = [], float("inf"), float("inf")
    for r in range(rounds):
        pair = (fo, fp) if r % 2 == 0 else (fp, fo)
        t = {id(f): _best(f, args, 3) for f in pair}
        to, tp = t[id(fo)], t[id(fp)]
        ratios.append(to / tp)
        best_o, best_p = min(best_o, to), min(best_p, tp)
    return statistics.median(ratios), best_o * 1e3, best_p * 1e3


def machine() -> str:
    cpu = platform.processor() or "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; python "
        f"{platform.python_version()}, jax {jax.__version__} ({jax.default_backend()}), "
        f"ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}"
    )


def _registry_rows(n: int, rounds: int) -> list[tuple[str, float, int]]:
    """Every registry entry under each scaling it takes and each rounding mode, against
    the plain int8 per-tensor rule (or `astype` for an unscaled native float)."""
    (x,) = _values(n)
    key = jax.random.key(1)
    scalings: list[Any] = [None, dtypes.PerTensor(), dtypes.PerAxis(0), dtypes.PerBlock(32),
                           dtypes.PerBlock(32, power_of_two=True, scale_format="float8_e8m0fnu"),
                           dtypes.PerAxis(0, scale_format="bfloat16"),
                           dtypes.PerBlock(32, scale_format="float16")]  # fmt: skip
    modes = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic")
    base = _plain_int(127, None)
    out = []
    for name, fmt in dtypes.REGISTRY.items():
        if name == "float64":
            continue
        for scaling in scalings:
            for mode in modes:
                k = key if mode == "stochastic" else None

                def ours(x: jax.Array, fmt: Any = fmt, s: Any = scaling, m: str = mode,
                         k: Any = k) -> Any:  # fmt: skip
                    return fmt.encode(x, scaling=s, rounding=m, key=k)

                try:
                    jax.eval_shape(ours, x)
                except Exception:  # a combination the format refuses
                    continue
                r, _, _ = ratio(ours, base, (x,), rounds)
                label = f"{name} [{scaling if scaling is not None else 'default'}] {mode}"
                out.append((label, r, instructions(ours, x)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2**20 values, 5 rounds")
    parser.add_argument("--size", type=int, default=None, help="float32 values per input")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--only", default="", help="rows whose name contains this")
    parser.add_argument("--registry", action="store_true",
                        help="also every registry entry x scaling x rounding mode")  # fmt: skip
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the process's CPU time, not the wall clock: steadier on a "
                             "busy machine, blind to idle threads")  # fmt: skip
    args = parser.parse_args(argv)
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    n = args.size or (2**20 if args.quick else 2**21)
    rounds = args.rounds or (5 if args.quick else 15)
    print(f"# {machine()}")
    print(f"# {n} float32 values per input, {rounds} interleaved rounds; ratio = median of "
          "ours / plain")  # fmt: skip
    print("| kernel | ours ms | plain ms | ours / plain | target | met | instr (ours / plain) |")
    print("|---|---:|---:|---:|---:|---|---:|")
    missed = 0
    for k in kernels():
        if args.only not in k.name:
            continue
        a = k.args(n)
        r, to, tp = ratio(k.ours, k.plain, a, rounds)
        met = "" if k.target is None else ("yes" if r <= k.target else "NO")
        missed += met == "NO"
        io, ip = instructions(k.ours, *a), instructions(k.plain, *a)
        target = "" if k.target is None else f"≤ {k.target}"
        print(f"| {k.name} | {to:.2f} | {tp:.2f} | {r:.2f} | {target} | {met} | {io} / {ip} |",
              flush=True)  # fmt: skip
    if args.registry:
        print("\n| registry entry [scaling] mode | × plain int8 per tensor | instr |")
        print("|---|---:|---:|")
        for label, r, io in _registry_rows(n, max(rounds // 3, 3)):
            print(f"| {label} | {r:.2f} | {io} |", flush=True)
    print(f"# {missed} row(s) above target; load at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
