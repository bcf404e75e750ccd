"""`convert --layout compressed-tensors`: the directory vLLM and transformers load.

The output is read here by `ct_reference.decode`, written from the layout the
compressed-tensors package publishes (its `config.json` scheme, `weight_packed` /
`weight_scale` / `weight_shape`, each code plus 2**(bits-1) in `bits`-bit fields of
little-endian int32 words from the low bits, a value is code times its group's scale) in
plain numpy, with nothing of this library's; what it decodes must be, bit for bit, what
`precision.load` decodes from the same conversion in this library's own layout, and the
tensors kept in float the input's. `load` reads the layout back into Tensors of the same
encodings, and reads what other writers put there (codes of -2**(bits-1), zero scales) as
the layout says.

What the readers would not quantize as a Linear layer's weight (embeddings, GPT-2's
Conv1D layers, a tied head, norms) is kept in float and named in `ignore`, checked here
by the readers' matching rule (`ct_reference.ignored`) without torch;
test_layout_compressed_tensors_package.py loads the same models with transformers.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import safetensors.numpy
from ct_reference import decode, ignored
from gpt2_like import SIDE_FILES, read_directory, size, write_gpt2_like
from llama_like import write_llama_like

import precision
from precision._cli import main


def ours(root) -> dict[str, np.ndarray]:
    """What this library decodes from its own layout."""
    return {k: np.asarray(v) for k, v in precision.load(root, as_arrays=True).items()}


def same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b)
    for name in a:
        assert a[name].shape == b[name].shape, name
        np.testing.assert_array_equal(a[name].view(np.uint32), b[name].view(np.uint32), name)


def convert(src, dst, *flags: str) -> None:
    assert main(["convert", str(src), "-o", str(dst), *flags, "-q"]) == 0


def run(capsys, src, dst, *flags: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["convert", str(src), "-o", str(dst), *flags, "-q"])
    out, err = capsys.readouterr()
    return code, out, err


def quantized_modules(root) -> set[str]:
    """The modules whose weight a compressed-tensors directory stores quantized."""
    tensors, _ = read_directory(root)
    return {n[: -len(".weight_scale")] for n in tensors if n.endswith(".weight_scale")}


def check_ignore(root, source: dict[str, np.ndarray], prefix: str = "") -> list[str]:
    """`ignore` names exactly the modules whose weights are in float, as a reader whose
    module names have `prefix` before the file's matches them; returns `ignore`."""
    ignore = json.loads((root / "config.json").read_text())["quantization_config"]["ignore"]
    quantized = quantized_modules(root)
    for name in source:
        if name.endswith(".weight"):
            module = name[: -len(".weight")]
            assert ignored(ignore, prefix + module) == (module not in quantized), module
    return ignore


def check_values(root, ours_root, source: dict[str, np.ndarray]) -> None:
    """Quantized weights decode, bit for bit, as this library's layout; the rest is the
    input's."""
    got, want = decode(root), ours(ours_root)
    quantized = quantized_modules(root)
    assert set(got) == set(source)
    for name, values in got.items():
        expected = want[name] if name[: -len(".weight")] in quantized else source[name]
        np.testing.assert_array_equal(values.view(np.uint32), expected.view(np.uint32), name)


# --------------------------------------------------------------------------
# Llama: Linear layers, embeddings, norms, a head tied or not


LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.mark.parametrize("keep", [[], ["--keep", "norm"]], ids=["keep-default", "keep-norm"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_llama_quantizes_its_linear_layers_and_names_the_rest_in_ignore(
    tmp_path, capsys, tied, keep
):
    source = write_llama_like(tmp_path / "in", tied=tied)
    flags = ["--to", "int4", "--scaling", "per-block:64", *keep]
    code, out, _ = run(
        capsys, tmp_path / "in", tmp_path / "ct", *flags, "--layout", "compressed-tensors"
    )
    assert code == 0
    convert(tmp_path / "in", tmp_path / "ours", *flags)
    check_values(tmp_path / "ct", tmp_path / "ours", source)
    ignore = check_ignore(tmp_path / "ct", source)
    linear = {n[: -len(".weight")] for n in source if n.split(".")[-2] in LINEAR}
    head = set() if tied else {"lm_head"}
    assert quantized_modules(tmp_path / "ct") == linear | head
    assert ignored(ignore, "lm_head") == tied  # a tied head has no tensor: named all the same
    assert ignored(ignore, "model.embed_tokens")
    assert ignored(ignore, "model.layers.1.input_layernorm")
    embedding = "kept 1: an embedding (by its name): compressed-tensors' readers quantize Linear"
    assert (embedding in out) == bool(keep)  # the default --keep keeps it before the layout
    assert "weight(s) kept in float are listed, by module, in config.json's" in out


def test_a_tied_head_written_in_the_file_is_kept_with_the_embeddings(tmp_path, capsys):
    source = write_llama_like(tmp_path / "in", tied=True, head=True)
    flags = ["--to", "int8", "--layout", "compressed-tensors"]
    code, out, _ = run(capsys, tmp_path / "in", tmp_path / "ct", *flags)
    assert code == 0
    assert "kept 1: the output head, which may share the embeddings' weight" in out
    assert "lm_head" not in quantized_modules(tmp_path / "ct")
    check_ignore(tmp_path / "ct", source)
    # a config that does not say the head is untied: kept too (the class default may tie)
    config = json.loads((tmp_path / "in" / "config.json").read_text())
    del config["tie_word_embeddings"]
    (tmp_path / "in" / "config.json").write_text(json.dumps(config))
    code, out, _ = run(capsys, tmp_path / "in", tmp_path / "ct2", *flags)
    assert "kept 1: the output head" in out


def test_a_mixture_of_experts_router_is_kept_and_its_experts_quantized(tmp_path, capsys):
    source = write_llama_like(tmp_path / "in", tied=False, experts=4)
    flags = ["--to", "int8", "--layout", "compressed-tensors"]
    code, out, _ = run(capsys, tmp_path / "in", tmp_path / "ct", *flags)
    assert code == 0
    routers = "kept 2: a mixture-of-experts router: compressed-tensors' readers do not quantize"
    assert routers in out
    check_ignore(tmp_path / "ct", source)
    quantized = quantized_modules(tmp_path / "ct")
    assert "model.layers.0.block_sparse_moe.experts.3.w2" in quantized
    assert not any(m.endswith(".gate") for m in quantized)


@pytest.mark.parametrize(("dtype", "noted"), [("float32", True), ("bfloat16", False)])
def test_mxfp4_says_to_load_a_float32_model_in_bfloat16(tmp_path, capsys, dtype, noted):
    write_llama_like(tmp_path / "in", tied=False, dtype=dtype)
    flags = ["--to", "mxfp4", "--layout", "compressed-tensors"]
    for out_dir, dry in (("ct", []), ("dry", ["--dry-run"])):
        code, out, _ = run(capsys, tmp_path / "in", tmp_path / out_dir, *flags, *dry)
        assert code == 0
        note = "mxfp4 weights decompress to bfloat16 in transformers: load this float32 model "
        assert (f"{note}with dtype=torch.bfloat16" in out) == noted
    _, out, _ = run(
        capsys, tmp_path / "in", tmp_path / "int4", "--to", "int4", "--layout", "compressed-tensors"
    )
    assert "decompress to bfloat16" not in out


# --------------------------------------------------------------------------
# GPT-2: Conv1D layers, which the readers do not quantize


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub") / "gpt2"
    write_gpt2_like(root, **size())
    return root


@pytest.fixture(scope="module")
def gpt2_head(tmp_path_factory):
    """GPT-2 with an output head of its own: its one Linear layer."""
    root = tmp_path_factory.mktemp("hub") / "gpt2"
    return root, write_gpt2_like(root, **size(), head=True)


@pytest.mark.parametrize("keep", [[], ["--keep", "norm"], ["--keep", "none"]])
def test_gpt2_whose_head_is_tied_is_refused_naming_its_conv1d_layers(gpt2, tmp_path, capsys, keep):
    flags = ["--to", "int4", *keep, "--layout", "compressed-tensors"]
    code, _, err = run(capsys, gpt2, tmp_path / "ct", *flags)
    assert code == 1
    assert "--layout compressed-tensors would quantize none of the tensors asked for" in err
    layers = 4 * size()["n_layer"]
    assert f"{layers} tensors 'h.0.attn.c_attn.weight', 'h.0.attn.c_proj.weight'" in err
    assert "a Conv1D weight of gpt2, (in, out)" in err
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize(
    ("flags", "bits", "strategy"),
    [
        (["--to", "int4", "--scaling", "per-block:128"], 4, "group"),
        (["--to", "int8", "--scaling", "per-axis:0", "--keep", "norm"], 8, "channel"),
    ],
    ids=["int4-group128", "int8-channel-keep-norm"],
)
def test_gpt2_keeps_its_conv1d_layers_in_float_and_names_them(
    gpt2_head, tmp_path, capsys, flags, bits, strategy
):
    root, source = gpt2_head
    layout = ["--layout", "compressed-tensors"]
    code, out, _ = run(capsys, root, tmp_path / "ct", *flags, *layout)
    assert code == 0
    layers = 4 * size()["n_layer"]
    assert f"kept {layers}: a Conv1D weight of gpt2, (in, out): compressed-tensors' readers" in out
    convert(root, tmp_path / "ours", *flags)
    check_values(tmp_path / "ct", tmp_path / "ours", source)
    assert quantized_modules(tmp_path / "ct") == {"lm_head"}
    # GPT2LMHeadModel names the checkpoint's modules under `transformer.`; GPT2Model not
    check_ignore(tmp_path / "ct", source, prefix="transformer.")
    check_ignore(tmp_path / "ct", source)
    config = json.loads((tmp_path / "ct" / "config.json").read_text())
    source_config = json.loads((root / "config.json").read_text())
    assert {k: v for k, v in config.items() if k != "quantization_config"} == source_config
    quant = config["quantization_config"]
    assert quant["format"] == "pack-quantized"
    assert quant["config_groups"]["group_0"]["weights"]["num_bits"] == bits
    assert quant["config_groups"]["group_0"]["weights"]["strategy"] == strategy
    for name, text in SIDE_FILES.items():
        assert (tmp_path / "ct" / name).read_text() == text


def test_gpt2_loads_back_as_the_same_tensors(gpt2_head, tmp_path):
    root, _ = gpt2_head
    flags = ["--to", "int4", "--scaling", "per-block:128"]
    convert(root, tmp_path / "ct", *flags, "--layout", "compressed-tensors")
    convert(root, tmp_path / "ours", *flags, "--exclude", "c_attn|c_proj|c_fc")
    got, want = precision.load(tmp_path / "ct"), precision.load(tmp_path / "ours")
    assert set(got) == set(want)
    for name, tensor in got.items():
        assert (tensor.format, tensor.scaling) == (want[name].format, want[name].scaling), name
        assert np.array_equal(np.asarray(tensor), np.asarray(want[name]))


# --------------------------------------------------------------------------
# every format and scaling the layout holds, on one Linear layer


def model(root, shape=(48, 96), seed=1) -> np.ndarray:
    """A one-layer model directory: `layer.weight`, `layer.bias`, config.json."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32)
    w[3] = 0  # an all-zero row: scale 1 in every layout
    root.mkdir()
    tensors = {"layer.weight": w, "layer.bias": rng.standard_normal(shape[0]).astype(np.float32)}
    safetensors.numpy.save_file(tensors, str(root / "model.safetensors"), {"format": "pt"})
    (root / "config.json").write_text('{"model_type": "toy"}')
    return w


WORDS = [  # rows of whole 32-bit words
    ["--to", "int2", "--scaling", "per-block:16:fp16"],
    ["--to", "int4", "--scaling", "per-tensor:bf16"],
    ["--to", "int4", "--scaling", "per-axis:0"],
    ["--to", "int8", "--scaling", "per-block:32:pow2"],
    ["--to", "float8_e4m3fn", "--scaling", "per-axis:0"],
    ["--to", "float8_e4m3fn", "--scaling", "per-tensor"],
    ["--to", "mxfp4"],
]
PADDED = [  # 102 values a row: the last word of each row is padded
    ["--to", "int2", "--scaling", "per-tensor"],
    ["--to", "int4", "--scaling", "per-axis:0"],
    ["--to", "int8", "--scaling", "per-axis:0:fp16"],
    ["--to", "int4", "--scaling", "per-block:34:bf16"],  # three groups a row
]


@pytest.mark.parametrize(
    ("flags", "shape"),
    [(f, (48, 96)) for f in WORDS] + [(f, (5, 102)) for f in PADDED],
    ids=[" ".join(f[1::2]) for f in WORDS] + [" ".join(f[1::2]) + " padded" for f in PADDED],
)
def test_each_format_decodes_like_ours_and_loads_back(tmp_path, flags, shape):
    model(tmp_path / "in", shape)
    convert(tmp_path / "in", tmp_path / "ct", *flags, "--layout", "compressed-tensors")
    convert(tmp_path / "in", tmp_path / "ours", *flags)
    same_bits(decode(tmp_path / "ct"), ours(tmp_path / "ours"))
    got, want = precision.load(tmp_path / "ct"), precision.load(tmp_path / "ours")
    for name in want:
        scaling = want[name].scaling
        if scaling is not None and any("pow2" in f for f in flags):
            # the layout records no power-of-two rule: the same scales load as plain ones
            scaling = dataclasses.replace(scaling, power_of_two=False)
        assert (got[name].format, got[name].scaling) == (want[name].format, scaling)


# --------------------------------------------------------------------------
# what other writers put in the layout


def _write_layout(root, codes: np.ndarray, scale: np.ndarray, bits: int, group: int) -> None:
    """A pack-quantized directory written from the layout's description (not by convert)."""
    rows, cols = codes.shape
    fields = (codes.astype(np.int64) + (1 << (bits - 1))).astype(np.uint64)
    words = np.zeros((rows, -(-cols * bits // 32)), np.uint64)
    for j in range(cols):
        words[:, j * bits // 32] |= fields[:, j] << np.uint64(j * bits % 32)
    root.mkdir()
    tensors = {
        "layer.weight_packed": words.astype(np.uint32).view(np.int32),
        "layer.weight_scale": scale,
        "layer.weight_shape": np.array([rows, cols], np.int64),
    }
    safetensors.numpy.save_file(tensors, str(root / "model.safetensors"), {"format": "pt"})
    weights = {"num_bits": bits, "type": "int", "symmetric": True, "strategy": "group"}
    quant = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights | {"group_size": group}}
        },
    }
    (root / "config.json").write_text(json.dumps({"quantization_config": quant}))


@pytest.mark.parametrize(("bits", "low", "held_as"), [(4, -8, "int8"), (8, -128, "float32")])
def test_codes_a_symmetric_format_leaves_out_load_exactly(tmp_path, bits, low, held_as):
    rng = np.random.default_rng(0)
    codes = rng.integers(low, -low, size=(4, 64))
    codes[0, 0] = low
    scale = rng.uniform(0.01, 1, size=(4, 2)).astype(np.float32)
    scale[1, 1] = 0  # another writer's all-zero group: its values are 0
    codes[1, 32:] = 0
    _write_layout(tmp_path / "m", codes, scale, bits, 32)
    (tensor,) = precision.load(tmp_path / "m").values()
    assert tensor.format.name == held_as
    want = codes.astype(np.float32) * np.repeat(scale, 32, axis=1)
    np.testing.assert_array_equal(np.asarray(tensor).view(np.uint32), want.view(np.uint32))


def test_a_quantized_model_directory_is_read_only_through_its_config(tmp_path):
    codes = (np.arange(64) % 15 - 7).reshape(1, 64)
    _write_layout(tmp_path / "m", codes, np.full((1, 2), 0.5, np.float32), 4, 32)
    (tensor,) = precision.load(tmp_path / "m").values()
    assert (tensor.format.name, str(tensor.scaling)) == ("int4", "per-block 32 on axis -1")
    raw = precision.load(tmp_path / "m" / "model.safetensors")  # one file: read as it is
    assert set(raw) == {"layer.weight_packed", "layer.weight_scale", "layer.weight_shape"}


# --------------------------------------------------------------------------
# refusals


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--to", "nvfp4"], ["mxfp4-pack-quantized", "--to mxfp4"]),
        (["--to", "bf16"], ["holds int8, int4 and int2", "--to int8"]),
        (["--to", "int4", "--scaling", "per-axis:1"], ["per row", "--scaling per-axis:0"]),
        (["--to", "int8", "--scaling", "per-block:32:pow2:e8m0"], ["float8_e8m0fnu", ":bf16"]),
        (["--to", "int4", "--scaling", "per-block:64"], ["divide each row", "per-axis:0"]),
        (["--to", "float8_e4m3fn"], ["a scale with every weight", "per-axis:0"]),
    ],
    ids=["nvfp4", "bf16", "columns", "e8m0-scales", "partial-group", "unscaled"],
)
def test_what_the_layout_cannot_hold_is_refused_before_converting(tmp_path, capsys, flags, words):
    model(tmp_path / "in")
    out = tmp_path / "ct"
    argv = ["convert", str(tmp_path / "in"), "-o", str(out), *flags, "-q"]
    assert main([*argv, "--layout", "compressed-tensors"]) == 1
    err = capsys.readouterr().err
    assert "--layout compressed-tensors cannot hold" in err
    for word in words:
        assert word in err
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_what_is_not_a_linear_weight_is_kept_and_said_so(tmp_path, capsys):
    """--keep none asks for the bias too: the layout keeps it, in the plan and the summary."""
    model(tmp_path / "in")
    flags = ["--to", "int4", "--keep", "none", "--layout", "compressed-tensors"]
    code, out, _ = run(capsys, tmp_path / "in", tmp_path / "dry", *flags, "--dry-run")
    assert code == 0
    bias = next(line for line in out.splitlines() if line.startswith("layer.bias "))
    assert "unchanged" in bias
    assert "not a 2-D weight: compressed-tensors quantizes those of Linear layers only" in bias
    code, out, _ = run(capsys, tmp_path / "in", tmp_path / "ct", *flags)
    assert code == 0
    assert "converted 1 tensor(s) to int4 (per-block 32 on axis -1), kept 1 unchanged" in out
    assert "  kept 1: not a 2-D weight: compressed-tensors quantizes those of Linear" in out
    assert quantized_modules(tmp_path / "ct") == {"layer"}


def test_a_kept_module_whose_name_ends_a_quantized_one_is_refused(tmp_path, capsys):
    """An ignore entry for `proj` matches `block.proj` under a prefix: no entry names one
    module and not the other, so the conversion is refused, naming both."""
    rng = np.random.default_rng(0)
    tensors = {
        n: rng.standard_normal((8, 32)).astype(np.float32)
        for n in ("proj.weight", "block.proj.weight")
    }
    (tmp_path / "in").mkdir()
    safetensors.numpy.save_file(tensors, str(tmp_path / "in" / "model.safetensors"))
    (tmp_path / "in" / "config.json").write_text("{}")
    flags = ["--to", "int8", "--exclude", "^proj", "--layout", "compressed-tensors"]
    code, _, err = run(capsys, tmp_path / "in", tmp_path / "ct", *flags)
    assert code == 1
    assert "module 'proj' is kept in float and 'block.proj' quantized" in err
    assert sorted(os.listdir(tmp_path)) == ["in"]
    # the other way round, the names tell them apart
    flags = ["--to", "int8", "--exclude", "^block", "--layout", "compressed-tensors"]
    code, _, _ = run(capsys, tmp_path / "in", tmp_path / "ct", *flags)
    assert code == 0
    ignore = check_ignore(tmp_path / "ct", tensors, prefix="model.")
    assert not ignored(ignore, "model.proj")
    assert ignored(ignore, "model.block.proj")


def test_mxfp4_rows_of_partial_blocks_are_refused(tmp_path, capsys):
    model(tmp_path / "in", (5, 102))  # 3 blocks of 32 and 6 values a row
    argv = ["convert", str(tmp_path / "in"), "-o", str(tmp_path / "ct"), "--to", "mxfp4"]
    assert main([*argv, "--layout", "compressed-tensors", "-q"]) == 1
    err = capsys.readouterr().err
    assert "divide each row" in err
    assert "--to int4 --scaling per-axis:0" in err
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_the_layout_needs_a_model_directory(tmp_path, capsys):
    model(tmp_path / "in")
    argv = ["convert", str(tmp_path / "in" / "model.safetensors"), "-o", str(tmp_path / "o")]
    assert main([*argv, "--to", "int4", "--layout", "compressed-tensors", "-q"]) == 2
    assert "give IN as the model's directory" in capsys.readouterr().err
    argv = ["convert", str(tmp_path / "in"), "-o", str(tmp_path / "o.safetensors")]
    assert main([*argv, "--to", "int4", "--layout", "compressed-tensors", "-q"]) == 2
    assert "writes a directory" in capsys.readouterr().err
    (tmp_path / "in" / "config.json").write_text('{"quantization_config": {}}')
    argv = ["convert", str(tmp_path / "in"), "-o", str(tmp_path / "o")]
    assert main([*argv, "--to", "int4", "--layout", "compressed-tensors", "-q"]) == 1
    assert "already has a quantization_config" in capsys.readouterr().err
    for text, words in (("{model_type: toy", "is not JSON"), ("[]", "holds list, not a JSON")):
        (tmp_path / "in" / "config.json").write_text(text)
        assert main([*argv, "--to", "int4", "--layout", "compressed-tensors", "-q"]) == 1
        assert f"config.json {words}" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_scales_are_stored_in_the_format_asked(tmp_path):
    model(tmp_path / "in")
    flags = ["--to", "int8", "--scaling", "per-axis:0:bf16", "--layout", "compressed-tensors"]
    convert(tmp_path / "in", tmp_path / "ct", *flags)
    tensors, _ = read_directory(tmp_path / "ct")
    assert tensors["layer.weight_scale"][0] == "BF16"
    assert tensors["layer.weight_scale"][1].shape == (48, 1)
    assert tensors["layer.weight_packed"][1].shape == (48, 24)
    assert tensors["layer.bias"][0] == "F32"
