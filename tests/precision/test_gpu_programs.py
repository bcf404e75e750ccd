"""The programs a GPU runs, read on this CPU: `jax.export(..., platforms=("cuda",))`.

Exporting lowers for CUDA without a GPU, so the StableHLO of each contraction path
can be checked here: the dot's operand types (the narrow containers themselves:
s8, f8, bf16, f16), the precision of every fp8 dot (DEFAULT, which XLA:GPU needs
for cuBLASLt's fast fp8 accumulation, whatever default precision the caller set),
and the result types. Every backend choice in the library follows the platform
being lowered for (`lax.platform_dependent`), not the machine that traces: these
programs are the ones an H100 compiles, though this machine is a CPU.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax import export

import dtypes
import precision

M, K, N = 64, 128, 32

_DOT = re.compile(
    r"stablehlo\.dot_general (?P<args>[^,]+, [^,]+), (?P<attrs>.*?) : "
    r"\(tensor<(?P<a>[^>]*)>, tensor<(?P<b>[^>]*)>\) -> tensor<(?P<out>[^>]*)>"
)
_CONTRACTING = re.compile(r"contracting_dims = \[([\d, ]*)\] x \[([\d, ]*)\]")


def _dots(fn, *args, highest=False):
    """(lhs type, rhs type, result type, attributes) of each dot in `fn`'s CUDA program."""
    jitted = jax.jit(fn)
    if highest:
        with jax.default_matmul_precision("highest"):
            text = export.export(jitted, platforms=("cuda",))(*args).mlir_module()
    else:
        text = export.export(jitted, platforms=("cuda",))(*args).mlir_module()
    found = [m.groupdict() for m in _DOT.finditer(text)]
    assert found, "no dot in the exported program"
    return found


def _elem(t: str) -> str:
    return t.split("x")[-1]


def _operands():
    x = jax.random.normal(jax.random.key(0), (M, K))
    w = jax.random.normal(jax.random.key(1), (K, N))
    return x, w


@pytest.mark.parametrize(
    ("name", "container"),
    [
        ("bfloat16", "bf16"),
        ("float16", "f16"),
        ("float8_e4m3fn", "f8E4M3FN"),
        ("float8_e5m2", "f8E5M2"),
        ("int8", "i8"),
    ],
)
def test_tensor_matmul_contracts_the_narrow_container(name, container):
    x, w = _operands()
    a = precision.Tensor(x).to_reduced_precision(name)
    b = precision.Tensor(w).to_reduced_precision(name)
    (dot,) = _dots(lambda a, b: (a @ b).encoded.data, a, b)
    assert (_elem(dot["a"]), _elem(dot["b"])) == (container, container)
    # int8 sums in int32; bfloat16 results written as bfloat16 (the float32 sums rounded
    # once, as the result's rounding does); the others' float32 sums then rounded
    result = {"i8": "i32", "bf16": "bf16"}.get(container, "f32")
    assert _elem(dot["out"]) == result


@pytest.mark.parametrize("highest", [False, True], ids=["default", "highest"])
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("stored", [False, True], ids=["float32-weight", "stored-weight"])
def test_fp8_contraction_dots_are_fp8_with_fast_accumulation(scaling, stored, highest):
    x, w = _operands()
    if stored:
        scale = dtypes.PerTensor() if scaling == "tensorwise" else dtypes.PerAxis(-1)
        w = precision.Tensor(w).to_reduced_precision("float8_e4m3fn", scaling=scale)
    contract = precision.Contract("float8_e4m3fn", scaling=scaling)
    f = precision.apply(lambda x, w: x @ w, contract=contract)
    for dot in _dots(f, x, w, highest=highest):
        assert (_elem(dot["a"]), _elem(dot["b"]), _elem(dot["out"])) == (
            "f8E4M3FN",
            "f8E4M3FN",
            "f32",
        )
        assert "HIGHEST" not in dot["attrs"]


def test_fp8_fast_accumulation_can_be_turned_off():
    x, w = _operands()
    contract = precision.Contract("float8_e4m3fn", fast_accumulation=False)
    f = precision.apply(lambda x, w: x @ w, contract=contract)
    (dot,) = _dots(f, x, w)
    assert "precision = [HIGHEST, HIGHEST]" in dot["attrs"]


@pytest.mark.parametrize("stored", [False, True], ids=["float32-weight", "stored-int8-weight"])
def test_w8a8_dots_are_s8_with_int32_sums(stored):
    x, w = _operands()
    if stored:
        w = precision.Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1))
    f = precision.apply(lambda x, w: x @ w, contract="int8")
    (dot,) = _dots(f, x, w)
    assert (_elem(dot["a"]), _elem(dot["b"]), _elem(dot["out"])) == ("i8", "i8", "i32")
    # the activation's summed dim is its last (row-major A, as cuBLAS wants it)
    lhs_contracting = _CONTRACTING.search(dot["attrs"]).group(1)
    assert lhs_contracting == "1"


@pytest.mark.parametrize(
    ("name", "scaling", "storage"),
    [
        ("float8_e4m3fn", "tensorwise", dtypes.PerTensor()),
        ("float8_e4m3fn", "rowwise", dtypes.PerAxis(0)),
        ("int8", "rowwise", dtypes.PerAxis(0)),
    ],
)
def test_a_weight_stored_out_in_reaches_the_gemm_as_stored(name, scaling, storage):
    """A weight stored (out, in), as checkpoints of `nn.Linear` hold it, and used as
    `x @ w.T`: the dot takes the stored codes themselves, contracting dim last on both
    operands (A row-major, B column-major, as cuBLASLt's fp8 and int8 GEMMs take them
    before Blackwell): no transpose in the program and no re-quantization."""
    x = jax.random.normal(jax.random.key(0), (M, K))
    w = precision.Tensor(jax.random.normal(jax.random.key(1), (N, K)))
    w = w.to_reduced_precision(name, scaling=storage)
    f = precision.apply(lambda x, w: x @ w.T, contract=precision.Contract(name, scaling=scaling))
    text = export.export(jax.jit(f), platforms=("cuda",))(x, w).mlir_module()
    (dot,) = [m.groupdict() for m in _DOT.finditer(text)]
    assert _CONTRACTING.search(dot["attrs"]).groups() == ("1", "1")
    container = "i8" if name == "int8" else "f8E4M3FN"
    assert dot["b"] == f"{N}x{K}x{container}"
    assert dot["args"].split(", ")[1] == "%arg1"  # the stored codes, as passed in
    assert "stablehlo.transpose" not in text


@pytest.mark.parametrize(
    ("name", "scaling", "storage"),
    [
        ("float8_e4m3fn", "tensorwise", dtypes.PerTensor()),
        ("float8_e4m3fn", "rowwise", dtypes.PerAxis(-1)),
        ("int8", "rowwise", dtypes.PerAxis(-1)),
        ("int8", "rowwise", dtypes.PerTensor()),
    ],
)
@pytest.mark.parametrize("layout", [None, "transposed"])
def test_a_flax_kernel_held_transposed_reaches_the_gemm_as_held(name, scaling, storage, layout):
    """A Flax `Dense` kernel, `(in, out)` and contracted as `x @ w`: converted with
    `layout="transposed"` its codes are held `(out, in)`, and the dot takes them as held,
    the summed dim last on both operands, with no transpose in the program; without
    the layout the summed dim of the stored codes is first (XLA:GPU transposes them)."""
    import flax.linen as nn

    x = jax.random.normal(jax.random.key(0), (M, K))
    model = nn.Dense(N)
    params = model.init(jax.random.key(1), x)
    stored = precision.to_reduced_precision(
        params, name, scaling=storage, where="kernel", layout=layout
    )
    contract = precision.Contract(name, scaling=scaling)
    text = export.export(
        jax.jit(precision.apply(model.apply, contract=contract)), platforms=("cuda",)
    )(stored, x).mlir_module()
    (dot,) = [m.groupdict() for m in _DOT.finditer(text)]
    container = "i8" if name == "int8" else "f8E4M3FN"
    kernel = dot["args"].split(", ")[1]
    if layout is None:
        assert dot["b"] == f"{K}x{N}x{container}"
        assert _CONTRACTING.search(dot["attrs"]).groups() == ("1", "0")
    else:
        assert dot["b"] == f"{N}x{K}x{container}"
        assert _CONTRACTING.search(dot["attrs"]).groups() == ("1", "1")
        assert kernel.startswith("%arg")  # the held codes, as passed in
        assert "stablehlo.transpose" not in text


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_fp8_training_step_dots(scaling):
    """Per tensor, all three dots of an fp8 HYBRID training step are fp8: the forward
    (e4m3 x e4m3, fast accumulation) and both gradient dots (the e5m2 cotangent with
    each operand's e4m3 codes, without it). Per row the weight's scales vary along the
    gradients' sums, so those two dots are float32; the forward stays fp8."""
    x, w = _operands()
    contract = precision.Contract("float8_e4m3fn", backward="float8_e5m2", scaling=scaling)
    f = precision.apply(lambda x, w: jnp.sum((x @ w) ** 2), contract=contract)
    dots = _dots(jax.grad(f, argnums=(0, 1)), x, w)
    assert len(dots) == 3
    kinds = sorted((_elem(d["a"]), _elem(d["b"]), "HIGHEST" in d["attrs"]) for d in dots)
    forward = ("f8E4M3FN", "f8E4M3FN", False)
    if scaling == "tensorwise":
        gradients = [("f8E4M3FN", "f8E5M2", True), ("f8E5M2", "f8E4M3FN", True)]
        assert kinds == sorted([forward, *gradients])
        assert all(_elem(d["out"]) == "f32" for d in dots)
    else:
        assert kinds == sorted([forward, ("f32", "f32", False), ("f32", "f32", False)])


def test_bfloat16_compute_model_dots_are_bf16():
    x, w = _operands()
    v = jax.random.normal(jax.random.key(2), (N, 16))

    def mlp(x, w, v):
        return jax.nn.gelu(x @ w) @ v

    f = precision.apply(mlp, compute="bfloat16")
    dots = _dots(f, x, w, v)
    assert len(dots) == 2
    for dot in dots:  # bfloat16 results: half the bytes a float32 result writes
        assert (_elem(dot["a"]), _elem(dot["b"]), _elem(dot["out"])) == ("bf16", "bf16", "bf16")


def test_the_cpu_program_of_the_same_call_is_float32():
    """The same call lowered for the CPU keeps float32 operands (XLA:CPU's bfloat16 dot
    is slower than float32 without AMX): the choice follows the lowering platform."""
    x, w = _operands()
    a = precision.Tensor(x).to_reduced_precision("bfloat16")
    b = precision.Tensor(w).to_reduced_precision("bfloat16")
    text = export.export(jax.jit(lambda a, b: (a @ b).encoded.data), platforms=("cpu",))(
        a, b
    ).mlir_module()
    (dot,) = [m.groupdict() for m in _DOT.finditer(text)]
    assert (_elem(dot["a"]), _elem(dot["b"])) == ("f32", "f32")
