"""One resolver: every entry point that takes a format refuses a bad one alike.

`dtypes.get` is the one place a format name is read; `precision` resolves every
format argument through it. So a bad argument (an unknown name, a misspelled
one, a value that is not a name at all) raises the very exception `dtypes.get`
raises, with the same message, wherever it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import pytest

import dtypes
import precision
from precision import Contract, Policy, Tensor

X = jnp.ones((4, 8))

# Where a format is given: each entry takes the bad value and passes it on.
ENTRY_POINTS: dict[str, Callable[[Any], Any]] = {
    "dtypes.get": dtypes.get,
    "Tensor.to_reduced_precision": lambda v: Tensor(X).to_reduced_precision(v),
    "apply(compute=)": lambda v: precision.apply(jnp.sin, compute=v)(X),
    "Policy(params=)": lambda v: Policy(params=v),
    "Policy(compute=)": lambda v: Policy(compute=v),
    "Policy(output=)": lambda v: Policy(output=v),
    "Contract(forward)": lambda v: Contract(v),
    "Contract(backward=)": lambda v: Contract("int8", backward=v),
    "apply(contract=)": lambda v: precision.apply(jnp.dot, contract=v)(X, X.T),
    "to_reduced_precision(tree)": lambda v: precision.to_reduced_precision({"w": X}, v),
    "quantize": lambda v: precision.quantize({"w": X}, v),
    "default_format": lambda v: precision.default_format(v).__enter__(),
}

# None is no format, but some arguments take it to mean a default (the default
# format, no declared compute format, the params format, no backward quantization,
# no contract); those are left out of None's row.
NONE_IS_A_DEFAULT = {
    "Tensor.to_reduced_precision",
    "apply(compute=)",
    "Policy(compute=)",
    "Policy(output=)",
    "Contract(backward=)",
    "apply(contract=)",
    "to_reduced_precision(tree)",
}

# `contract=` takes a Contract or a format: a name goes to `Contract`, and a value of
# another type is refused as a contract (its message shows both forms).
NAMES_ONLY = {"apply(contract=)"}

BAD = [
    pytest.param("bflaot16", id="misspelled"),
    pytest.param("float7", id="unknown-name"),
    pytest.param("", id="empty-name"),
    pytest.param(3, id="int"),
    pytest.param(2.5, id="float"),
    pytest.param(None, id="None"),
]


def _refusal(call: Callable[[], Any]) -> BaseException:
    with pytest.raises(precision.PrecisionError) as info:
        call()
    return info.value


@pytest.mark.parametrize("value", BAD)
def test_a_bad_format_is_refused_alike_everywhere(value):
    expected = _refusal(lambda: dtypes.get(value))
    assert isinstance(expected, dtypes.FormatError)  # every bad format argument is one
    if not isinstance(value, str):
        assert isinstance(expected, TypeError)  # and a value of the wrong kind a TypeError
    names = [
        n
        for n in ENTRY_POINTS
        if not (value is None and n in NONE_IS_A_DEFAULT)
        and (isinstance(value, str) or n not in NAMES_ONLY)
    ]
    for name in names:
        got = _refusal(lambda name=name: ENTRY_POINTS[name](value))
        assert (type(got), str(got)) == (type(expected), str(expected)), name


def test_the_message_names_the_argument_and_the_fix():
    message = str(_refusal(lambda: Contract("bflaot16")))
    assert "'bflaot16'" in message
    assert "did you mean 'bfloat16'" in message
    assert "mxfp4" in message  # the named encodings are known too
    assert "nf4" in message
    assert "got int 3" in str(_refusal(lambda: Policy(compute=3)))


@pytest.mark.parametrize("name", list(dtypes.REGISTRY))
def test_every_registered_name_and_alias_resolves_through_precision(name):
    fmt = dtypes.REGISTRY[name]
    aliases = {**dtypes.ALIASES, **dtypes.ENCODING_ALIASES}
    for spelling in (name, name.upper(), *(a for a, n in aliases.items() if n == name)):
        with precision.default_format(spelling) as resolved:
            assert resolved is fmt
