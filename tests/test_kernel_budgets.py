"""Each quantizing kernel's compiled size held to a budget.

The instruction count of the compiled program (`benchmarks/kernels.py`'s
`instructions`: every instruction XLA emits, fused computations included) is the
cheap, deterministic proxy of a kernel's cost: the timing rows of
`benchmarks/kernels.py` move with the machine's load, the count does not. A change
that makes a kernel grow past its budget fails here, naming the kernel, its count,
its budget and the plain `jnp` expression's count; a change that makes one cheaper
lowers the budget in the same commit (a budget sits about a quarter above the count
it was set from, so that XLA releases can move a count a little without failing).

The counts are those of XLA:CPU at 2**16 float32 values; the timings they stand for
are in docs/benchmarks.md.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

N = 1 << 16

# name -> most instructions; counts as of the commit that set them, in the comments
# (Per-group values are made inside a conditional since 2026-11-30, `dtypes.computed_once`:
# each value is its own fusion there, about 100 instructions more for a scaled kernel
# with many groups, and 0.75-0.95x the time per block of 32, the same per row.)
BUDGETS = {
    "bfloat16 encode": 40,  # 30
    "bfloat16 round": 5,  # 4
    "float16 encode": 50,  # 37
    "float16 round": 45,  # 42 (widened on the bits: exact under fast-math flags on AVX2)
    "float8_e4m3fn encode": 65,  # 52: conversion from the bits, 0.5x the time
    "float8_e4m3fn round": 100,  # 80
    "float8_e5m2 encode": 68,  # 54: as e4m3fn
    "float8_e5m2 round": 45,  # 34
    "tf32 encode": 5,  # 4
    "tf32 round": 5,  # 4
    "int8 per tensor encode": 460,  # 367
    "int8 per tensor round": 435,  # 349
    "int8 per row encode": 595,  # 476
    "int8 per row round": 600,  # 481
    "int8 per block 32 encode": 580,  # 465
    "int8 per block 32 round": 590,  # 470
    "int4 per tensor encode": 480,  # 383
    "int4 per tensor round": 435,  # 349
    "int4 per row encode": 615,  # 492
    "int4 per row round": 600,  # 481
    "int4 per block 32 encode": 600,  # 481
    "int4 per block 32 round": 590,  # 470
    "int2 per tensor encode": 760,  # 609: the unit threshold's search, fused (timed 0.81-0.86x)
    "int2 per tensor round": 735,  # 586: the unit threshold, as the encode (timed 0.72x)
    "int2 per row encode": 570,  # 454
    "int2 per row round": 430,  # 342
    "int2 per block 32 encode": 450,  # 361 (int2 scale = absmax, no division)
    "int2 per block 32 round": 410,  # 330
    "float8_e4m3fn per tensor encode": 510,  # 408: the codes from the bits, as above
    "float8_e4m3fn per row encode": 615,  # 490
    "float8_e5m2 per tensor encode": 515,  # 412
    "float8_e5m2 per row encode": 620,  # 494
    "contract int8 rowwise (activation)": 595,  # 476
    "contract e4m3 tensorwise (activation)": 510,  # 408
    "contract e4m3 rowwise (activation)": 615,  # 490
    "Tensor @ Tensor bfloat16 (result rounding)": 240,  # 191 (operands and result: bits)
    "Tensor @ Tensor float16 (result rounding)": 240,  # 191 (the result stored by a cast)
    "Tensor @ Tensor bfloat16 (vs the native bf16 dot)": 240,  # 191
    "mxfp8_e4m3 encode": 340,  # 271: the codes from the bits
    "mxfp4 encode": 440,  # 352
    "nvfp4 encode": 1610,  # 1289: more than the 1118 of 11-28, fewer run (2.4 -> 1.5 ms)
    "nf4 encode": 510,  # 408
    "uint8 per tensor encode": 1415,  # 1131 (one division for both span forms)
    "uint4 per block 32 encode": 995,  # 795 (the zero point made after the reciprocal)
    "float6_e2m3fn per block 32 encode": 735,  # 589
    "float4_e2m1fn per block 32 encode": 700,  # 562
    "int8 per tensor stochastic encode": 880,  # 703
    "bfloat16 stochastic round": 395,  # 316
    "absmax per tensor (part)": 60,  # 46
    "absmax per row (part)": 55,  # 42
}


def _kernels_module() -> ModuleType:
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "kernels.py"
    spec = importlib.util.spec_from_file_location("_benchmark_kernels", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


_BENCH = _kernels_module()
_ROWS = {row.name: row for row in _BENCH.kernels()}


def test_every_row_of_the_benchmark_has_a_budget():
    assert sorted(_ROWS) == sorted(BUDGETS)


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_kernel_stays_within_its_instruction_budget(name):
    row = _ROWS[name]
    args = row.args(N)
    count = _BENCH.instructions(row.ours, *args)
    if count > BUDGETS[name]:
        pytest.fail(
            f"{name}: {count} instructions compiled, budget {BUDGETS[name]} (the plain jnp "
            f"expression of the rule: {_plain_count(row, args)}); profile it with "
            f"`python benchmarks/kernels.py --only '{name}'` before raising the budget"
        )


def _plain_count(row, args) -> str:
    try:
        return f"{_BENCH.instructions(row.plain, *args)} instructions"
    except Exception as e:  # XLA:CPU has no convert for some narrow floats (fp6)
        return f"does not compile here ({type(e).__name__})"
