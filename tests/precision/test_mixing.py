"""The no-mixing rule: formats never meet silently; weak scalars adopt a format."""

from __future__ import annotations

import itertools
import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import dtypes
import precision
from precision import PrecisionMismatchError, Tensor

# float64 needs 64-bit JAX; every other format takes part.
NAMES = [name for name in dtypes.FORMATS if name != "float64"]
X = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)


def _tensor(name: str) -> Tensor:
    t = Tensor(X)
    return t if name == "float32" else t.to_reduced_precision(name)


OPS = {
    "add": operator.add,
    "mul": operator.mul,
    "dot_general": operator.matmul,
    "apply": precision.apply(lambda a, b: jnp.tanh(a) @ b.T + 1.0),
}


@pytest.mark.parametrize(("left", "right"), list(itertools.permutations(NAMES, 2)), ids="-".join)
def test_every_ordered_pair_of_formats_raises(left, right):
    a, b = _tensor(left), _tensor(right)
    for op_name, op in OPS.items():
        with pytest.raises(PrecisionMismatchError) as info:
            op(a, b)
        message = str(info.value)
        prim = {"apply": "dot_general"}.get(op_name, op_name)
        assert f"`{prim}`" in message or op_name == "apply"
        assert left in message
        assert right in message
        assert "to_reduced_precision" in message
        assert "to_full_precision" in message


def test_message_names_op_formats_and_fix():
    a, b = _tensor("bfloat16"), _tensor("float16")
    with pytest.raises(PrecisionMismatchError) as info:
        a + b
    assert str(info.value) == (
        "cannot combine bfloat16 and float16 tensors in `add`; convert one explicitly, "
        'e.g. b.to_reduced_precision("bfloat16") or a.to_full_precision()'
    )
    # the suggested fixes work
    assert (a + b.to_reduced_precision("bfloat16")).format == dtypes.bfloat16
    assert (a.to_full_precision() + b.to_full_precision()).format == dtypes.float32


def test_mixing_is_a_type_error_caught_as_such():
    with pytest.raises(TypeError, match="int8 and int4"):
        precision.apply(lambda a, b: a * b)(_tensor("int8"), _tensor("int4"))


@pytest.mark.parametrize("name", [n for n in NAMES if n != "float32"])
def test_raw_array_with_reduced_tensor_raises(name):
    t = _tensor(name)
    for raw in (jnp.asarray(X), X):
        with pytest.raises(
            PrecisionMismatchError, match=f"full-precision float32 array and a {name}"
        ):
            precision.apply(operator.add)(t, raw)


def test_raw_array_with_full_precision_tensor_is_fine():
    out = precision.apply(operator.add)(Tensor(X), jnp.asarray(X))
    assert isinstance(out, Tensor)
    assert out.format == dtypes.float32
    np.testing.assert_array_equal(np.asarray(out), X + X)


@pytest.mark.parametrize("name", NAMES)
def test_python_scalars_do_not_raise(name):
    t = _tensor(name)
    for out in (t + 1.5, 2.0 * t, t / 4.0, t - 1, t**2, np.float32(3.0) * t):
        assert isinstance(out, Tensor)
        assert out.format == dtypes.get(name)


def test_constants_inside_the_function_are_weak():
    def f(x):
        return x * jnp.arange(2.0)[None, :] + jnp.ones((2, 2)) * 0.5

    out = precision.apply(f)(_tensor("float16"))
    assert out.format == dtypes.float16
    np.testing.assert_array_equal(
        np.asarray(out), (X.astype(np.float16) * np.arange(2.0)[None] + 0.5).astype(np.float32)
    )


def test_mixing_inside_control_flow_raises():
    a, b = _tensor("bfloat16"), _tensor("float16")

    def scan_mix(a, b):
        return lax.scan(lambda c, row: (c + row, c), jnp.zeros(2), a @ b)[0]

    with pytest.raises(PrecisionMismatchError, match="dot_general"):
        precision.apply(scan_mix)(a, b)

    def inner_mix(a, b):
        return lax.scan(lambda c, row: (c * b[0], c), a[0], None, length=2)[0]

    with pytest.raises(PrecisionMismatchError, match="bfloat16 and float16"):
        precision.apply(inner_mix)(a, b)

    def cond_mix(a, b):
        return lax.cond(True, lambda: a[0], lambda: b[0])

    with pytest.raises(PrecisionMismatchError, match="`cond`"):
        precision.apply(cond_mix)(a, b)


def test_mixing_raises_under_jit_too():
    with pytest.raises(PrecisionMismatchError):
        jax.jit(operator.add)(_tensor("bfloat16"), _tensor("int8"))
