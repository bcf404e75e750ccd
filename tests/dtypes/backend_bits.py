"""The bits every encoding produces on adversarial input, as digests: run it on two
backends (or under two sets of XLA flags) and compare.

    python tests/dtypes/backend_bits.py OUT.json [--size N] [--device cpu|gpu|tpu] [--quick|--ci]
    python tests/dtypes/backend_bits.py --compare A.json B.json

For every format and named encoding (float64 aside), in every rounding mode,
and for the integer, codebook and asymmetric formats also under every
scaling and scale format, it encodes, decodes and rounds one adversarial
array inside `jit` and records a SHA-256 of each output's bytes (codes,
scales, tensor scale, zero points, decoded values, rounded values). The
input holds, in 32-element rows: groups whose maxima divide badly by every
format's top value, elements at exactly the group maximum and one ulp either
side (the code boundary), near-ties between neighbouring codes, float32
subnormals and products that become subnormal, ±0, ±max and values beyond
every format's range, and NaN and ±inf in a few groups. A conversion refused
for the input is recorded by its exception type.

`tests/dtypes/test_backend_bits.py` runs this under XLA:CPU's fast-math flags
(whose division, like a GPU's, is not correctly rounded) and without them;
`benchmarks/accelerator.py` compares a GPU with the host CPU the same way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

FAST_MATH_FLAGS = (
    "--xla_cpu_enable_fast_math=true --xla_cpu_fast_math_honor_division=false "
    "--xla_cpu_fast_math_honor_nans=false --xla_cpu_fast_math_honor_infs=false "
    "--xla_cpu_fast_math_honor_functions=false"
)


def run_under_flags(code: str, flags: str, paths: list[Path]) -> None:
    """Run `code` in a fresh Python on XLA:CPU under `flags` (JAX reads them once, at its
    start), with `paths` first on its `sys.path`; raise with its stderr if it fails."""
    root = Path(__file__).resolve().parents[2]
    head = f"import sys\nsys.path[:0] = {[str(p) for p in paths]!r}\n"
    env = dict(os.environ, XLA_FLAGS=flags, PYTHONPATH=str(root), JAX_PLATFORMS="cpu")
    args = [sys.executable, "-c", head + code]
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


# int1's mean-absolute scales under these scalings take a pairwise sum, which XLA:CPU's
# fast-math flags reassociate (one ulp in a few groups); XLA:GPU does not reassociate,
# so these are compared on accelerators only.
REASSOCIATED = ("int1 [per-axis 0]", "int1 [per-block 32 on axis -1]")

ALL_MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic")
SCALING_MODES = ("nearest_even", "toward_zero", "down", "stochastic")


def adversarial(size: int, seed: int = 0) -> np.ndarray:
    """`size` float32 values (a multiple of 32, in rows of 32) built to be hard for
    scaled encodings: see the module docstring."""
    rng = np.random.default_rng(seed)
    rows = max(size // 32, 64)
    # every row gets its own magnitude, from far below to far above 1
    mag = np.exp2(rng.uniform(-140, 128, rows)).astype(np.float32)
    mag[: rows // 8] = np.exp2(rng.uniform(-20, 20, rows // 8)).astype(np.float32)
    x = (rng.uniform(-1, 1, (rows, 32)) * mag[:, None]).astype(np.float32)
    # the group maximum itself (the code boundary), and its float32 neighbours
    top = np.max(np.abs(x), axis=1)
    x[:, 0] = -top
    x[:, 1] = np.nextafter(top, np.float32(0))
    x[:, 2] = np.nextafter(-top, np.float32(0))
    # near-ties: k + 1/2 steps of every integer format's grid, with steps that divide badly
    for q, col in ((127, 3), (7, 4), (1, 5), (255, 6), (15, 7)):
        k = rng.integers(-q, q, rows).astype(np.float32)
        x[:, col] = (k + np.float32(0.5)) * (top / np.float32(q))
    # maxima whose quotient by every common top value is inexact
    tops = np.float32([127, 7, 1, 448, 57344, 6, 28, 7.5, 255, 15])
    odd = rng.integers(1 << 23, 1 << 24, rows).astype(np.float32)
    x[rows // 8 : rows // 4, 8] = (odd * rng.choice(tops, rows))[rows // 8 : rows // 4]
    # float32 subnormals, tiny products, ±0, ±max, beyond every format's range
    tiny = np.float32(2.0**-126)
    special = np.float32(
        [0.0, -0.0, tiny, -tiny, tiny / 2, -tiny / 3, 1e-45, 3.4e38, -3.4e38, 1e38, 65520.0,
         -65520.0, 448.0, 464.0, -480.0, 57344.0, 61440.0, 6.0, 6.5, 28.0, 30.0, 7.5, 7.75]
    )  # fmt: skip
    x[rows // 4, : special.size] = special
    x[rows // 4 + 1, :8] = tiny * rng.uniform(-2, 2, 8).astype(np.float32)
    # a big element beside tiny ones: their products with the reciprocal are subnormal
    x[rows // 4 + 2, :] = np.float32(1e-40)
    x[rows // 4 + 2, 0] = np.float32(1e30)
    # NaN and ±inf in a few groups (traced encodes give those groups NaN scales)
    x[rows // 2, 3] = np.nan
    x[rows // 2 + 1, 5] = np.inf
    x[rows // 2 + 2, 7] = -np.inf
    x[rows // 2 + 3, :] = -np.nan
    return np.ascontiguousarray(x)


def cases(quick: bool = False, ci: bool = False) -> list[tuple[str, Any, tuple[str, ...]]]:
    """(format name, scaling or None for its default, rounding modes).

    `quick` (the accelerator check) keeps every format and encoding in three modes
    and the scalings of int8, int4, int1 and uint4 in two: the division, the
    boundary and the NaN cases all show there; the full list runs in the hunt
    profile. `ci` (the CPU fast-math test, implies `quick`) leaves out what that
    comparison cannot use or does not need: int1's REASSOCIATED scalings, and
    int8's scalings but `PerBlock(32)` (issue 20's example; int8 takes int4's code
    path under every scaling, with another top value and no packing).
    """
    quick = quick or ci
    import dtypes

    out: list[tuple[str, Any, tuple[str, ...]]] = []
    names = [n for n in dtypes.REGISTRY if n != "float64"]
    modes = ("nearest_even", "toward_zero", "stochastic") if quick else ALL_MODES
    for name in names:
        out.append((name, None, modes))
    scalings = [
        dtypes.PerTensor(),
        dtypes.PerAxis(0),
        dtypes.PerBlock(32),
        dtypes.PerBlock(32, power_of_two=True),
        dtypes.PerBlock(32, power_of_two=True, scale_format="float8_e8m0fnu"),
        dtypes.PerAxis(0, scale_format="bfloat16"),
        dtypes.PerBlock(32, scale_format="float16"),
    ]
    ints = ("int8", "int4", "int1", "uint4") if quick else ("int8", "int4", "int2", "int1")
    ints += () if quick else ("uint8", "uint4", "nf4")
    modes = ("toward_zero", "down") if quick else SCALING_MODES
    for name in ints:
        for scaling in scalings:
            if ci and (
                f"{name} [{scaling}]" in REASSOCIATED
                or (name == "int8" and scaling != dtypes.PerBlock(32))
            ):
                continue
            out.append((name, scaling, modes))
    floats = ("float8_e4m3fn", "float4_e2m1fn")
    floats += () if quick else ("float8_e5m2", "float6_e2m3fn")
    for name in floats:
        for scaling in (dtypes.PerTensor(), dtypes.PerAxis(0), dtypes.PerBlock(32)):
            out.append((name, scaling, modes))
    return out


def _digest(a: Any) -> str | None:
    if a is None:
        return None
    arr = np.ascontiguousarray(np.asarray(a))
    return hashlib.sha256(arr.view(np.uint8).tobytes()).hexdigest()[:16]


def run(
    size: int, device: str | None = None, quick: bool = False, ci: bool = False
) -> dict[str, Any]:
    import jax

    import dtypes

    dev = jax.devices(device)[0] if device else jax.devices()[0]
    x = jax.device_put(adversarial(size), dev)
    key = jax.device_put(jax.random.key(7), dev)
    results: dict[str, Any] = {}
    for name, scaling, modes in cases(quick, ci):
        fmt = dtypes.get(name)
        label = f"{name} [{scaling if scaling is not None else 'default'}]"
        refused: dict[str, str] = {}

        def one(
            x: Any,
            key: Any,
            fmt: Any = fmt,
            scaling: Any = scaling,
            modes: Any = modes,
            refused: dict[str, str] = refused,
        ) -> dict[str, Any]:
            outs = {}
            for mode in modes:
                k = key if mode == "stochastic" else None
                try:
                    enc = fmt.encode(x, scaling=scaling, rounding=mode, key=k)
                except Exception as err:  # a refusal must be the same on every backend
                    refused[mode] = f"refused: {type(err).__name__}"
                    continue
                # the rounded values in one mode: `round` shares the encode's code path
                rounded = fmt.round(x, scaling=scaling, rounding=mode, key=k)
                outs[mode] = (enc.data, enc.scale, enc.tensor_scale, enc.zero_point)
                outs[mode] += (enc.decode(), rounded if mode == modes[0] else None)
            return outs

        with jax.default_device(dev):
            outs = jax.jit(one)(x, key)
        results.update({f"{label} {mode}": why for mode, why in refused.items()})
        for mode, parts in outs.items():
            results[f"{label} {mode}"] = [_digest(p) for p in parts]
    return results


def compare(path_a: str, path_b: str) -> int:
    """Print the cases whose digests differ between two runs; 1 if any does."""
    with open(path_a) as f:
        a = json.load(f)
    with open(path_b) as f:
        b = json.load(f)
    parts = ("codes", "scales", "tensor scale", "zero points", "decoded", "rounded")
    diff = [k for k in a if a[k] != b.get(k)]
    for k in diff:
        if isinstance(a[k], list) and isinstance(b.get(k), list):
            print(k, [p for p, x, y in zip(parts, a[k], b[k], strict=True) if x != y])
        else:
            print(k, a[k], b.get(k))
    print(f"{len(a) - len(diff)} of {len(a)} cases identical")
    return 1 if diff else 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--compare"]:
        return compare(argv[1], argv[2])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--device", default=None)
    parser.add_argument("--quick", action="store_true", help="the accelerator subset (`cases`)")
    parser.add_argument("--ci", action="store_true", help="the CPU fast-math subset (`cases`)")
    args = parser.parse_args(argv)
    results = run(args.size, args.device, args.quick, args.ci)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
