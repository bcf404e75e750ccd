"""`Format.check` raises exactly what `encode` would, for every format, scaling and input class.

`precision` validates once, with `check`, and then encodes without checks: a
case `check` lets through that `encode` refuses would surface as an error from
deep inside a traced function, and a case `check` refuses that `encode` takes
would refuse good input. So the two paths agreeing is itself the property under
test; and so that agreeing on a wrong answer (both taking NaN into a scaled
format, both refusing good input) fails too, each outcome is also compared with
`_expected`, the documented rule written out independently of the code. A 0-d
value is one group of one under every scaling.
"""

from __future__ import annotations

import itertools
import os
import warnings

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


# The documented rules (docs/formats.md: "Scaling", "Scale formats", E8M0, the
# error table; docs/reliability.md), as sets of names rather than code paths.
_NON_FINITE = {"nan", "inf", "half-inf", "float64 beyond float32"}
_INF = _NON_FINITE - {"nan"}
_NEGATIVE = {"scalar", "odd"}  # -1.5; linspace(-3, 3)
_ALWAYS_SCALED = {"int8", "int4", "int1", "nf4", "uint8", "uint4", "mxfp4", "mxint8", "nvfp4"}
_INTEGER_ELEMENTS = {"int8", "int4", "int1", "nf4", "uint8", "uint4", "mxint8"}
# int1's scale is a mean, nf4's and the zero-point formats' map a group onto the codes
# exactly: none has a power-of-two rule or an E8M0/e4m3 scale.
_NO_POWER_OF_TWO = {"int1", "nf4", "uint8", "uint4"}


def _expected(name: str, scaling, label: str) -> str:
    """What `encode` must do with input `label`, from the documentation alone."""
    if name in ("bfloat16", "float8_e8m0fnu"):  # a compute format; a scale format
        if scaling is not None:
            return "ScalingError"  # neither takes a scaling
        if name == "bfloat16":
            return "ok"  # NaN and inf are bfloat16 values
        # E8M0 holds positive powers of two and NaN: no code for zero, negatives, inf
        return "FormatError" if label in _INF | _NEGATIVE else "ok"
    if scaling is not None:  # the scaling itself is refused before any value is read
        if scaling.power_of_two and name in _NO_POWER_OF_TWO:
            return "ScalingError"
        if scaling.scale_format == "float8_e4m3fn" and name in _INTEGER_ELEMENTS:
            return "ScalingError"  # two-level NVFP4 scales are for float elements
    scaled = scaling is not None or name in _ALWAYS_SCALED
    if label in _NON_FINITE and (scaled or name == "float6_e3m2fn"):
        return "NonFiniteError"  # no NaN/inf into a scale, nor into a format without them
    return "ok"  # float8_e4m3fn unscaled has a NaN code, and inf becomes it


def _outcome(call, x, scaling) -> str:
    # Narrowing float64 beyond float32's range warns (numpy's cast, as JAX narrows). The
    # suite turns warnings into errors, which made every outcome of that input the same
    # RuntimeWarning, before the scaling or the values were looked at; ignore it here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
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
        assert encoded == _expected(name, scaling, label), (label, encoded)


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
            # and what they say is the documented refusal: the scaling first (an axis
            # the array lacks, int1's power of two), then the values
            if isinstance(scaling, dtypes.PerAxis):
                assert said[0].startswith("ScalingError: PerAxis(axis=2) does not fit"), said
            elif name == "int1" and scaling is not None:
                assert said[0].startswith("ScalingError: int1 scales are mean(|x|)"), said
            elif x.dtype == np.float32:
                assert said[0].startswith(
                    f"NonFiniteError: cannot encode 2 non-finite value(s) into scaled {name}: "
                    "the first is nan at index (1,)"
                ), said
            else:
                assert said[0] == "ok", said
