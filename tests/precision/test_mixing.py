"""The no-mixing rule: compute formats never meet silently; storage decodes exactly.

Compute formats (unscaled floats) are arithmetic precisions: two different
ones meeting raise. Storage encodings (integer and scaled formats) decode
exactly into the logical dtype, so they meet float32 values and each other
freely, and meeting a narrower compute format needs a declaration.
"""

from __future__ import annotations

import itertools
import operator
import os
import sysconfig
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from op_reference import assert_same_bits, reference_round

import dtypes
import precision
from precision import PrecisionMismatchError, Tensor
from precision.testing._plugin import selected_formats

# Every registry entry takes part (float64 only with 64-bit JAX, as the `fmt` fixture
# chooses), in the role docs/design.md §4 gives it: unscaled float formats compute,
# every other encoding (integers, scaled and block formats, zero points, code books,
# E8M0) is storage.
NAMES = [f.name for f in selected_formats()]


def computes(name: str) -> bool:
    fmt = dtypes.get(name)
    return fmt.kind == "float" and fmt.default_scaling() is None


COMPUTE = [n for n in NAMES if computes(n)]
STORAGE = [n for n in NAMES if not computes(n)]
NARROW = [n for n in COMPUTE if not dtypes.get(n).is_full_precision]
HUNT = os.environ.get("HYPOTHESIS_PROFILE") == "hunt"


def in_turn(
    left: list[str], right: list[str], shift: int = 0, sides: bool = False
) -> list[tuple[str, str]]:
    """Pairs in which every entry of both lists takes part: under the hunt profile the
    full product (both ways round with `sides`), else each entry of the longer list with
    one of the other in turn (on alternate sides with `sides`). Each pair of formats
    compiles every op anew, so the product is kept for hunting."""
    if HUNT:
        pairs = list(itertools.product(left, right))
        return pairs + [(b, a) for a, b in pairs] if sides else pairs
    n = max(len(left), len(right))
    pairs = [(left[i % len(left)], right[(i + shift) % len(right)]) for i in range(n)]
    return [(b, a) if sides and i % 2 else (a, b) for i, (a, b) in enumerate(pairs)]


def test_the_lists_cover_the_registry():
    x64 = jax.config.read("jax_enable_x64")
    assert set(NAMES) == {n for n, f in dtypes.REGISTRY.items() if x64 or f.bits <= 32}
    assert set(COMPUTE) | set(STORAGE) == set(NAMES)
    assert set(NARROW) == set(COMPUTE) - {"float32", "float64"}
    for pairs, left, right in [
        (COMPUTE_PAIRS, COMPUTE, COMPUTE),
        (PAIRS_NEEDING_A_DECLARATION, STORAGE, NARROW),
        (PAIRS_NEEDING_A_DECLARATION, NARROW, STORAGE),
        (EXACT_PAIRS, STORAGE, [*STORAGE, "float32"]),
    ]:
        met = {a for a, b in pairs if b in right} | {b for a, b in pairs if a in right}
        assert met >= set(left), (left, right)
    assert {n for n, _ in SCALAR_CASES} == set(NAMES)


X = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
# 4,096 values for the comparisons of rounded results: most decoded storage values
# are off every compute format's grid, and a sum of two rarely lands on it.
WIDE = np.random.default_rng(11).uniform(-4, 4, (64, 64)).astype(np.float32)


def _tensor(name: str, values: np.ndarray = X) -> Tensor:
    if dtypes.get(name).kind == "scale":  # E8M0 holds positive powers of two only
        values = np.where(values == 0, 1, np.abs(values)).astype(np.float32)
    t = Tensor(values)
    return t if name == "float32" else t.to_reduced_precision(name)


OPS = {
    "add": operator.add,
    "mul": operator.mul,
    "dot_general": operator.matmul,
    "apply": precision.apply(lambda a, b: jnp.tanh(a) @ b.T + 1.0),
}


# Each compute format with the next one (every ordered pair under the hunt profile).
COMPUTE_PAIRS = [(a, b) for a, b in in_turn(COMPUTE, COMPUTE, shift=1) if a != b]


@pytest.mark.parametrize(("left", "right"), COMPUTE_PAIRS)
def test_two_compute_formats_meeting_raise(left, right):
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


PAIRS_NEEDING_A_DECLARATION = in_turn(STORAGE, NARROW, sides=True)


@pytest.mark.parametrize(("left", "right"), PAIRS_NEEDING_A_DECLARATION)
def test_storage_into_a_narrower_compute_format_needs_a_declaration(left, right):
    a, b = _tensor(left), _tensor(right)
    narrow = left if computes(left) else right
    for op in OPS.values():
        with pytest.raises(PrecisionMismatchError) as info:
            op(a, b)
        message = str(info.value)
        assert left in message
        assert right in message
        assert f'precision.apply(f, compute="{narrow}")' in message
    # The declaration it names works: the decoded storage is rounded onto the compute
    # format once, the sum is taken in float32 and rounded once; the expected bits come
    # from ml_dtypes (tf32: a bit manipulation), never from `dtypes`' own rounding.
    big_a, big_b = _tensor(left, WIDE), _tensor(right, WIDE[::-1])
    out = precision.apply(operator.add, compute=narrow)(big_a, big_b)
    assert out.format == dtypes.get(narrow)
    ra, rb = (reference_round(np.asarray(t), narrow) for t in (big_a, big_b))
    assert_same_bits(np.asarray(out), reference_round(ra + rb, narrow), f"{left} + {right}")


# Each storage encoding meets another, and every second one float32 as well, on
# alternating sides; under the hunt profile each meets float32 on both sides and every
# other encoding.
EXACT_PAIRS = [
    (a, b) if i % 4 < 2 else (b, a)
    for i, (a, b) in enumerate(
        (s, "float32" if i % 2 else STORAGE[(i + 1) % len(STORAGE)]) for i, s in enumerate(STORAGE)
    )
]
if HUNT:
    EXACT_PAIRS = [
        *itertools.product(STORAGE, ["float32"]),
        *itertools.product(["float32"], STORAGE),
        *itertools.permutations(STORAGE, 2),
    ]


@pytest.mark.parametrize(("left", "right"), EXACT_PAIRS)
def test_storage_meets_float32_and_other_storage_in_float32(left, right):
    a, b = _tensor(left), _tensor(right)
    da, db = np.asarray(a), np.asarray(b)  # the decoded values, exactly
    for name, op, ref in (
        ("add", operator.add, da + db),
        ("mul", operator.mul, da * db),
        ("matmul", operator.matmul, da.astype(np.float64) @ db.astype(np.float64)),
    ):
        out = op(a, b)
        assert out.format == dtypes.float32, name
        if name == "matmul":
            np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(np.asarray(out), ref)


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
    with pytest.raises(TypeError, match="bfloat16 and float16"):
        precision.apply(lambda a, b: a * b)(_tensor("bfloat16"), _tensor("float16"))


@pytest.mark.parametrize("name", NARROW)
def test_raw_array_with_reduced_tensor_raises(name):
    t = _tensor(name)
    for raw in (jnp.asarray(X), X):
        with pytest.raises(
            PrecisionMismatchError, match=f"full-precision float32 array and a {name}"
        ):
            precision.apply(operator.add)(t, raw)


@pytest.mark.parametrize("name", STORAGE)
def test_raw_array_with_storage_tensor_is_float32_arithmetic(name):
    # an int8 weight and its float32 bias: nothing is rounded that was not asked for
    t = _tensor(name)
    for raw in (jnp.asarray(X), X):
        out = precision.apply(operator.add)(t, raw)
        assert out.format == dtypes.float32
        np.testing.assert_array_equal(np.asarray(out), np.asarray(t) + X)


def test_raw_array_with_full_precision_tensor_is_fine():
    out = precision.apply(operator.add)(Tensor(X), jnp.asarray(X))
    assert isinstance(out, Tensor)
    assert out.format == dtypes.float32
    np.testing.assert_array_equal(np.asarray(out), X + X)


SCALAR_OPS = [
    lambda t: t + 1.5,
    lambda t: 2.0 * t,
    lambda t: t / 4.0,
    lambda t: t - 1,
    lambda t: t**2,
    lambda t: np.float32(3.0) * t,
]
# Each format with two of the six, in turn (each compiles); all six under the hunt profile.
SCALAR_CASES = [
    (name, SCALAR_OPS if HUNT else [SCALAR_OPS[i % 6], SCALAR_OPS[(i + 3) % 6]])
    for i, name in enumerate(NAMES)
]


@pytest.mark.parametrize(("name", "ops"), SCALAR_CASES, ids=[n for n, _ in SCALAR_CASES])
def test_python_scalars_do_not_raise(name, ops):
    t = _tensor(name)
    role_format = dtypes.get(name) if name in COMPUTE else dtypes.float32
    for out in (op(t) for op in ops):
        assert isinstance(out, Tensor)
        assert out.format == role_format


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


# -- implicit conversions outside `apply` (the entry points JAX gives a Tensor) --------------
# JAX asks every object for its array the same way (`__jax_array__`, no word of who asks), so
# the answer is the Tensor's alone: a narrow compute format refuses, whoever asks.

REFUSED = "Tensor of shape .* does not become a JAX array implicitly"


def _bf16(shape=(4,)) -> Tensor:
    return Tensor(
        np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    ).to_reduced_precision("bfloat16")


IMPLICIT = {
    "jnp.asarray": jnp.asarray,
    "jnp.array": jnp.array,
    "jnp.asarray(float32)": lambda t: jnp.asarray(t, jnp.float32),
    "jnp.asarray([t])": lambda t: jnp.asarray([t]),
    "jit(jnp.asarray)": jax.jit(lambda a: jnp.asarray(a)),
    "array + tensor": lambda t: jnp.ones(t.shape) + t,
    "array @ tensor": lambda t: jnp.ones((3, t.shape[0])) @ t,
    "jnp.sin": jnp.sin,
    "jit(jnp.sin)": jax.jit(lambda a: jnp.sin(a)),
    "jit(array * tensor)": lambda t: jax.jit(lambda x, a: x * a)(jnp.ones(t.shape), t),
    "jnp.dot": lambda t: jnp.dot(jnp.ones(t.shape), t),
    "jnp.where": lambda t: jnp.where(True, t, 0.0),
    "closed over in jit": lambda t: jax.jit(lambda x: x @ t)(jnp.ones((3, t.shape[0]))),
    "closed over in apply": lambda t: precision.apply(lambda x: x @ t)(jnp.ones((3, t.shape[0]))),
}


@pytest.mark.parametrize("name", list(IMPLICIT))
@pytest.mark.parametrize("fmt", NARROW)
def test_jax_never_turns_a_compute_tensor_into_float32_silently(name, fmt):
    t = Tensor(np.linspace(-1, 1, 4, dtype=np.float32)).to_reduced_precision(fmt)
    with pytest.raises(PrecisionMismatchError, match=f"a {fmt} {REFUSED}"):
        IMPLICIT[name](t)


def test_the_refusal_names_the_format_the_rule_and_the_explicit_ways():
    with pytest.raises(PrecisionMismatchError) as err:
        jnp.asarray(_bf16((2, 3)))
    message = str(err.value)
    assert message.startswith("a bfloat16 Tensor of shape (2, 3) does not become a JAX array")
    for part in (
        "compute in float32 and drop the bfloat16 format",
        "precision.apply(f)",
        "t.to_full_precision()",
        "precision.to_full_precision(t)",
        "np.asarray(t)",
    ):
        assert part in message, part


def _asarray_in(tmp_path, where: str):
    """`jnp.asarray` written in a file of this kind, and that file's module name."""
    if where == "a script":
        path, module = tmp_path / "script.py", "__main__"
    elif where == "a module of an installed package":
        purelib = sysconfig.get_paths()["purelib"]
        path, module = Path(purelib) / "somepkg" / "convert.py", "somepkg.convert"
    else:
        path, module = tmp_path / "somepkg" / "convert.py", "somepkg.convert"
    scope = {"__name__": module, "jnp": jnp}
    exec(compile("def convert(t):\n    return jnp.asarray(t)\n", str(path), "exec"), scope)
    return scope["convert"]


WHERE = ["a script", "a module of an installed package", "a package checked out"]


@pytest.mark.parametrize("where", WHERE)
def test_the_same_call_is_refused_from_any_caller_and_any_install_location(tmp_path, where):
    # nothing of the caller decides: the same `jnp.asarray(t)` in a script, in a package
    # installed under site-packages and in a checkout raises the same error, eagerly and
    # under jit; a float32 Tensor and a storage encoding convert in all three
    convert = _asarray_in(tmp_path, where)
    t = _bf16((2, 3))
    with pytest.raises(PrecisionMismatchError, match=f"a bfloat16 {REFUSED}"):
        convert(t)
    with pytest.raises(PrecisionMismatchError, match=f"a bfloat16 {REFUSED}"):
        jax.jit(convert)(t)
    for fine in (t.to_full_precision(), Tensor(X).to_reduced_precision("int8")):
        np.testing.assert_array_equal(np.asarray(convert(fine)), np.asarray(fine))


def test_a_flax_model_given_bf16_tensors_outside_apply_is_refused_and_runs_inside():
    nn = pytest.importorskip("flax.linen")
    model = nn.Dense(3)
    x = jnp.ones((2, 4))
    params = precision.to_reduced_precision(model.init(jax.random.key(0), x), "bfloat16")
    with pytest.raises(PrecisionMismatchError, match=f"a bfloat16 {REFUSED}"):
        model.apply(params, x)
    with pytest.raises(PrecisionMismatchError, match=f"a bfloat16 {REFUSED}"):
        jax.jit(model.apply)(params, x)
    xb = Tensor(x).to_reduced_precision("bfloat16")
    out = precision.apply(model.apply)(params, xb)
    assert out.format == dtypes.bfloat16


def test_equinox_and_nnx_models_given_bf16_tensors_outside_apply_are_refused():
    eqx = pytest.importorskip("equinox")
    nnx = pytest.importorskip("flax.nnx")
    x = jnp.ones(4)
    lin = precision.to_reduced_precision(eqx.nn.Linear(4, 3, key=jax.random.key(0)), "bfloat16")
    with pytest.raises(PrecisionMismatchError):
        lin(x)
    layer = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    graph, state = nnx.split(layer)
    state = precision.to_reduced_precision(state, "bfloat16")
    with pytest.raises(PrecisionMismatchError):
        nnx.merge(graph, state)(x[None])


@pytest.mark.parametrize("fmt", ["float32", *STORAGE])
def test_storage_tensors_convert_implicitly_as_the_rules_compute(fmt):
    # storage decodes exactly into float32, which is what `apply` computes in: JAX may
    # take the values anywhere, with the same result as under the rules
    t = _tensor(fmt)
    plain = jnp.sin(t)
    ruled = precision.apply(jnp.sin)(t)
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(ruled))
    np.testing.assert_array_equal(np.asarray(jnp.asarray(t)), np.asarray(t))


def test_the_explicit_conversions_give_the_logical_values():
    t = _bf16((2, 3))
    logical = np.asarray(t)
    assert logical.dtype == np.float32
    full = t.to_full_precision()
    assert full.format == dtypes.float32
    for out in (
        t.numpy(),
        np.array(t),
        precision.to_full_precision(t),
        jax.jit(precision.to_full_precision)(t),
        jnp.asarray(full),
        jax.jit(lambda a: jnp.asarray(a.to_full_precision()))(t),
    ):
        np.testing.assert_array_equal(np.asarray(out), logical)
    assert isinstance(precision.to_full_precision(t), jax.Array)
    np.testing.assert_array_equal(np.asarray(jnp.sin(full)), np.asarray(jnp.sin(logical)))
    grad = jax.grad(lambda a: jnp.sum(precision.to_full_precision(a) ** 2))(t)
    np.testing.assert_array_equal(np.asarray(grad), 2 * logical)
