"""Peak memory of `precision convert` and `report` on one 256 MiB tensor (2-D and 1-D).

Each command runs in a child process started by a small launcher, which
reads the child's peak resident set size with `resource.getrusage`
(RUSAGE_CHILDREN). The launcher matters: a process's peak RSS counts from
the size of the process it was forked from, and pytest with JAX loaded is
hundreds of MiB. The baseline is a child that imports precision and JAX and
runs one jitted op. Bounds (issue 13): convert within 1.5x the tensor above
the baseline, report within 3x.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

MiB = 1 << 20
TENSOR = 256 * MiB

LAUNCHER = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""

BASELINE = "import precision, jax, jax.numpy as jnp; jax.jit(lambda x: x + 1)(jnp.ones(3))"


def peak(*cmd: str) -> int:
    """Peak RSS in bytes of `cmd` run by the small launcher (which checks it exited 0)."""
    out = subprocess.run(
        [sys.executable, "-c", LAUNCHER, *cmd], capture_output=True, text=True, timeout=600
    )
    code, rss = out.stdout.split()
    assert code == "0", out.stderr
    return int(rss)


def write_plain(path, name: str, shape: tuple[int, ...]) -> None:
    """A plain safetensors file of one float32 tensor, written in slices (little memory here)."""
    n = int(np.prod(shape)) * 4
    header = json.dumps({name: {"dtype": "F32", "shape": list(shape), "data_offsets": [0, n]}})
    header += " " * (-len(header) % 8)
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        for _ in range(n // (16 * MiB)):
            rng.standard_normal(4 * MiB, dtype=np.float32).tofile(f)


@pytest.fixture(scope="module")
def baseline():
    return peak(sys.executable, "-c", BASELINE)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shape", "runs"),
    [
        ((8192, 8192), [("int8", "per-tensor"), ("int4", None), ("int8", "per-axis:-1")]),
        ((64 * MiB,), [("int8", "per-tensor"), ("bf16", None), ("e4m3", "per-tensor")]),
    ],
    ids=["2-D", "1-D"],
)
def test_convert_and_report_stay_within_bounds(tmp_path, baseline, shape, runs):
    src = tmp_path / "big.safetensors"
    write_plain(src, "w", shape)
    assert os.path.getsize(src) > TENSOR
    cli = [sys.executable, "-m", "precision"]
    out = tmp_path / "out.safetensors"
    for fmt, scaling in runs:
        flags = ["--to", fmt, "--keep", "none", "-q", "--overwrite"]
        flags += [] if scaling is None else ["--scaling", scaling]
        used = peak(*cli, "convert", str(src), "-o", str(out), *flags) - baseline
        assert used <= 1.5 * TENSOR, (fmt, scaling, used / MiB)
    used = peak(*cli, "report", str(src), str(out), "-q") - baseline
    assert used <= 3 * TENSOR, used / MiB
