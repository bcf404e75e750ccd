"""Predicted time of a compiled program: a roofline over its contractions.

A dot or convolution takes `max(flops / rate, bytes / bandwidth)`; the rest
of the program (XLA's cost analysis, less the dots' own) takes its bytes at
the memory bandwidth or its operations at the elementwise rate, whichever
is slower — decoding int4 or quantizing activations is work, not only
bytes; every operation the program launches (a fusion, a dot) costs a fixed
time however small, and a call a fixed dispatch. The
rate depends on the operands' types (an `s8 x s8` dot runs at the device's
int8 rate, `bf16 x bf16` at its bf16 rate).

Rates of known accelerators come from their datasheets (dense rates, no
sparsity). A CPU or an unknown device is measured once per process
(`explain(..., measure=True)`): dispatch, memory bandwidth, and for each
operand type met, a small grid of products — on CPUs a thin product, or one
whose large operand outgrows the caches, runs far below the square one's
rate. A product's rate is read from that grid by its thin side
(`min(m, n)`) and the size of its larger operand (`k * max(m, n)`),
interpolated in log-log; a convolution's by its output features, from
three timed 3x3 convolutions.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._hlo import Dot, kernels

__all__ = ["Grid", "Rates", "cost", "rates", "type_key"]

#: Operand type keys, narrowest first; a pair of operands runs at its wider one's rate.
_ORDER = ("s4", "s8", "f8", "f16", "bf16", "f32", "f64")


def type_key(operand_types: Iterable[str]) -> str:
    """The rate a dot's operands run at: `s8`, `f8`, `bf16`, `f32`, ... (the wider)."""
    keys = []
    for t in operand_types:
        if t.startswith("f8"):
            keys.append("f8")
        elif t in ("s4", "u4", "s2", "u2"):
            keys.append("s4")
        elif t in ("s8", "u8"):
            keys.append("s8")
        elif t in _ORDER:
            keys.append(t)
        else:
            keys.append("f32")
    return max(keys, key=_ORDER.index) if keys else "f32"


#: The grid a measurement times: thin sides, larger operands' sizes (elements),
#: and a convolution's channels.
_THIN = (1, 16, 128, 1024)
_LARGE = (1 << 16, 1 << 20, 1 << 24)
_CHANNELS = (16, 64, 256)
_MOST_FLOPS = 1 << 32  # larger probes are left out: their rate is extrapolated
Grid = dict[tuple[int, int], float]


@dataclasses.dataclass
class Rates:
    """How fast a device contracts and moves bytes.

    Attributes:
        device: the device kind, as JAX names it.
        source: where the figures come from (a datasheet, or this machine).
        peak: FLOP/s per operand type key (`type_key`); a key missing here runs
            at the next wider key's rate.
        bandwidth: memory bytes read per second.
        write_bandwidth: bytes written per second to fresh memory (a program's
            results, allocated anew each call); None: the same as `bandwidth`.
        elementwise: operations per second outside the dots (XLA's count: one
            per element per operation), on data the caches hold; streaming is
            the bandwidth's part.
        per_dot: seconds each dot or convolution costs however small.
        per_kernel: seconds every other launched operation (a fusion, a sort)
            costs however small.
        per_call: seconds each call of a compiled program costs.
        probe: times the grid of one operand type, for dots or convolutions
            (measured rates only); its answers are kept in `grids`.
    """

    device: str
    source: str
    peak: Mapping[str, float]
    bandwidth: float
    elementwise: float
    per_dot: float
    per_kernel: float
    per_call: float
    probe: Callable[[str, bool], Grid] | None = None
    write_bandwidth: float | None = None
    grids: dict[tuple[str, bool], Grid] = dataclasses.field(default_factory=dict)

    def rate(self, dot: Dot) -> float:
        """FLOP/s of `dot`: its operand type's peak, or read from the measured grid."""
        key = type_key(dot.operand_types)
        if self.probe is None:
            for wider in _ORDER[_ORDER.index(key) :]:
                if wider in self.peak:
                    return self.peak[wider]
            return self.peak["f32"]
        if (key, dot.convolution) not in self.grids:
            self.grids[key, dot.convolution] = self.probe(key, dot.convolution)
        grid = self.grids[key, dot.convolution]
        if dot.convolution:
            return _interpolate(grid, max(dot.n, 1), 1)
        return _interpolate(grid, max(1, min(dot.m, dot.n)), max(1, dot.k * max(dot.m, dot.n)))

    def dot_seconds(self, dot: Dot) -> float:
        """A dot's time: its compute or its bytes, whichever is slower, and its fixed cost."""
        memory = dot.bytes / self.bandwidth
        if dot.flops == 0:
            return self.per_dot + memory
        return self.per_dot + max(dot.flops / self.rate(dot), memory)

    def program_seconds(
        self, dots: Iterable[Dot], cost: Mapping[str, float], kernels: int = 0, outputs: int = 0
    ) -> float:
        """A call of a whole program: dispatch, its dots, the rest of its work.

        `cost` is XLA's cost analysis of the program (`flops`, `bytes accessed`);
        `kernels` the operations it launches, its dots among them; `outputs` the
        bytes of its results, written to fresh memory.
        """
        dots = list(dots)
        rest_bytes = max(0.0, cost.get("bytes accessed", 0.0) - sum(d.bytes for d in dots))
        rest_ops = max(0.0, cost.get("flops", 0.0) - sum(d.flops for d in dots))
        rest = max(rest_bytes / self.bandwidth, rest_ops / self.elementwise)
        launches = max(0, kernels - len(dots)) * self.per_kernel
        fresh = outputs / (self.write_bandwidth or self.bandwidth) - outputs / self.bandwidth
        return self.per_call + sum(self.dot_seconds(d) for d in dots) + rest + launches + fresh

    def describe(self) -> str:
        return f"{self.device} ({self.source})"


def _interpolate(grid: Grid, thin: int, large: int) -> float:
    """The rate at (thin, large): bilinear in log-log between the grid's points,
    held at its edges."""
    xs = sorted({x for x, _ in grid})
    ys = sorted({y for _, y in grid})

    def bracket(points: list[int], v: int) -> tuple[int, int, float]:
        if v <= points[0]:
            return points[0], points[0], 0.0
        for lo, hi in itertools.pairwise(points):
            if v <= hi:
                return lo, hi, math.log(v / lo) / math.log(hi / lo)
        return points[-1], points[-1], 0.0

    x0, x1, tx = bracket(xs, thin)
    y0, y1, ty = bracket(ys, large)
    logs = {p: math.log(grid[p]) for p in ((x0, y0), (x0, y1), (x1, y0), (x1, y1))}
    low = logs[x0, y0] + tx * (logs[x1, y0] - logs[x0, y0])
    high = logs[x0, y1] + tx * (logs[x1, y1] - logs[x0, y1])
    return math.exp(low + ty * (high - low))


# Datasheet peaks, dense (no structured sparsity), per operand type; float32
# products run as JAX runs them by default: TF32 on NVIDIA tensor cores, one
# bfloat16 pass on TPUs. per_kernel and per_call are typical launch and dispatch
# costs, not datasheet figures: a GPU's per_call is what a jitted call of a tiny
# program took on an H100 with jax 0.11.2, dispatch and synchronisation (65-75 us;
# benchmarks/explain.py there, 2026-11-27); `measure=True` times it on the device.
_T = 1e12
# elementwise: the float32 vector rate (NVIDIA: CUDA cores; TPUs: assumed a
# sixteenth of the bfloat16 matrix rate).
_GPU_COSTS = {"per_dot": 3e-6, "per_kernel": 3e-6, "per_call": 6.5e-5}
_TPU_COSTS = {"per_dot": 1e-6, "per_kernel": 1e-6, "per_call": 3e-5}
_HOPPER = {"s8": 1979 * _T, "f8": 1979 * _T, "bf16": 989 * _T, "f16": 989 * _T, "f32": 494 * _T}
_AMPERE = {"s8": 624 * _T, "bf16": 312 * _T, "f16": 312 * _T, "f32": 156 * _T}
_Entry = tuple[tuple[str, ...], str, dict[str, float], float, float, dict[str, float]]
_KNOWN: tuple[_Entry, ...] = (
    # NVIDIA H100 Tensor Core GPU datasheet: SXM5 / PCIe / NVL columns
    (("H100 PCIe",), "NVIDIA H100 PCIe datasheet",
     {"s8": 1513 * _T, "f8": 1513 * _T, "bf16": 756 * _T, "f16": 756 * _T, "f32": 378 * _T},
     2.0e12, 51 * _T, _GPU_COSTS),
    (("H100 NVL",), "NVIDIA H100 NVL datasheet",
     {"s8": 1671 * _T, "f8": 1671 * _T, "bf16": 835 * _T, "f16": 835 * _T, "f32": 418 * _T},
     3.9e12, 60 * _T, _GPU_COSTS),
    (("H100",), "NVIDIA H100 SXM5 datasheet", _HOPPER, 3.35e12, 67 * _T, _GPU_COSTS),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): H100 SXM5 rates, 4.8 TB/s HBM3e
    (("H200",), "NVIDIA H200 SXM datasheet", _HOPPER, 4.8e12, 67 * _T, _GPU_COSTS),
    # NVIDIA A100 Tensor Core GPU datasheet (no fp8: XLA widens fp8 operands)
    (("A100-SXM4-40GB", "A100-PCIE-40GB"), "NVIDIA A100 40GB datasheet", _AMPERE,
     1.555e12, 19.5 * _T, _GPU_COSTS),
    (("A100",), "NVIDIA A100 80GB datasheet", _AMPERE, 2.039e12, 19.5 * _T, _GPU_COSTS),
    # Google Cloud TPU system architecture pages (peak per chip, HBM bandwidth)
    (("TPU v6",), "Cloud TPU v6e (Trillium) specifications",
     {"s8": 1836 * _T, "bf16": 918 * _T, "f32": 918 * _T}, 1.64e12, 918 / 16 * _T, _TPU_COSTS),
    (("TPU v5 lite", "TPU v5e"), "Cloud TPU v5e specifications",
     {"s8": 394 * _T, "bf16": 197 * _T, "f32": 197 * _T}, 0.819e12, 197 / 16 * _T, _TPU_COSTS),
    (("TPU v5",), "Cloud TPU v5p specifications",
     {"s8": 918 * _T, "bf16": 459 * _T, "f32": 459 * _T}, 2.765e12, 459 / 16 * _T, _TPU_COSTS),
    (("TPU v4",), "Cloud TPU v4 specifications",
     {"s8": 275 * _T, "bf16": 275 * _T, "f32": 275 * _T}, 1.2e12, 275 / 16 * _T, _TPU_COSTS),
)  # fmt: skip

_MEASURED: dict[str, Rates] = {}
_PER_CALL: dict[str, float] = {}  # a known device's dispatch, timed once per process


def rates(device: Any, measure: bool) -> Rates | None:
    """The rates of `device`: from the datasheet table when known, else measured
    once per process (when `measure` is true, or an earlier call measured)."""
    kind = str(getattr(device, "device_kind", device))
    for names, source, peak, bandwidth, elementwise, costs in _KNOWN:
        if any(name in kind for name in names):
            per_call = costs["per_call"]
            if measure or kind in _PER_CALL:
                if kind not in _PER_CALL:
                    _PER_CALL[kind] = _per_call(device)
                per_call = _PER_CALL[kind]
                source += "; dispatch measured on this machine"
            return Rates(
                kind,
                f"datasheet: {source}",
                peak,
                bandwidth,
                elementwise,
                costs["per_dot"],
                costs["per_kernel"],
                per_call,
            )
    if not measure and kind not in _MEASURED:
        return None
    if kind not in _MEASURED:
        _MEASURED[kind] = _measure(device, kind)
    return _MEASURED[kind]


def _best_seconds(fn: Callable[..., Any], *args: Any, budget: float = 0.15) -> float:
    """The fastest of repeated calls of a compiled `fn`, after one warm-up."""
    import jax

    jax.block_until_ready(fn(*args))
    best, spent, runs = math.inf, 0.0, 0
    while runs < 3 or (spent < budget and runs < 200):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        took = time.perf_counter() - start
        best, spent, runs = min(best, took), spent + took, runs + 1
    return best


def _per_call(device: Any) -> float:
    """Seconds a jitted call of a tiny program takes on `device`, waited for."""
    import jax
    import jax.numpy as jnp

    tiny = jnp.ones((4,), jnp.float32)
    if hasattr(device, "platform"):
        tiny = jax.device_put(tiny, device)
    return _best_seconds(jax.jit(lambda a: a + 1), tiny)


def _measure(device: Any, kind: str) -> Rates:
    """Dispatch, bandwidth and per-dot cost of `device`, timed now; rates on demand."""
    import jax
    import jax.numpy as jnp

    def put(x: Any) -> Any:
        return jax.device_put(x, device) if hasattr(device, "platform") else x

    tiny = put(jnp.ones((4,), jnp.float32))
    per_call = _per_call(device)
    big = put(jnp.ones((1 << 24,), jnp.float32))  # 64 MiB, read once
    bandwidth = big.nbytes / max(_best_seconds(jax.jit(jnp.sum), big) - per_call, 1e-9)
    copied = _best_seconds(jax.jit(lambda a: a * 2.0), big) - per_call  # reads, then writes
    write_bandwidth = big.nbytes / max(copied - big.nbytes / bandwidth, 1e-9)
    small = put(jnp.ones((8, 8), jnp.float32))
    per_dot = max(_best_seconds(jax.jit(jnp.dot), small, small) - per_call, 0.0)
    chain = jax.jit(_launches).lower(tiny).compile()
    launched = max(kernels(chain.as_text() or ""), 1)
    per_kernel = max(_best_seconds(chain, tiny) - per_call, 0.0) / launched
    cached = put(jnp.ones((1 << 18,), jnp.float32))  # 1 MiB: the work, not the memory
    work = jax.jit(_elementwise_work).lower(cached).compile()
    took = max(_best_seconds(work, cached) - per_call, 1e-9)
    elementwise = cost(work).get("flops", 0.0) / took

    probe = functools.partial(_probe, put, per_call, per_dot)
    return Rates(
        kind,
        "measured on this machine",
        {},
        bandwidth,
        elementwise,
        per_dot,
        per_kernel,
        per_call,
        probe,
        write_bandwidth,
    )


def _probe(
    put: Callable[[Any], Any], per_call: float, per_dot: float, key: str, convolution: bool
) -> Grid:
    """The rates of operand type `key`'s dots (or convolutions) over the probe grid, timed
    on the device `put` places arrays on, less a call's and a dot's fixed cost."""
    import jax.numpy as jnp

    dtype, out = _probe_types().get(key, (jnp.float32, jnp.float32))

    def timed_rate(fn: Callable[..., Any], flops: int, *args: Any) -> float:
        return flops / max(_best_seconds(fn, *args) - per_call - per_dot, 1e-9)

    if convolution:
        return _convolution_grid(timed_rate, put, dtype, out)
    return _dot_grid(timed_rate, put, dtype, out)


def _convolution_grid(
    timed_rate: Callable[..., float], put: Callable[[Any], Any], dtype: Any, out: Any
) -> Grid:
    """Rates of 3x3 convolutions of `dtype` images, one per channel count."""
    import jax
    import jax.numpy as jnp

    conv = jax.jit(
        lambda a, b: jax.lax.conv_general_dilated(
            a, b, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
            preferred_element_type=out,
        )
    )  # fmt: skip
    grid: Grid = {}
    for c in _CHANNELS:
        image, kernel = jnp.ones((8, 16, 16, c), dtype), jnp.ones((3, 3, c, c), dtype)
        flops = 2 * 8 * 16 * 16 * c * 9 * c
        grid[c, 1] = timed_rate(conv, flops, put(image), put(kernel))
    return grid


def _dot_grid(
    timed_rate: Callable[..., float], put: Callable[[Any], Any], dtype: Any, out: Any
) -> Grid:
    """Rates of `dtype` dots of a thin by a large operand, timed where the product is
    small enough, and extrapolated from the thinner side's trend where it is not."""
    import jax
    import jax.numpy as jnp

    dot = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=out))
    grid: Grid = {}
    for large in _LARGE:
        side = math.isqrt(large)
        rhs = put(jnp.ones((side, side), dtype))
        for thin in _THIN:
            if 2 * thin * large <= _MOST_FLOPS:
                lhs = put(jnp.ones((thin, side), dtype))
                grid[thin, large] = timed_rate(dot, 2 * thin * large, lhs, rhs)
    for thin in _THIN:  # left out as too long: the trend of the thinner side
        for i, large in enumerate(_LARGE):
            if (thin, large) not in grid:
                below, lower = _THIN[_THIN.index(thin) - 1], _LARGE[i - 1]
                trend = grid[below, large] / grid[below, lower]
                grid[thin, large] = grid[thin, lower] * trend
    return grid


def _launches(x: Any) -> Any:
    """Small operations XLA cannot fuse into one another: one launch each."""
    import jax.numpy as jnp

    for _ in range(16):
        x = jnp.sort(x * 1.5)[::-1]
    return x


def _elementwise_work(x: Any) -> Any:
    """Work like decoding and quantizing: bit operations, conversions, rounding."""
    import jax
    import jax.numpy as jnp

    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    rounded = (bits + jnp.uint32(0x7FFF) + ((bits >> 16) & 1)) & jnp.uint32(0xFFFF0000)
    y = jax.lax.bitcast_convert_type(rounded, jnp.float32)
    codes = jnp.clip(jnp.round(y * 3.7), -127, 127).astype(jnp.int8)
    return codes.astype(jnp.float32) * 0.25 + jnp.abs(x)


def cost(compiled: Any) -> dict[str, float]:
    """XLA's cost analysis of a compiled program (`flops`, `bytes accessed`)."""
    found = compiled.cost_analysis()
    if isinstance(found, list | tuple):  # older JAX: one dict per program
        found = found[0] if found else {}
    return {k: float(v) for k, v in (found or {}).items() if k in ("flops", "bytes accessed")}


def _probe_types() -> dict[str, tuple[Any, Any]]:
    import jax.numpy as jnp

    return {
        "s4": (jnp.int8, jnp.int32),  # XLA widens int4 operands to int8
        "s8": (jnp.int8, jnp.int32),
        "f8": (jnp.float8_e4m3fn, jnp.float32),
        "f16": (jnp.float16, jnp.float16),  # as plain JAX runs a half-precision model
        "bf16": (jnp.bfloat16, jnp.bfloat16),
        "f32": (jnp.float32, jnp.float32),
    }
