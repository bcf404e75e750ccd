"""The time `explain` predicts: HLO read as it is, a roofline computed by hand.

The compiled programs' dots are checked against FLOPs and bytes computed
here from the shapes; the roofline against the datasheet arithmetic done
here; a measured CPU gives finite positive times.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import precision
from precision import _hlo, _roofline


def _compiled(f, *args):
    return jax.jit(f).lower(*args).compile()


def test_a_dot_is_read_with_its_flops_and_bytes():
    x, w = jnp.ones((8, 64), jnp.int8), jnp.ones((64, 32), jnp.int8)
    c = _compiled(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.int32), x, w)
    (dot,) = _hlo.dots(c.as_text())
    assert dot.operand_types == ("s8", "s8")
    assert dot.flops == 2 * 8 * 64 * 32
    assert dot.bytes == 8 * 64 + 64 * 32 + 4 * 8 * 32
    assert (dot.m, dot.n, dot.k, dot.batch) == (8, 32, 64, 1)
    assert dot.text == "s8[8,64] x s8[64,32] -> s32[8,32]"


def test_batched_dots_and_convolutions_count_every_product():
    q, k = jnp.ones((4, 16, 8)), jnp.ones((4, 8, 24))
    (dot,) = _hlo.dots(_compiled(lambda a, b: jnp.einsum("bij,bjk->bik", a, b), q, k).as_text())
    assert (dot.batch, dot.m, dot.n, dot.k) == (4, 16, 24, 8)
    assert dot.flops == 2 * 4 * 16 * 24 * 8
    image, kernel = jnp.ones((2, 8, 8, 3)), jnp.ones((3, 3, 3, 16))

    def conv(a, b):
        return jax.lax.conv_general_dilated(
            a, b, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    (found,) = [d for d in _hlo.dots(_compiled(conv, image, kernel).as_text()) if d.convolution]
    assert found.flops == 2 * (2 * 4 * 4) * 16 * (3 * 3 * 3)
    assert found.n == 16


def _dot(types, m, n, k):
    width = {"bf16": 2, "s8": 1, "f32": 4}[types[0]]
    out = 4 if types[0] != "bf16" else 2
    return _hlo.Dot(None, "", types, 2 * m * n * k, width * (m * k + k * n) + out * m * n, m, n, k)


def test_datasheet_roofline_by_hand():
    h100 = _roofline.rates("NVIDIA H100 80GB HBM3", measure=False)
    assert h100 is not None
    assert "H100 SXM5" in h100.source
    square = _dot(("bf16", "bf16"), 4096, 4096, 4096)  # compute bound
    assert h100.dot_seconds(square) == pytest.approx(3e-6 + 2 * 4096**3 / 989e12)
    gemv = _dot(("bf16", "bf16"), 1, 4096, 4096)  # memory bound
    assert h100.dot_seconds(gemv) == pytest.approx(3e-6 + gemv.bytes / 3.35e12)
    int8 = _dot(("s8", "s8"), 4096, 4096, 4096)
    assert h100.dot_seconds(int8) == pytest.approx(3e-6 + 2 * 4096**3 / 1979e12)
    # a whole program: dispatch, dots, and the rest's bytes at the bandwidth
    cost = {"flops": square.flops + 10.0, "bytes accessed": square.bytes + 3.35e9}
    assert h100.program_seconds([square], cost, kernels=5) == pytest.approx(
        6.5e-5 + h100.dot_seconds(square) + 1e-3 + 4 * 3e-6
    )
    # a measured machine writes fresh result memory at its own rate
    slow = dataclasses.replace(h100, write_bandwidth=1e9)
    extra = slow.program_seconds([square], cost, 5, outputs=10**6)
    assert extra - h100.program_seconds([square], cost, 5) == pytest.approx(1e-3 - 1e6 / 3.35e12)


def test_a_known_device_measures_its_dispatch_when_asked(monkeypatch):
    # the datasheet gives the rates; the call's fixed cost (dispatch and the wait
    # for the result, 3x the typical figure on an H100) is timed when measuring
    monkeypatch.setattr(_roofline, "_PER_CALL", {})
    monkeypatch.setattr(_roofline, "_per_call", lambda device: 1.25e-4)
    typical = _roofline.rates("NVIDIA H100 80GB HBM3", measure=False)
    measured = _roofline.rates("NVIDIA H100 80GB HBM3", measure=True)
    assert typical is not None
    assert measured is not None
    assert typical.per_call == 6.5e-5
    assert measured.per_call == 1.25e-4
    assert "dispatch measured" in measured.source
    assert "dispatch" not in typical.source
    assert measured.peak == typical.peak
    assert measured.bandwidth == typical.bandwidth
    # kept for the process: a later call without measuring uses it too
    later = _roofline.rates("NVIDIA H100 80GB HBM3", measure=False)
    assert later is not None
    assert later.per_call == 1.25e-4


@pytest.mark.parametrize(
    ("kind", "source"),
    [
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("TPU v5 lite", "v5e"),
        ("TPU v5", "v5p"),
        ("TPU v4", "v4"),
        ("TPU v6 lite", "v6e"),
    ],
)
def test_known_devices_come_from_their_datasheet(kind, source):
    found = _roofline.rates(kind, measure=False)
    assert found is not None
    assert source in found.source


def test_fp8_on_a_device_without_it_runs_at_the_next_wider_rate():
    a100 = _roofline.rates("NVIDIA A100-SXM4-80GB", measure=False)
    fp8 = _hlo.Dot(None, "", ("f8e4m3fn", "f8e4m3fn"), 2, 3, 1, 1, 1)
    assert a100.rate(fp8) == 312e12  # no fp8 units: bf16's rate
    assert _roofline.type_key(("s8", "bf16")) == "bf16"


def test_a_cpu_is_predicted_only_when_measured(monkeypatch):
    # a process that has measured nothing yet, and no measurement left behind for the
    # tests that run after this one (docs/explain.md's first report has no prediction)
    monkeypatch.setattr(_roofline, "_MEASURED", {})
    w = precision.Tensor(np.ones((64, 32), np.float32)).to_reduced_precision("int8")
    x = jnp.ones((16, 64))
    report = precision.explain(lambda x, w: x @ w, x, w, contract="int8")
    assert report.predicted_s is None
    assert "measure=True" in report.no_prediction
    assert "measure=True" in str(report)
    report = precision.explain(lambda x, w: x @ w, x, w, contract="int8", measure=True)
    assert report.rates.endswith("(measured on this machine)")
    assert 0 < report.rows[0].predicted_s < report.predicted_s < 1.0
    assert 0 < report.bfloat16_s < 1.0
    assert math.isfinite(report.speedup)
    assert report.flops_by_type == {"s8": 2 * 16 * 64 * 32}
    assert "a call on" in str(report)
    assert "the bfloat16 model" in str(report)


def test_kernels_count_what_the_entry_computation_launches():
    x = jnp.ones((8, 8))
    assert _hlo.kernels(_compiled(lambda a: a * 2 + 1, x).as_text()) == 1  # one fusion
    text = _compiled(lambda a: jnp.sort(jnp.tanh(a @ a), axis=0).sum(), x).as_text()
    entry = text[text.index("ENTRY") :]
    launched = [
        line
        for line in entry.splitlines()[1:]
        if " = " in line and not any(f" {op}(" in line for op in ("parameter", "constant"))
    ]
    assert _hlo.kernels(text) == len(launched) >= 2
    assert _hlo.output_bytes(text) == 4  # one float32 scalar
    two = _compiled(lambda a: (a.astype(jnp.bfloat16), a[:2]), x).as_text()
    assert _hlo.output_bytes(two) == 8 * 8 * 2 + 2 * 8 * 4
