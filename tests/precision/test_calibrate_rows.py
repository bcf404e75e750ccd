"""GPTQ on too few recorded rows for a weight's inputs is said, never silent.

With fewer rows than inputs GPTQ's Hessian is singular but for its damping, and its
rounding fits the recorded rows: on held-out inputs it can do worse than rounding to
nearest (measured by benchmarks/calibration_rows.py, docs/calibration.md). `calibrate`
warns below `MIN_ROWS_PER_INPUT` rows per input, naming each weight with its rows and
inputs; the measurement itself is checked here once, on the same kind of inputs.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest

import dtypes
import precision
from precision._calibrate._calibrate import MIN_ROWS_PER_INPUT

K = 128


def mlp(p, x):
    return jax.nn.gelu(x @ p["w1"]) @ p["w2"]


@pytest.fixture(scope="module")
def params():
    rng = np.random.default_rng(0)
    return {
        "w1": (rng.standard_normal((K, 128)) / np.sqrt(K)).astype(np.float32),
        "w2": (rng.standard_normal((128, 32)) / np.sqrt(128)).astype(np.float32),
    }


def batches(rows: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((64, K)).astype(np.float32) for _ in range(rows // 64)]


def held_out_error(q, params) -> float:
    x = np.random.default_rng(99).standard_normal((4096, K)).astype(np.float32)
    got = np.asarray(precision.to_full_precision(precision.apply(mlp)(q, x)))
    return float(np.mean((got - np.asarray(mlp(params, x))) ** 2))


def calibrate(params, rows: int, method: str = "gptq"):
    scaling = dtypes.PerBlock(32)
    return precision.calibrate(
        mlp, params, batches(rows, 1), method=method, format="int4", scaling=scaling
    )


def test_too_few_rows_per_input_warns_naming_each_weight(params):
    rows = K  # one row per input: below the threshold for both weights
    with pytest.warns(precision.CalibrationWarning) as caught:
        q = calibrate(params, rows)
    message = str(caught[0].message)
    assert f"fewer than {MIN_ROWS_PER_INPUT} recorded rows per input" in message
    assert f"['w1'] ({rows} rows, {K} inputs)" in message
    assert f"['w2'] ({rows} rows, 128 inputs)" in message
    # and the warning is right: on held-out inputs GPTQ is worse than rounding to nearest
    assert held_out_error(q, params) > held_out_error(calibrate(params, rows, "rtn"), params)


def test_enough_rows_are_silent_and_gptq_wins(params):
    rows = MIN_ROWS_PER_INPUT * K * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails
        q = calibrate(params, rows)
    assert held_out_error(q, params) < held_out_error(calibrate(params, rows, "rtn"), params)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"method": "smoothquant"}, "SmoothQuant prepares int8 activations"),
        ({"scaling": dtypes.PerBlock(32)}, "blocks of 32 with float16 scales"),
        ({"scaling": dtypes.PerBlock(128, scale_format="float16")}, "one scaling"),
    ],
    ids=["smoothquant", "float32-scales", "blocks-of-128"],
)
def test_q4_0_takes_its_one_scaling_and_the_weight_methods(params, options, words):
    with pytest.raises(precision.CalibrationError, match=words):
        precision.calibrate(mlp, params, batches(512, 1), format="q4_0", **options)
