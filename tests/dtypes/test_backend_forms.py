"""What an accelerator run found that a CPU cannot show by itself, pinned on the CPU.

- `group_absmax` is one integer max over the magnitude bits, reduced in two forms:
  at once (GPUs, TPUs) and in materialized stages (XLA:CPU, which vectorises only
  short integer reductions), chosen by `lax.platform_dependent`. Both must give
  the same bits, or the backends would disagree: both are forced here on
  adversarial input large enough to be staged.
- A group holding NaN or inf gets a NaN scale; in a bfloat16 or float16 scale
  format an H100's conversion wrote 0x7FFF where the CPU writes ml_dtypes'
  quiet NaN (0x7FC0 / 0x7E00). The NaN is now written as bits; the bits are
  checked against ml_dtypes' conversion of float32's quiet NaN.
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from backend_bits import adversarial

import dtypes
from dtypes import _scale_rules

SCALINGS = [
    dtypes.PerTensor(),
    dtypes.PerAxis(0),
    dtypes.PerAxis(1),
    dtypes.PerBlock(32),
    dtypes.PerBlock(7, axis=0),
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=str)
def test_both_forms_of_the_group_absmax_give_the_same_bits(scaling, monkeypatch):
    x = adversarial(1 << 16).reshape(-1, 64)
    got = {}
    assert x.size > _scale_rules._SMALL  # the CPU's form stages it
    for form in ("cpu", "default"):

        def chosen(*args, form=form, **branches):
            return branches[form](*args)

        monkeypatch.setattr(_scale_rules.lax, "platform_dependent", chosen)
        f = jax.jit(lambda v: _scale_rules.group_absmax(v, scaling))
        got[form] = np.asarray(f(x)).view(np.uint32)
    monkeypatch.undo()
    np.testing.assert_array_equal(got["cpu"], got["default"])
    # and they are right: max |x| of each group (subnormal maxima read as 0), NaN where
    # the group holds NaN or inf
    flushed = np.where(np.abs(x) < np.float32(2.0**-126), np.float32(0), np.abs(x))
    want = np.asarray(
        scaling.group_reduce(flushed, lambda a, axes: np.max(a, axis=axes, keepdims=True))
    )
    bad = np.asarray(
        scaling.group_reduce(~np.isfinite(x), lambda a, axes: np.any(a, axis=axes, keepdims=True))
    )
    values = got["cpu"].view(np.float32)
    assert np.array_equal(np.isnan(values), bad)
    np.testing.assert_array_equal(values[~bad], want[~bad])


@pytest.mark.parametrize(
    ("scaling", "dtype"),
    [
        (dtypes.PerAxis(0, scale_format="bfloat16"), ml_dtypes.bfloat16),
        (dtypes.PerBlock(32, scale_format="float16"), np.float16),
    ],
    ids=["bfloat16", "float16"],
)
@pytest.mark.parametrize("name", ["int8", "int4", "uint4", "uint8"])
def test_nan_group_scales_are_the_quiet_nan_in_a_narrow_scale_format(name, scaling, dtype):
    x = np.ones((4, 32), np.float32)
    x[1, 3], x[2, 0] = np.nan, -np.inf
    enc = jax.jit(lambda v: dtypes.get(name).encode(v, scaling=scaling))(x)
    bits = np.asarray(enc.scale).view(np.uint16).ravel()
    quiet = int(np.float32(np.nan).astype(dtype).view(np.uint16))
    assert bits[1] == bits[2] == quiet, [hex(b) for b in bits]
    assert np.isfinite(np.asarray(enc.scale, np.float32)[[0, 3]]).all()
