"""`Format.check` raises exactly what `encode` would, for every format, scaling and input class.

`precision` validates once, with `check`, and then encodes without checks: a
case `check` lets through that `encode` refuses would surface as an error from
deep inside a traced function, and a case `check` refuses that `encode` takes
would refuse good input. A 0-d value is one group of one under every scaling.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

import dtypes

FORMATS = [
    "bfloat16",
    "float8_e4m3fn",
    "float6_e3m2fn",
    "int8",
    "int4",
    "int1",
    "nf4",
    "uint8",
    "uint4",
    "float8_e8m0fnu",
    "mxfp4",
    "mxint8",
    "nvfp4",
]
SCALINGS = [
    None,
    dtypes.PerTensor(),
    dtypes.PerAxis(0),
    dtypes.PerBlock(32),
    dtypes.PerBlock(32, power_of_two=True),
    dtypes.PerBlock(16, scale_format="float8_e4m3fn"),
    dtypes.PerBlock(32, power_of_two=True, scale_format="float8_e8m0fnu"),
    dtypes.PerBlock(32, scale_format="bfloat16"),
]
INPUTS = {
    "ones": np.ones((2, 64), np.float32),
    "nan": np.full((2, 64), np.nan, np.float32),
    "inf": np.full((2, 64), np.inf, np.float32),
    "scalar": np.float32(-1.5),
    "odd": np.linspace(-3, 3, 30, dtype=np.float32).reshape(3, 10),
    "0-d": np.array(2.5, np.float32),
    "half": np.full((2, 64), 0.5, np.float16),
    "half-inf": np.full((2, 64), np.inf, np.float16),
    "float64 beyond float32": np.array([[1.0, 1e300]] * 2),  # inf once narrowed, as JAX does
}


def _outcome(call, x, scaling) -> str:
    try:
        call(x, scaling=scaling)
    except Exception as exc:  # the class is what is compared
        return type(exc).__name__
    return "ok"


# int8, uint8 and float6_e3m2fn take the code paths of int4, uint4 and float8_e4m3fn
# (another top value, another packing): with every scaling under the hunt profile
# (tests/conftest.py), with their default and two others in CI.
_SHARED_PATH = ("int8", "uint8", "float6_e3m2fn")
_HUNT = os.environ.get("HYPOTHESIS_PROFILE") == "hunt"
_CASES = [
    (name, scaling)
    for name, scaling in itertools.product(FORMATS, SCALINGS)
    if _HUNT or name not in _SHARED_PATH or scaling in (SCALINGS[0], SCALINGS[2], SCALINGS[6])
]


@pytest.mark.parametrize(("name", "scaling"), _CASES)
def test_check_raises_what_encode_raises(name, scaling):
    fmt = dtypes.get(name)
    for label, x in INPUTS.items():
        checked = _outcome(fmt.check, x, scaling)
        encoded = _outcome(fmt.encode, x, scaling)
        assert checked == encoded, (label, checked, encoded)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "int8", "int4", "mxfp4", "nvfp4", "nf4"])
@pytest.mark.parametrize("scaling", [None, dtypes.PerTensor(), dtypes.PerAxis(0)])
def test_a_scalar_is_one_group_of_one(name, scaling):
    """A 0-d value encodes as the one-element array does: same value, decode == round."""
    fmt = dtypes.get(name)
    for v in (np.float32(-1.5), np.float32(0.3), np.float32(0.0)):
        one = fmt.encode(np.array([v]), scaling=scaling).decode()
        enc = fmt.encode(v, scaling=scaling)
        assert np.shape(enc.decode()) == ()
        assert float(enc.decode()) == float(np.asarray(one)[0])
        assert float(fmt.round(v, scaling=scaling)) == float(enc.decode())


@pytest.mark.parametrize("name", ["int8", "int4", "int1"])
def test_checks_without_jax_say_what_encode_says(name):
    # float16/float32 numpy arrays are checked without JAX: the same words as encode's
    fmt = dtypes.get(name)
    for x in (np.array([1.0, np.nan, -np.inf], np.float32), np.ones((3, 5), np.float16)):
        for scaling in (None, dtypes.PerAxis(2), dtypes.PerBlock(32, power_of_two=True)):
            said = []
            for call in (fmt.check, fmt.encode):
                try:
                    call(x, scaling=scaling)
                    said.append("ok")
                except Exception as exc:
                    said.append(f"{type(exc).__name__}: {exc}")
            assert said[0] == said[1], (x.dtype, scaling)
