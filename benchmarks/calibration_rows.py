"""How many calibration rows GPTQ needs per input: held-out error against round-to-nearest.

Run:  python benchmarks/calibration_rows.py

A 256 -> 256 -> 64 MLP (gelu) with random weights, int4 in blocks of 32 inputs, calibrated
by GPTQ on R rows (batches of 64) and compared with round-to-nearest (the same scaling) by
the mean squared error of its outputs on 8192 held-out rows, for R from 64 to 4096, on two
kinds of inputs, rotated at random: isotropic (every direction of the 256 inputs equally
energetic: the hardest case, GPTQ's Hessian must see them all) and structured (energies
decaying as exp(-i/64) over the directions, as real activations have them: most in few).
A ratio below 1 means GPTQ wins on held-out inputs.
`precision.calibrate` warns below `MIN_ROWS_PER_INPUT` rows per input (docs/calibration.md).
"""

from __future__ import annotations

import os
import platform
import sys
import warnings

import jax
import numpy as np

import dtypes
import precision

K = 256
ROWS = [64, 128, 256, 512, 1024, 2048, 4096]


def mlp(p, x):
    return jax.nn.gelu(x @ p["w1"]) @ p["w2"]


def main() -> int:
    rng = np.random.default_rng(0)
    params = {
        "w1": (rng.standard_normal((K, 256)) / np.sqrt(K)).astype(np.float32),
        "w2": (rng.standard_normal((256, 64)) / 16).astype(np.float32),
    }
    scaling = dtypes.PerBlock(32)
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; jax {jax.__version__}, "
        f"precision {precision.__version__}"
    )
    print(f"{'inputs':<11} {'rows':>5} {'rows/input':>10} {'GPTQ/RTN held-out MSE':>22}")
    for kind in ("isotropic", "structured"):
        decay = np.ones(K) if kind == "isotropic" else np.exp(-np.arange(K) / 64)
        decay *= np.sqrt(K / (decay @ decay))  # the same total energy either way
        rotation = np.linalg.qr(rng.standard_normal((K, K)))[0]  # random directions
        mix = decay[:, None] * rotation

        def data(n: int, mix=mix) -> np.ndarray:
            return (rng.standard_normal((n, K)) @ mix).astype(np.float32)

        held = data(8192)
        ref = np.asarray(mlp(params, held))

        def error(q, held=held, ref=ref) -> float:
            out = precision.to_full_precision(precision.apply(mlp)(q, held))
            return float(np.mean((np.asarray(out) - ref) ** 2))

        rtn = error(
            precision.calibrate(
                mlp, params, [data(64)], method="rtn", format="int4", scaling=scaling
            )
        )
        for rows in ROWS:
            batches = [data(64) for _ in range(rows // 64)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", precision.CalibrationWarning)
                q = precision.calibrate(mlp, params, batches, format="int4", scaling=scaling)
            print(f"{kind:<11} {rows:>5} {rows / K:>10.2f} {error(q) / rtn:>22.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
