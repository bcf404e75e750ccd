"""`convert --layout compressed-tensors`: the directory vLLM and transformers load.

The output is read here by `decode`, written from the layout the compressed-tensors
package publishes (its `config.json` scheme, `weight_packed` / `weight_scale` /
`weight_shape`, each code plus 2**(bits-1) in `bits`-bit fields of little-endian int32
words from the low bits, a value is code times its group's scale) in plain numpy, with
nothing of this library's; what it decodes must be, bit for bit, what `precision.load`
decodes from the same conversion in this library's own layout. `load` reads the layout
back into Tensors of the same encodings, and reads what other writers put there
(codes of -2**(bits-1), zero scales) as the layout says.
"""

from __future__ import annotations

import dataclasses
import json
import os

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from gpt2_like import SIDE_FILES, read_directory, size, write_gpt2_like

import precision
from precision._cli import main

# --------------------------------------------------------------------------
# the layout, decoded from its published description


def _float32(dtype: str, raw: np.ndarray) -> np.ndarray:
    if dtype == "BF16":
        return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return raw.astype(np.float32)


# e2m1 codes: sign bit 3, then the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6
_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6] * 2, np.float32) * np.float32([1] * 8 + [-1] * 8)


def _groups(scale: np.ndarray, weights: dict, shape: tuple[int, int]) -> np.ndarray:
    """A scale per value: one for the tensor, per row (channel) or per group of a row."""
    strategy = weights["strategy"]
    if strategy == "tensor":
        assert scale.shape == (1,)
        return np.broadcast_to(scale.reshape(1, 1), shape)
    if strategy == "channel":
        assert scale.shape == (shape[0], 1)
        return np.broadcast_to(scale, shape)
    assert strategy == "group"  # ceil(cols / group_size) groups: the last may be shorter
    size = weights["group_size"]
    assert scale.shape == (shape[0], -(-shape[1] // size))
    return np.repeat(scale, size, axis=1)[:, : shape[1]]


def decode(root) -> dict[str, np.ndarray]:
    """Every tensor of a compressed-tensors directory as float32 values."""
    config = json.loads((root / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors"
    assert config["quantization_status"] == "compressed"
    (group,) = config["config_groups"].values()
    assert group["targets"] == ["Linear"]
    weights = group["weights"]
    assert weights["symmetric"] is True
    assert weights["dynamic"] is False
    tensors, _ = read_directory(root)
    out = {}
    for name, (dtype, raw) in tensors.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith((".weight_scale", ".weight_shape")):
            continue
        quantized = name.endswith(".weight_packed") or (
            name.endswith(".weight") and f"{module}.weight_scale" in tensors
        )
        if not quantized:
            out[name] = _float32(dtype, raw)  # as stored
            continue
        sdtype, sraw = tensors[f"{module}.weight_scale"]
        if name.endswith(".weight_packed") and config["format"] == "pack-quantized":
            assert dtype == "I32"
            bits = weights["num_bits"]
            assert weights["type"] == "int"
            shape = tuple(tensors[f"{module}.weight_shape"][1])
            assert tensors[f"{module}.weight_shape"][0] == "I64"
            words = raw.view(np.uint32)
            assert words.shape == (shape[0], -(-shape[1] * bits // 32))
            j = np.arange(shape[1])
            fields = (words[:, j * bits // 32] >> (j * bits % 32).astype(np.uint32)) & (
                (1 << bits) - 1
            )
            codes = fields.astype(np.int64) - (1 << (bits - 1))
            scale = _groups(_float32(sdtype, sraw), weights, shape)
            out[module + ".weight"] = codes.astype(np.float32) * scale
        elif name.endswith(".weight_packed"):
            assert config["format"] == "mxfp4-pack-quantized"
            assert dtype == "U8"
            assert weights["group_size"] == 32
            assert weights["type"] == "float"
            nibbles = np.stack([raw & 15, raw >> 4], axis=-1).reshape(raw.shape[0], -1)
            shape = nibbles.shape
            scale = np.ldexp(np.float32(1), sraw.astype(np.int32) - 127).astype(np.float32)
            out[module + ".weight"] = _E2M1[nibbles] * np.repeat(scale, 32, axis=1)
        else:
            assert config["format"] == "naive-quantized"
            assert dtype == "F8_E4M3"
            assert weights["type"] == "float"
            assert weights["num_bits"] == 8
            values = raw.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
            out[name] = values * _groups(_float32(sdtype, sraw), weights, raw.shape)
    return out


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


# --------------------------------------------------------------------------
# GPT-2


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub") / "gpt2"
    write_gpt2_like(root, **size())
    return root


@pytest.mark.parametrize(
    ("flags", "bits", "strategy"),
    [
        (["--to", "int4", "--scaling", "per-block:128"], 4, "group"),
        (["--to", "int8", "--scaling", "per-axis:0"], 8, "channel"),
    ],
    ids=["int4-group128", "int8-channel"],
)
def test_gpt2_decodes_bit_for_bit_like_our_layout(gpt2, tmp_path, flags, bits, strategy):
    convert(gpt2, tmp_path / "ct", *flags, "--layout", "compressed-tensors")
    convert(gpt2, tmp_path / "ours", *flags)
    same_bits(decode(tmp_path / "ct"), ours(tmp_path / "ours"))
    config = json.loads((tmp_path / "ct" / "config.json").read_text())
    source = json.loads((gpt2 / "config.json").read_text())
    assert {k: v for k, v in config.items() if k != "quantization_config"} == source
    quant = config["quantization_config"]
    assert quant["format"] == "pack-quantized"
    assert quant["config_groups"]["group_0"]["weights"]["num_bits"] == bits
    assert quant["config_groups"]["group_0"]["weights"]["strategy"] == strategy
    # the layers left in float32 are named (2-D weights: the embeddings; and the tied head)
    assert quant["ignore"] == ["wpe", "wte", "lm_head"]
    for name, text in SIDE_FILES.items():
        assert (tmp_path / "ct" / name).read_text() == text


def test_gpt2_loads_back_as_the_same_tensors(gpt2, tmp_path):
    flags = ["--to", "int4", "--scaling", "per-block:128"]
    convert(gpt2, tmp_path / "ct", *flags, "--layout", "compressed-tensors")
    convert(gpt2, tmp_path / "ours", *flags)
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
        (["--to", "int4", "--keep", "none"], ["'layer.bias'", "2-D weights of Linear", "--keep"]),
    ],
    ids=["nvfp4", "bf16", "columns", "e8m0-scales", "partial-group", "unscaled", "bias"],
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
