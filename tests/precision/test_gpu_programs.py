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
import ml_dtypes
import numpy as np
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


def _cuda_text(fn, *args):
    """The StableHLO of `jit(fn)` lowered for CUDA (on any machine)."""
    return export.export(jax.jit(fn), platforms=("cuda",))(*args).mlir_module()


def _dots(fn, *args, highest=False):
    """(lhs type, rhs type, result type, attributes) of each dot in `fn`'s CUDA program."""
    if highest:
        with jax.default_matmul_precision("highest"):
            text = _cuda_text(fn, *args)
    else:
        text = _cuda_text(fn, *args)
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
    # int8 sums in int32; bfloat16 and float16 results written in their format (the
    # float32 sums rounded once, as the result's rounding does); float8's float32 sums
    # then rounded
    result = {"i8": "i32", "bf16": "bf16", "f16": "f16"}.get(container, "f32")
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


# --- float convert round trips: what XLA:GPU's SimplifyFPConversions deletes ------------

_NAME = r'"[^"]+"|[\w.$-]+'
_FUNC = re.compile(rf"func\.func (?:public |private )?@(?P<name>{_NAME})\((?P<args>.*?)\) ->")
_CONVERT = re.compile(
    r"(?P<out>%[\w#]+) = stablehlo\.convert (?P<src>%[\w#]+) : "
    r"\(tensor<(?P<a>[^>]*)>\) -> tensor<(?P<b>[^>]*)>"
)
_CALL = re.compile(
    rf"(?P<out>%\w+)(?::(?P<n>\d+))? = (?:func\.)?call @(?P<f>{_NAME})\((?P<ops>[^)]*)\)"
)
_RETURN = re.compile(r"^\s*(?:func\.)?return (?P<ops>[^:]*) :")
_REGION_OP = re.compile(r'(?P<out>%\w+)(?::(?P<n>\d+))? = "stablehlo\.\w+"\(.*\(\{$')
_DEF = re.compile(r"\s*(%\w+)(?::\d+)? = (.*)")
# A narrowing convert of a value already on the narrow grid changes nothing, and neither
# does deleting its round trip: a `reduce_precision`, a format's exact rounding (the
# straight-through `round_ste` of `dtypes`), or a value widened from that type.
_ON_GRID = re.compile(
    r"stablehlo\.reduce_precision|call @\"?round_ste"
    r"|stablehlo\.convert .*\(tensor<[^>]*(?:bf16|f16|f8\w*)>\)"
)
_REGION_RETURN = re.compile(r"^\s*stablehlo\.return (?P<ops>[^:]*) :")
_WIDTH = {"f64": 64, "f32": 32, "bf16": 16, "f16": 16}


def _float_width(t: str) -> int | None:
    elem = t.split("x")[-1]
    if elem in _WIDTH:
        return _WIDTH[elem]
    return 8 if elem.startswith("f8") else (4 if elem.startswith("f4") else None)


_VALUE = re.compile(r"%\w+")
_BLOCK_ARGS = re.compile(r"^\s*\^bb\d+\((?P<args>.*)\):")


def _scoped_names(text: str) -> str:
    """`text` with each value defined inside a region (a conditional's branch, a loop's
    body) renamed apart from the values of other regions: MLIR's printer numbers sibling
    regions from the same start, so `%65` in one branch and `%65` in the next are two
    values. A name visible in a region (its own, an enclosing region's, the function's)
    is never reused there, so a use is the nearest visible definition."""
    out: list[str] = []
    scopes: list[list[str]] = []  # the names each open scope defines, innermost last
    visible: dict[str, str] = {}
    count = 0

    def rename(m: re.Match[str]) -> str:
        return visible.get(m.group(0), m.group(0))

    for line in text.splitlines():
        stripped = line.strip()
        if _FUNC.search(line):
            scopes.clear()
            visible.clear()
        elif stripped.startswith("}") and scopes:
            for name in scopes.pop():
                visible.pop(name, None)
        d, b = _DEF.match(line), _BLOCK_ARGS.match(line)
        # (what a line defines, its head, is renamed after its uses, the rest, are read)
        if b:
            defined, head, rest = re.findall(r"(%\w+):", b.group("args")), line, ""
        elif d:
            defined, head, rest = [d.group(1)], line[: d.start(2)], line[d.start(2) :]
        else:
            defined, head, rest = [], "", line
        rest = _VALUE.sub(rename, rest)
        if len(scopes) > 1:  # (inside a region: the function's own body is scope 1)
            count += 1
            for name in defined:
                visible[name] = f"{name}_r{count}"
                scopes[-1].append(name)
            head = _VALUE.sub(rename, head)
        out.append(head + rest)
        if stripped.endswith("{"):
            scopes.append([])
    return "\n".join(out)


def _convert_round_trips(text: str) -> list[tuple[str, str]]:
    """Float converts that widen a value a float convert narrowed, followed across the
    module's function calls (XLA inlines them) and into the regions of conditionals
    (`_scoped_names`): XLA:GPU's SimplifyFPConversions pass replaces such a chain with
    its input where excess precision is allowed, its default, so the widened value would
    be the unrounded one. (narrow type, wide type) of each."""
    funcs: dict[str, tuple[list[str], list[str]]] = {}
    current = None
    for line in _scoped_names(text).splitlines():
        m = _FUNC.search(line)
        if m:
            current = m.group("name")
            args = re.findall(r"(%arg\d+):", m.group("args"))
            funcs[current] = (args, [])
        elif current is not None:
            funcs[current][1].append(line)
    narrowed: set[tuple[str, str]] = set()  # (function, value) made by a narrowing convert
    returns: dict[str, set[int]] = {}  # function -> positions of narrowed results
    found: set[tuple[str, str, str, str]] = set()
    changed = True
    while changed:
        changed = False
        for name, (_, lines) in funcs.items():
            stack: list[tuple[str, str | None]] = []
            defs: dict[str, str] = {}  # value -> the op that makes it
            for line in lines:
                d = _DEF.match(line)
                if d:
                    defs[d.group(1)] = d.group(2)
                c = _CONVERT.search(line)
                if c:
                    wa, wb = _float_width(c.group("a")), _float_width(c.group("b"))
                    on_grid = _ON_GRID.match(defs.get(c.group("src").split("#")[0], ""))
                    if (
                        wa
                        and wb
                        and wb < wa
                        and not on_grid
                        and (name, c.group("out")) not in narrowed
                    ):
                        narrowed.add((name, c.group("out")))
                        changed = True
                    if wa and wb and wb > wa and (name, c.group("src")) in narrowed:
                        found.add((name, c.group("out"), c.group("a"), c.group("b")))
                call = _CALL.search(line)
                if call and call.group("f") in funcs:
                    callee_args = funcs[call.group("f")][0]
                    ops = [o.strip() for o in call.group("ops").split(",") if o.strip()]
                    for op, arg in zip(ops, callee_args, strict=False):
                        if (name, op) in narrowed and (call.group("f"), arg) not in narrowed:
                            narrowed.add((call.group("f"), arg))
                            changed = True
                    for i in returns.get(call.group("f"), set()):
                        out = call.group("out") + (f"#{i}" if call.group("n") else "")
                        if (name, out) not in narrowed:
                            narrowed.add((name, out))
                            changed = True
                region = _REGION_OP.search(line.rstrip())
                if region:  # a conditional (or a reduction): its results are its regions'
                    stack.append((region.group("out"), region.group("n")))
                elif line.strip().startswith("})") and stack:
                    stack.pop()
                r = _REGION_RETURN.search(line)
                if r and stack:
                    out, n = stack[-1]
                    for i, op in enumerate(o.strip() for o in r.group("ops").split(",")):
                        result = out + (f"#{i}" if n else "")
                        if (name, op) in narrowed and (name, result) not in narrowed:
                            narrowed.add((name, result))
                            changed = True
                r = _RETURN.search(line)
                if r:
                    ops = [o.strip() for o in r.group("ops").split(",")]
                    for i, op in enumerate(ops):
                        if (name, op) in narrowed and i not in returns.setdefault(name, set()):
                            returns[name].add(i)
                            changed = True
    return sorted({(_elem(a), _elem(b)) for _, _, a, b in found})


_SIBLING_REGIONS = """
func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf16>) -> (tensor<4xf32>) {
    %0 = "stablehlo.case"(%c) ({
      %2 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xf16>
      stablehlo.return %2 : tensor<4xf16>
    }) : (tensor<i32>) -> tensor<4xf16>
    %1 = "stablehlo.case"(%c) ({
      %2 = stablehlo.negate %arg1 : tensor<4xf16>
      %3 = stablehlo.convert %2 : (tensor<4xf16>) -> tensor<4xf32>
      stablehlo.return %3 : tensor<4xf32>
    }, {
      %2 = stablehlo.convert %0 : (tensor<4xf16>) -> tensor<4xf32>
      stablehlo.return %2 : tensor<4xf32>
    }) : (tensor<i32>) -> tensor<4xf32>
    return %1 : tensor<4xf32>
}
"""


def test_the_round_trip_detector_tells_the_values_of_sibling_regions_apart():
    """`%2` narrowed in one branch is not the `%2` a sibling branch widens (MLIR numbers
    sibling regions alike), while a value narrowed outside a region and widened in it
    is a round trip."""
    one = _SIBLING_REGIONS.split("    }, {\n")[0]
    assert _convert_round_trips(one + "    }) : (tensor<i32>) -> tensor<4xf32>\n}") == []
    assert _convert_round_trips(_SIBLING_REGIONS) == [("f16", "f32")]


def test_the_round_trip_detector_sees_a_plain_astype_round_trip():
    """The check below must see what XLA:GPU deletes: an `astype` there and back, also
    across a jitted function's boundary."""
    x, _ = _operands()
    assert _convert_round_trips(
        _cuda_text(lambda x: x.astype(jnp.float8_e4m3fn).astype(jnp.float32), x)
    ) == [("f8E4M3FN", "f32")]
    inner = jax.jit(lambda x: x.astype(jnp.bfloat16) * 2)
    assert _convert_round_trips(_cuda_text(lambda x: inner(x).astype(jnp.float32), x)) == []
    narrow = jax.jit(lambda x: x.astype(jnp.float8_e5m2))
    assert _convert_round_trips(_cuda_text(lambda x: narrow(x).astype(jnp.float32), x)) == [
        ("f8E5M2", "f32")
    ]


@pytest.mark.parametrize(
    "contract",
    [
        precision.Contract("float8_e4m3fn"),
        precision.Contract("float8_e4m3fn", scaling="rowwise"),
        precision.Contract("float8_e4m3fn", backward="float8_e5m2"),
        precision.Contract("float8_e4m3fn", backward="float8_e5m2", scaling="rowwise"),
        precision.Contract("float8_e5m2"),
        precision.Contract("int8"),
    ],
    ids=["e4m3", "e4m3-rowwise", "hybrid", "hybrid-rowwise", "e5m2", "int8"],
)
def test_no_quantized_value_is_widened_by_a_convert_in_a_training_step(contract):
    """The backward pass contracts the quantized operands' values. Taken from the codes
    with a float convert, XLA:GPU would delete the quantize-and-widen pair and hand the
    gradients the unquantized operands (other bits than every other backend's). The
    codes' values are read from their bits there."""
    x, w = _operands()
    f = precision.apply(lambda x, w: jnp.sum((x @ w) ** 2), contract=contract)
    assert _convert_round_trips(_cuda_text(jax.grad(f, argnums=(0, 1)), x, w)) == []


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"])
def test_no_rounded_value_is_widened_by_a_convert_in_tensor_programs(name):
    """Encoding, decoding, arithmetic and contractions of unscaled float Tensors, and a
    compute-format model: every value a convert narrowed is read back from its bits or
    was on the format's grid before the convert (a `reduce_precision` first)."""
    x, w = _operands()

    def f(x, w):
        a = precision.Tensor(x).to_reduced_precision(name)
        b = precision.Tensor(w).to_reduced_precision(name)
        return ((a @ b) * 3.0 + 1.0).to_full_precision()

    assert _convert_round_trips(_cuda_text(f, x, w)) == []


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_no_rounded_value_is_widened_by_a_convert_in_a_compute_format_gradient(name):
    """The gradient of a model under a bfloat16 or float16 compute format: its dots take
    the cotangent in the format and write the gradients in it (no float32 result narrowed
    by a convert and widened again). Under a float8 compute format JAX's transpose of the
    f8 dot narrows its float32 gradient to f8 and widens it: a pair XLA may delete, which
    is harmless there because the exact rounding of `_narrow_gradient` follows."""
    x, w = _operands()
    model = precision.apply(lambda x, w: jax.nn.gelu(x @ w).sum(), compute=name)
    assert _convert_round_trips(_cuda_text(jax.grad(model, argnums=(0, 1)), x, w)) == []


# --- on an accelerator: its gradients against the host CPU's (skipped on a CPU) --------


def _on_both(fn, *args):
    """`fn(*args)` jitted on the default device and on the host CPU, as float64 arrays."""
    if jax.default_backend() == "cpu":
        pytest.skip("needs an accelerator: compares its gradients with the host CPU's")
    here = jax.jit(fn)(*args)
    cpu = jax.devices("cpu")[0]
    host = jax.jit(fn)(*jax.device_put(args, cpu))
    as64 = lambda t: [np.asarray(v, np.float64) for v in jax.tree_util.tree_leaves(t)]
    return as64(here), as64(host)


def test_on_an_accelerator_fp8_gradients_take_the_quantized_operands():
    """The gradient into the activation of a rowwise fp8 contraction is the cotangent
    contracted with the *quantized* weight on the accelerator as on the host CPU: closer
    to that than to the float32 weight's product by far (a deleted convert round trip
    would give the latter)."""
    x, w = _operands()
    contract = precision.Contract("float8_e4m3fn", scaling="rowwise")
    f = precision.apply(lambda x, w: jnp.sum(x @ w), contract=contract)
    (gx, _), (hx, _) = _on_both(jax.grad(f, argnums=(0, 1)), x, w)
    w8 = precision.Tensor(w).to_reduced_precision("float8_e4m3fn", scaling=dtypes.PerAxis(1))
    quantized = np.asarray(w8.to_full_precision(), np.float64).sum(axis=1)
    plain = np.asarray(w, np.float64).sum(axis=1)
    for got in (gx, hx):
        assert np.max(np.abs(got - quantized)) < 1e-5 * np.max(np.abs(quantized))
        assert np.max(np.abs(got - plain)) > 1e-3 * np.max(np.abs(plain))


@pytest.mark.parametrize(
    ("name", "dtype"), [("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)]
)
def test_on_an_accelerator_compute_format_gradients_equal_the_host_cpus(name, dtype):
    """Under `compute="bfloat16"` or `"float16"` both backends round the contraction's
    cotangent and gradients to the format: the same values, but where float32 sums in
    another order fall on the other side of a midpoint (one step)."""
    x, w = _operands()
    f = precision.apply(lambda x, w: jnp.sum(jnp.sin(x @ w)), compute=name)
    here, host = _on_both(jax.grad(f, argnums=(0, 1)), x, w)
    info = ml_dtypes.finfo(dtype)
    for a, b in zip(here, host, strict=True):
        assert np.array_equal(a.astype(dtype).astype(np.float64), a)
        step = np.abs(b) * 2.0**-info.nmant + float(info.smallest_subnormal)
        assert np.all(np.abs(a - b) <= step)
        assert np.mean(a == b) > 0.99
