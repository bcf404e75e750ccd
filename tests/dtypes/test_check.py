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
import warnings

import numpy as np
import pytest
from checks import assert_covers, registry
from sampling import HUNT, sample

import dtypes


def checkable(f) -> bool:
    """Every registry entry but float64, which encodes only with 64-bit JAX."""
    return f.bits <= 32


FORMATS = [f.name for f in registry(checkable)]
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
    # inf once narrowed, as JAX does; the shape of "ones", so it reuses that program
    "float64 beyond float32": np.tile([1.0, 1e300], (2, 32)),
}


# The documented rules (docs/formats.md: "Overflow and saturation", "Scaling", "Scale
# formats", "Code books and asymmetric integers", E8M0, the error table;
# docs/reliability.md), on what a format is (kind, layout) rather than on code paths.
_NON_FINITE = {"nan", "inf", "half-inf", "float64 beyond float32"}
_INF = _NON_FINITE - {"nan"}
_NEGATIVE = {"scalar", "odd"}  # -1.5; linspace(-3, 3)


def _always_scaled(fmt) -> bool:
    """Integers, zero-point integers and code books scale every group; a float layout only
    when asked, or when it carries a scaling (MX, NVFP4)."""
    return fmt.kind in ("int", "uint", "codebook") or getattr(fmt, "scaling", None) is not None


def _integer_elements(fmt) -> bool:
    return fmt.kind in ("int", "uint", "codebook")


def _no_power_of_two(fmt) -> bool:
    """int1's scale is a mean, a code book's and a zero-point format's map a group onto the
    codes exactly: none has a power-of-two rule (nor so an E8M0 scale)."""
    return fmt.kind in ("uint", "codebook") or getattr(fmt, "binary", False)


def _expected(name: str, scaling, label: str) -> str:
    """What `encode` must do with input `label`, from the documentation alone."""
    fmt = dtypes.get(name)
    if fmt.kind == "scale":  # E8M0 takes no scaling; it holds positive powers of two and NaN
        if scaling is not None:
            return "ScalingError"
        return "FormatError" if label in _INF | _NEGATIVE else "ok"
    # a float layout with float32's exponent range gains nothing from a scale, and refuses one
    if fmt.kind == "float" and fmt.exponent_bits == 8 and scaling is not None:
        return "ScalingError"
    if scaling is not None:  # the scaling itself is refused before any value is read
        if scaling.power_of_two and _no_power_of_two(fmt):
            return "ScalingError"
        if scaling.scale_format == "float8_e4m3fn" and _integer_elements(fmt):
            return "ScalingError"  # two-level NVFP4 scales are for float elements
    if label not in _NON_FINITE:
        return "ok"
    if scaling is not None or _always_scaled(fmt):
        return "NonFiniteError"  # no NaN/inf into a scale
    if not fmt.nan and not (label in _INF and fmt.saturate):
        return "NonFiniteError"  # nor into a layout without NaN (inf: unless it saturates)
    return "ok"  # a NaN code takes NaN, and inf where there is no inf


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


def _path(fmt) -> tuple:
    """What decides an entry's code path here: its class, kind, scale (its own scaling's
    scale format), whether it takes a scaling at all, and int1's mean."""
    own = getattr(fmt, "scaling", None)
    refuses = fmt.kind == "scale" or (fmt.kind == "float" and fmt.exponent_bits == 8)
    return (
        type(fmt).__name__,
        fmt.kind,
        own and own.scale_format,
        refuses,
        getattr(fmt, "binary", False),
    )


# Entries that share a path differ in top value, packing and NaN/inf codes (which every
# scaling sees the same): in CI the narrowest of each path (the tightest packing) takes
# every scaling, and the others their own scaling (None) where their NaN/inf codes decide
# the outcome, that is unless they are scaled by default (an integer, code book or MX
# entry refuses every non-finite value whatever its codes, as its path's narrowest
# shows); under the hunt profile (tests/sampling.py) every entry takes every scaling.
_NARROWEST = {}
for _f in sorted(registry(checkable), key=lambda f: f.bits):
    _NARROWEST.setdefault(_path(_f), _f.name)


def _in_ci(case) -> bool:
    name, scaling = case
    fmt = dtypes.get(name)
    if _NARROWEST[_path(fmt)] == name:
        return True
    return scaling is None and not _always_scaled(fmt)


_CASES = sample(itertools.product(FORMATS, SCALINGS), _in_ci)


@pytest.mark.parametrize(("name", "scaling"), _CASES)
def test_check_raises_what_encode_raises(name, scaling):
    fmt = dtypes.get(name)
    for label, x in INPUTS.items():
        checked = _outcome(fmt.check, x, scaling)
        encoded = _outcome(fmt.encode, x, scaling)
        assert checked == encoded, (label, checked, encoded)
        assert encoded == _expected(name, scaling, label), (label, encoded)


def takes_scalings(f) -> bool:
    """An entry that takes a scaling (not E8M0, nor a float with float32's exponents)."""
    return checkable(f) and not _path(f)[3]


# in CI the narrowest of each path, as above; every entry under hunt
_SCALAR_FORMATS = [
    f.name for f in registry(takes_scalings) if HUNT or _NARROWEST[_path(f)] == f.name
]


@pytest.mark.parametrize("name", _SCALAR_FORMATS)
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


def plain_int(f) -> bool:
    """Integer formats scaled per tensor by default (their refusals' words are pinned)."""
    return f.kind == "int" and f.scaling is None


@pytest.mark.parametrize("name", [f.name for f in registry(plain_int)])
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


def test_the_per_format_tests_run_over_every_registry_entry_their_rule_admits():
    narrowest = set(_NARROWEST.values())
    if HUNT:
        assert_covers(test_check_raises_what_encode_raises, checkable, "name")
    else:  # each path's narrowest, and every entry whose own NaN/inf codes decide
        assert_covers(
            test_check_raises_what_encode_raises,
            lambda f: checkable(f) and (f.name in narrowest or not _always_scaled(f)),
            "name",
        )
    # in CI every path of the registry takes every scaling through its narrowest entry
    for name in narrowest:
        assert [s for n, s in _CASES if n == name] == SCALINGS, name
    assert_covers(test_checks_without_jax_say_what_encode_says, plain_int, "name")
    if HUNT:
        assert_covers(test_a_scalar_is_one_group_of_one, takes_scalings, "name")
    else:
        assert_covers(
            test_a_scalar_is_one_group_of_one,
            lambda f: takes_scalings(f) and f.name in narrowest,
            "name",
        )
