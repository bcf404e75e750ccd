"""`convert --layout gguf-tensors`: one GGUF file of the tensors alone (their own names),
read here by the `gguf` package's own reader (llama.cpp's files: test_gguf_llama_cpp.py).

`gguf.GGUFReader` opens the output and `gguf.quants.dequantize` (the package's numpy
port of ggml's dequantization) turns its Q8_0 and Q4_0 tensors into exactly, bit for
bit, the float32 values `precision.load` decodes from the same conversion in this
library's own layout; MXFP4 into the same numbers (ggml reads e2m1's negative zero as
+0). `load` reads the file back into Tensors of the same encodings, and reads what
ggml's own quantizers write (Q4_0's codes of -8 and negative scales) exactly as
`dequantize` does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy
from gpt2_like import size, write_gpt2_like

import dtypes
import precision
from precision._checkpoint import _gguf
from precision._cli import main

gguf = pytest.importorskip("gguf")


def convert(src, dst, *flags: str) -> None:
    assert main(["convert", str(src), "-o", str(dst), *flags, "-q"]) == 0


def ours(path) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in precision.load(path, as_arrays=True).items()}


def dequantized(path) -> dict[str, tuple[str, np.ndarray]]:
    """{name: (ggml type, float32 values)} of a GGUF file, by the gguf package alone."""
    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        if t.tensor_type.name.startswith("I"):  # integer arrays: as they are
            out[t.name] = (t.tensor_type.name, np.array(t.data))
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # ggml counts from the end
        out[t.name] = (t.tensor_type.name, values.reshape(shape))
    return out


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub") / "gpt2"
    write_gpt2_like(root, **size())
    return root


@pytest.mark.parametrize(("to", "kind"), [("int8", "Q8_0"), ("int4", "Q4_0")])
def test_gpt2_dequantizes_bit_for_bit_to_our_values(gpt2, tmp_path, to, kind):
    flags = ["--to", to, "--scaling", "per-block:32:fp16"]
    convert(gpt2, tmp_path / "model.gguf", *flags, "--layout", "gguf-tensors")
    convert(gpt2, tmp_path / "ours", *flags)
    got, want = dequantized(tmp_path / "model.gguf"), ours(tmp_path / "ours")
    assert set(got) == set(want)  # the Hugging Face names, every tensor
    for name, (ggml_type, values) in got.items():
        # what --keep keeps by default (norms, biases, embeddings) stays F32
        converted = name.startswith("h.") and name.endswith(".weight") and ".ln_" not in name
        assert ggml_type == (kind if converted else "F32"), name
        assert values.shape == want[name].shape, name
        np.testing.assert_array_equal(values.view(np.uint32), want[name].view(np.uint32), name)
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    converted_by = reader.fields["precision.converted_by"].contents()
    assert converted_by.startswith(f"precision convert --to {to}")
    assert "general.architecture" not in reader.fields  # not one llama.cpp knows: see docs


def test_gpt2_loads_back_as_the_same_tensors(gpt2, tmp_path):
    flags = ["--to", "int4", "--scaling", "per-block:32:fp16"]
    convert(gpt2, tmp_path / "model.gguf", *flags, "--layout", "gguf-tensors")
    convert(gpt2, tmp_path / "ours", *flags)
    got, want = precision.load(tmp_path / "model.gguf"), precision.load(tmp_path / "ours")
    assert set(got) == set(want)
    for name, tensor in got.items():
        assert (tensor.format, tensor.scaling) == (want[name].format, want[name].scaling), name
        assert np.array_equal(np.asarray(tensor), np.asarray(want[name]))


def model(root, shape=(8, 64), seed=2) -> None:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32)
    w[1] = 0
    root.mkdir()
    tensors = {"layer.weight": w, "layer.bias": rng.standard_normal(shape[0]).astype(np.float32)}
    safetensors.numpy.save_file(tensors, str(root / "model.safetensors"), {"format": "pt"})


@pytest.mark.parametrize(
    ("flags", "kind"),
    [(["--to", "mxfp4"], "MXFP4"), (["--to", "bf16"], "BF16"), (["--to", "fp16"], "F16")],
    ids=["mxfp4", "bf16", "fp16"],
)
def test_other_types_hold_our_values(tmp_path, flags, kind):
    model(tmp_path / "in")
    convert(tmp_path / "in", tmp_path / "m.gguf", *flags, "--layout", "gguf-tensors")
    convert(tmp_path / "in", tmp_path / "ours", *flags)
    got, want = dequantized(tmp_path / "m.gguf"), ours(tmp_path / "ours")
    ggml_type, values = got["layer.weight"]
    assert ggml_type == kind
    if kind == "MXFP4":
        np.testing.assert_array_equal(values, want["layer.weight"])  # -0 reads as +0
    else:
        np.testing.assert_array_equal(values.view(np.uint32), want["layer.weight"].view(np.uint32))
    loaded, mine = precision.load(tmp_path / "m.gguf"), precision.load(tmp_path / "ours")
    weight = loaded["layer.weight"]
    if kind == "MXFP4":  # a storage encoding: loaded as it is
        assert (weight.format, weight.scaling) == (
            mine["layer.weight"].format,
            mine["layer.weight"].scaling,
        )
    else:  # a float tensor of another tool: its full-precision values, as any foreign file
        assert weight.format.name == "float32"
    assert np.array_equal(np.asarray(weight), np.asarray(mine["layer.weight"]))


# --------------------------------------------------------------------------
# what ggml's own quantizers write


def test_files_ggml_quantized_load_exactly_as_they_dequantize(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[2, :32] = 0  # a block of zeros: scale 0 in ggml's Q4_0 and Q8_0
    path = tmp_path / "theirs.gguf"
    writer = gguf.GGUFWriter(str(path), arch="test")
    for kind in ("Q8_0", "Q4_0", "MXFP4"):
        qtype = gguf.GGMLQuantizationType[kind]
        writer.add_tensor(kind, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    writer.add_tensor("f16", x.astype(np.float16))
    writer.add_tensor("ids", np.arange(5, dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    got = precision.load(path)
    want = dequantized(path)
    for name in ("Q8_0", "Q4_0", "MXFP4", "f16"):
        values, expected = np.asarray(got[name]), want[name][1]
        # bit for bit but for the sign of zero: an integer code holds none, and ggml's
        # Q4_0 scale is negative where a block's largest magnitude is positive (-0.0)
        np.testing.assert_array_equal(values, expected)
        nonzero = expected != 0
        assert np.array_equal(values[nonzero].view(np.uint32), expected[nonzero].view(np.uint32))
    # ggml's Q4_0 scale is max / -8: codes of -8 and negative scales, held in int8
    assert got["Q4_0"].format.name == "int8"
    assert got["Q8_0"].format.name == "int8"
    assert got["MXFP4"].format.name == "mxfp4"
    assert np.asarray(got["ids"]).tolist() == [0, 1, 2, 3, 4]


def test_a_type_no_format_holds_is_refused_by_name(tmp_path):
    path = tmp_path / "k.gguf"
    writer = gguf.GGUFWriter(str(path), arch="test")
    qtype = gguf.GGMLQuantizationType.Q4_1
    writer.add_tensor(
        "w", gguf.quants.quantize(np.ones((2, 32), np.float32), qtype), raw_dtype=qtype
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(precision.CheckpointError, match=r"'w' is ggml type Q4_1.*dequantize"):
        precision.load(path)


# --------------------------------------------------------------------------
# refusals and atomicity


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--to", "int4", "--scaling", "per-block:32"], ["Q4_0", "--scaling per-block:32:fp16"]),
        (["--to", "int8", "--scaling", "per-axis:0"], ["Q8_0", "--scaling per-block:32:fp16"]),
        (["--to", "float8_e4m3fn"], ["GGUF holds", "--to mxfp4"]),
        (["--to", "nvfp4"], ["GGUF holds", "--to int8 or int4"]),
        (
            ["--to", "int8", "--scaling", "per-block:32:fp16", "--max-shard-size", "1KB"],
            ["one file"],
        ),
    ],
    ids=["int4-f32-scales", "int8-channel", "e4m3", "nvfp4", "shards"],
)
def test_what_gguf_cannot_hold_is_refused_before_converting(tmp_path, capsys, flags, words):
    model(tmp_path / "in")
    out = tmp_path / "m.gguf"
    code = main(
        ["convert", str(tmp_path / "in"), "-o", str(out), *flags, "--layout", "gguf-tensors"]
    )
    assert code in (1, 2)
    err = capsys.readouterr().err
    for word in words:
        assert word in err
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_an_unsigned_array_kept_as_it_is_has_no_gguf_type(tmp_path, capsys):
    src = tmp_path / "m.safetensors"
    tensors = {"w": np.ones((4, 32), np.float32), "mask": np.ones(4, np.uint8)}
    safetensors.numpy.save_file(tensors, str(src))
    argv = ["convert", str(src), "-o", str(tmp_path / "m.gguf"), "--to", "int8"]
    assert main([*argv, "--scaling", "per-block:32:fp16", "--layout", "gguf-tensors"]) == 1
    assert "tensor 'mask': kept as uint8, which has no GGUF type" in capsys.readouterr().err


def test_an_existing_file_is_replaced_only_with_overwrite(tmp_path, capsys):
    model(tmp_path / "in")
    out = tmp_path / "m.gguf"
    out.write_bytes(b"keep me")
    argv = [
        "convert",
        str(tmp_path / "in"),
        "-o",
        str(out),
        "--to",
        "bf16",
        "--layout",
        "gguf-tensors",
    ]
    assert main([*argv, "-q"]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert out.read_bytes() == b"keep me"
    assert main([*argv, "-q", "--overwrite"]) == 0
    assert _gguf.is_gguf(str(out))


def test_a_failed_write_leaves_nothing(tmp_path, capsys, monkeypatch):
    model(tmp_path / "in")

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_gguf, "block_bytes", broken)
    argv = ["convert", str(tmp_path / "in"), "-o", str(tmp_path / "m.gguf"), "--to", "mxfp4"]
    assert main([*argv, "--layout", "gguf-tensors", "-q"]) == 1
    assert "No space left" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_without_the_gguf_package_the_extra_is_named(tmp_path, capsys, monkeypatch):
    model(tmp_path / "in")
    convert(tmp_path / "in", tmp_path / "m.gguf", "--to", "bf16", "--layout", "gguf-tensors")
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    argv = ["convert", str(tmp_path / "in"), "-o", str(tmp_path / "n.gguf"), "--to", "bf16"]
    assert main([*argv, "--layout", "gguf-tensors", "-q"]) == 1
    assert "pip install 'precision[gguf]'" in capsys.readouterr().err
    with pytest.raises(ModuleNotFoundError, match=r"precision\[gguf\]"):
        precision.load(tmp_path / "m.gguf")


def test_loading_the_library_imports_no_gguf():
    code = (
        "import sys, precision; precision.load; import precision._cli._output_layouts; "
        "assert 'gguf' not in sys.modules and 'jax' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------
# llama.cpp's file (--layout gguf): what is refused, presets, report


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("tokenizers")
    from hf_tiny import write_llama

    root = tmp_path_factory.mktemp("hub") / "llama"
    write_llama(root)
    return root


def test_int_without_scaling_takes_ggml_blocks(tmp_path, capsys):
    model(tmp_path / "in")
    for flags, kind in (
        (["--to", "int4"], "Q4_0"),
        (["--to", "int8"], "Q8_0"),
        (["--preset", "q4_0"], "Q4_0"),
        (["--preset", "q8_0"], "Q8_0"),
        (["--preset", "mxfp4"], "MXFP4"),
    ):
        out = tmp_path / f"{kind}-{flags[0]}.gguf"
        convert(tmp_path / "in", out, *flags, "--layout", "gguf-tensors")
        assert dequantized(out)["layer.weight"][0] == kind, flags
    assert "per-block 32 on axis -1, float16 scales" in capsys.readouterr().out


def test_report_lists_types_bytes_and_keys(llama, tmp_path, capsys):
    convert(llama, tmp_path / "m.gguf", "--preset", "q4_0", "--layout", "gguf")
    capsys.readouterr()
    assert main(["report", str(tmp_path / "m.gguf")]) == 0
    out = capsys.readouterr().out
    for word in ("general.architecture", "llama", "llama.attention.head_count_kv", "2"):
        assert word in out
    assert "llama.attention.layer_norm_rms_epsilon  1e-05" in out
    assert "tokenizer.ggml.tokens" in out
    assert re.search(r"blk\.0\.attn_q\.weight\s+Q4_0\s+64x64\s+2\.2 KiB", out)  # 18 B / 32
    assert main(["report", str(tmp_path / "m.gguf"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    sizes = {t["name"]: (t["type"], t["bytes"]) for t in doc["tensors"]}
    assert sizes["blk.0.attn_q.weight"] == ("Q4_0", 64 * 64 // 32 * 18)
    assert sizes["blk.0.attn_norm.weight"] == ("F32", 64 * 4)
    assert doc["keys"]["llama.block_count"] == 2
    assert main(["report", str(llama / "model.safetensors")]) == 2
    assert "give OTHER too" in capsys.readouterr().err


def _edited(src, dst, *, config=None, drop=()):
    shutil.copytree(src, dst)
    if config:
        doc = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**doc, **config}))
    for name in drop:
        (dst / name).unlink()
    return dst


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (
            {"config": {"architectures": ["MistralForCausalLM"]}},
            ["'MistralForCausalLM'", "LlamaForCausalLM, GPT2LMHeadModel", "gguf-tensors"],
        ),
        ({"config": {"rope_scaling": {"type": "yarn"}}}, ["rope_scaling", "gguf-tensors"]),
        ({"config": {"hidden_act": "gelu"}}, ["hidden_act = 'gelu'"]),
        ({"drop": ["tokenizer.json"]}, ["has no tokenizer.json"]),
        ({"drop": ["config.json"]}, ["config.json", "gguf-tensors"]),
    ],
    ids=["architecture", "rope-scaling", "activation", "no-tokenizer", "no-config"],
)
def test_what_llama_cpp_would_not_run_is_refused(llama, tmp_path, capsys, edit, words):
    src = _edited(llama, tmp_path / "in", **edit)
    out = tmp_path / "m.gguf"
    assert main(["convert", str(src), "-o", str(out), "--to", "bf16", "--layout", "gguf"]) == 1
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err
    assert not out.exists()


def test_a_tensor_llama_does_not_have_is_refused_by_name(llama, tmp_path, capsys):
    src = _edited(llama, tmp_path / "in")
    tensors = safetensors.numpy.load_file(str(src / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_norm.weight"] = np.ones(16, np.float32)
    safetensors.numpy.save_file(tensors, str(src / "model.safetensors"))
    argv = ["convert", str(src), "-o", str(tmp_path / "m.gguf"), "--to", "bf16"]
    assert main([*argv, "--layout", "gguf"]) == 1
    err = capsys.readouterr().err
    assert "'model.layers.0.self_attn.q_norm.weight' is not part of LlamaForCausalLM" in err


# --------------------------------------------------------------------------
# calibrated weights written for llama.cpp as they are


def calibrated(
    weights: dict[str, np.ndarray], name: str, conv1d: bool, fmt: str, method: str = "gptq"
) -> dict:
    """`weights` with `name` converted by `precision.calibrate` (int4 or Q4_0's grid in
    blocks of 32 inputs, float16 scales) on random inputs (a Conv1D weight's inputs: its
    first axis)."""
    rng = np.random.default_rng(0)
    inputs = weights[name].shape[0 if conv1d else 1]
    batches = [rng.standard_normal((512, inputs)).astype(np.float32) for _ in range(2)]

    def f(p, x):
        return x @ (p[name] if conv1d else p[name].T)

    scaling = dtypes.PerBlock(32, scale_format="float16")
    q = precision.calibrate(
        f, {name: weights[name]}, batches, method=method, format=fmt, scaling=scaling
    )
    return {**weights, **q}


@pytest.mark.parametrize(("arch", "fmt"), [("llama", "int4"), ("gpt2", "q4_0")])
def test_calibrated_codes_are_written_as_they_are(tmp_path, arch, fmt):
    pytest.importorskip("tokenizers")
    from hf_tiny import write_gpt2, write_llama

    weights = (write_llama if arch == "llama" else write_gpt2)(tmp_path / "hf", layers=1)
    hf = "h.0.attn.c_attn.weight" if arch == "gpt2" else "model.layers.0.mlp.down_proj.weight"
    tree = calibrated(weights, hf, conv1d=arch == "gpt2", fmt=fmt)
    shutil.copytree(
        tmp_path / "hf", tmp_path / "cal", ignore=shutil.ignore_patterns("*.safetensors")
    )
    precision.save(tmp_path / "cal" / "model.safetensors", tree)
    convert(tmp_path / "cal", tmp_path / "m.gguf", "--preset", "q4_0", "--layout", "gguf")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    got = {t.name: t for t in reader.tensors}
    t = got["blk.0.attn_qkv.weight" if arch == "gpt2" else "blk.0.ffn_down.weight"]
    assert t.tensor_type.name == "Q4_0"
    values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(t.shape.tolist()[::-1])
    want = np.asarray(tree[hf])
    want = want.T if arch == "gpt2" else want  # ggml's (outputs, inputs)
    np.testing.assert_array_equal(values, want)  # GPTQ's codes and scales, as they are
    if fmt == "int4":
        rtn = dtypes.get("int4").encode(weights[hf], scaling=tree[hf].scaling).decode()
    else:  # Q4_0's grid: round-to-nearest onto it is ggml's own quantizer, value for value
        rtn = calibrated(weights, hf, conv1d=True, fmt=fmt, method="rtn")[hf]
        q4 = gguf.GGMLQuantizationType.Q4_0
        theirs = gguf.quants.dequantize(gguf.quants.quantize(weights[hf].T.copy(), q4), q4)
        np.testing.assert_array_equal(np.asarray(rtn).T, theirs)
    assert not np.array_equal(np.asarray(rtn), np.asarray(tree[hf]))  # (not rounding's)


def test_the_summary_names_the_axis_conv1d_weights_were_blocked_on(tmp_path, capsys):
    """GPT-2's Conv1D weights are quantized with their blocks along the inputs (axis 0) for
    ggml's rows: the summary line names that axis, not the run's own (axis -1)."""
    pytest.importorskip("tokenizers")
    from hf_tiny import write_gpt2

    write_gpt2(tmp_path / "hf", layers=1)
    flags = ["--layout", "gguf", "--preset", "q4_0"]
    assert main(["convert", str(tmp_path / "hf"), "-o", str(tmp_path / "m.gguf"), *flags]) == 0
    out = capsys.readouterr().out
    assert "blocks along the inputs: 4 weight(s)" in out
    assert "tensor(s) to int4 (per-block 32 on axis 0, float16 scales)" in out
    assert "axis -1" not in out


def test_stored_codes_are_not_rounded_again(tmp_path, capsys):
    """Codes that never reach 7 (rounding them again would rescale every block)."""
    pytest.importorskip("tokenizers")
    from hf_tiny import write_llama

    weights = write_llama(tmp_path / "hf", layers=1)
    name = "model.layers.0.self_attn.v_proj.weight"
    rng = np.random.default_rng(3)
    codes = rng.integers(-3, 4, weights[name].shape)
    scales = rng.uniform(0.01, 0.1, (weights[name].shape[0], weights[name].shape[1] // 32))
    scaling = dtypes.PerBlock(32, axis=1, scale_format="float16")
    enc = dtypes.from_codes(codes, scales.astype(np.float16), "int4", scaling)
    tree = {**weights, name: precision.Tensor.from_encoded(enc)}
    shutil.copytree(tmp_path / "hf", tmp_path / "q", ignore=shutil.ignore_patterns("*.safetensors"))
    precision.save(tmp_path / "q" / "model.safetensors", tree)
    convert(tmp_path / "q", tmp_path / "m.gguf", "--to", "int4", "--layout", "gguf")
    assert ": stored as Q4_0 already: written as is" in capsys.readouterr().out
    t = next(t for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors if "attn_v" in t.name)
    values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(weights[name].shape)
    np.testing.assert_array_equal(values, np.asarray(enc.decode()))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("flags", [["--preset", "q4_0"], ["--to", "int4"]], ids=["preset", "to"])
def test_q4_0_in_llama_cpp_files_is_ggml_own_rounding_byte_for_byte(tmp_path, arch, flags):
    """A float weight written as Q4_0 into llama.cpp's file holds the bytes ggml's own
    quantizer (the `gguf` package's port of it) makes of the same matrix: Q4_0's whole
    grid (codes -8..7 times `max / -8`), not this library's int4 (-7..7)."""
    pytest.importorskip("tokenizers")
    from hf_tiny import write_gpt2, write_llama

    (write_llama if arch == "llama" else write_gpt2)(tmp_path / "hf", layers=1)
    convert(tmp_path / "hf", tmp_path / "f32.gguf", "--to", "float32", "--layout", "gguf")
    convert(tmp_path / "hf", tmp_path / "q4.gguf", *flags, "--layout", "gguf")
    f32 = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "f32.gguf")).tensors}
    q4_0 = gguf.GGMLQuantizationType.Q4_0
    written = 0
    for t in gguf.GGUFReader(str(tmp_path / "q4.gguf")).tensors:
        if t.tensor_type != q4_0:
            continue
        ref = f32[t.name]
        values = np.array(ref.data, np.float32).reshape(ref.shape.tolist()[::-1])
        theirs = gguf.quants.quantize(values, q4_0)
        np.testing.assert_array_equal(np.array(t.data).reshape(theirs.shape), theirs, t.name)
        written += 1
    assert written >= 4  # every matrix of the block (attention and MLP)


def test_q4_0_with_another_rounding_mode_is_this_librarys_int4(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from hf_tiny import write_llama

    write_llama(tmp_path / "hf", layers=1)
    convert(tmp_path / "hf", tmp_path / "q.gguf", "--preset", "q4_0", "--layout", "gguf",
            "--rounding", "toward_zero", "--dry-run")  # fmt: skip
    out = capsys.readouterr().out
    assert "int4" in out
    assert "q4_0" not in out
    convert(tmp_path / "hf", tmp_path / "q.gguf", "--preset", "q4_0", "--layout", "gguf",
            "--dry-run")  # fmt: skip
    assert "q4_0" in capsys.readouterr().out
