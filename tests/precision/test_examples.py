"""The examples run, with short flags, and say what they claim. (The docs pages' code blocks
run in tests/test_docs_blocks.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_optax(policy):
    out = _run("mixed_precision_optax.py", "--policy", policy, "--steps", "30")
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out)]
    assert losses[-1] < losses[0] - 0.5
    compute = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}[policy]
    assert f"compute={compute}" in out
    scale = re.findall(r"loss scale (\S+)", out)[-1]
    assert float(scale) == (1.0 if policy == "mixed_bfloat16" else 32768.0)


def test_flax_model():
    out = _run("flax_model.py")
    rows = dict(re.findall(r"^(\w+)\s+(\S+)\s+[\d,]+$", out, flags=re.M))
    assert float(rows["float32"]) == 0.0
    # float16 keeps 11 significant bits, bfloat16 8: its error is the larger one.
    assert 0 < float(rows["float16"]) < float(rows["bfloat16"]) < 0.05
    assert "refused as expected: cannot combine float16 and bfloat16" in out


def test_post_training_quantization():
    out = _run("post_training_quantization.py", "--steps", "300")
    acc = {m: float(v) for m, v in re.findall(r"^(\w+)\s+(\d+\.\d+)%", out, flags=re.M)}
    assert acc["float32"] > 0.85 * 100
    assert abs(acc["int8"] - acc["float32"]) <= 1.0
    assert abs(acc["int4"] - acc["float32"]) <= 3.0
    byte_counts = [int(v.replace(",", "")) for v in re.findall(r"([\d,]{5,})$", out, flags=re.M)]
    # float32: 4 bytes a weight; int8: 1 byte a weight + a scale per output; int4: half a byte.
    weights, outputs = 64 * 256 + 256 * 10, 256 + 10
    assert byte_counts == [
        4 * (weights + outputs),
        weights + 4 * outputs + 4 * outputs,
        weights // 2 + 4 * outputs + 4 * outputs,
    ]
