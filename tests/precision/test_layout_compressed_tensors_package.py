"""`convert --layout compressed-tensors`, decompressed by the compressed-tensors package.

Needs the `compressed-tensors` extra (`pip install -e '.[compressed-tensors]'`), which
pulls in torch and transformers and so is not part of `dev`; without the package this
file is skipped. test_layout_compressed_tensors.py checks the same output with a reader
written from the published layout; here transformers loads whole models
(`AutoModelForCausalLM.from_pretrained`, Llama with its head tied or not, GPT-2 with its
Conv1D layers) with no missing or unexpected key, and its logits are, bit for bit, those
of the same architecture loaded from weights that `ct_reference.decode` decoded from the
files in numpy; and the package reads one layer of every format two ways:

* `CompressedTensorsDequantizer`, its dequantization of a checkpoint directory:
  it parses `config.json`'s `quantization_config` (its pydantic `QuantizationConfig`),
  picks each scheme's compressor (`pack-quantized`, `naive-quantized`,
  `mxfp4-pack-quantized`) and decompresses every quantized weight; `validate` also
  refuses quantization arrays left over;
* the route transformers takes to load a model: `ModelCompressor.from_compression_config`,
  `apply_quantization_config` and `compress_model` on a model of `torch.nn.Linear`
  layers (built on the meta device), which register the arrays the package expects,
  then our file loaded with `load_state_dict(strict=True)` (names and shapes must match
  those), then `decompress_model`.

What is compared: the package dequantizes in the dtype of the scales, `code.to(scale.dtype)
* scale` (E8M0 scales as bfloat16 powers of two). With float32 scales its float32 weights
are, bit for bit, what `precision.load` decodes from the same conversion in this
library's own layout. With bfloat16 or float16 scales the package rounds each product to
that dtype, where we keep it in float32: an int code of at most 8 bits times a 16-bit
scale is exact in float32, so the package's weights are, bit for bit, ours rounded to
nearest in the scales' dtype (which is all a bfloat16 or float16 model holds). An e2m1
value times a power of two is exact in bfloat16, so MXFP4 matches as it is. Tensors left
unconverted come back as stored.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from ct_reference import decode, ignored
from gpt2_like import size, write_gpt2_like
from llama_like import write_llama_like

import precision
from precision._cli import main

pytest.importorskip(
    "compressed_tensors",
    reason="needs the compressed-tensors extra (it pulls in torch): "
    "pip install -e '.[compressed-tensors]'",
)

import safetensors.torch
import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.format import infer_module_format
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from compressed_tensors.entrypoints.convert import CompressedTensorsDequantizer
from compressed_tensors.quantization import (
    QuantizationConfig,
    apply_quantization_config,
)
from compressed_tensors.utils.match import match_name
from transformers import AutoModelForCausalLM, CompressedTensorsConfig
from transformers.utils import logging as transformers_logging

#: The dtype the package computes a weight in, by the dtype of its stored scales.
COMPUTED_IN = {
    torch.float32: np.float32,
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.float16: np.float16,
    torch.uint8: ml_dtypes.bfloat16,  # E8M0 scales, decompressed to bfloat16
}


def convert(src, dst, *flags: str) -> None:
    assert main(["convert", str(src), "-o", str(dst), *flags, "-q"]) == 0


def model(root, shape: tuple[int, int]) -> None:
    """A one-Linear-layer model directory: `layer.weight`, `layer.bias`, config.json."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal(shape).astype(np.float32)
    w[3] = 0  # an all-zero row
    root.mkdir()
    tensors = {"layer.weight": w, "layer.bias": rng.standard_normal(shape[0]).astype(np.float32)}
    safetensors.numpy.save_file(tensors, str(root / "model.safetensors"), {"format": "pt"})
    (root / "config.json").write_text('{"model_type": "toy"}')


def files(root) -> dict[str, torch.Tensor]:
    """Every tensor of a model directory's safetensors files, read by safetensors' torch API."""
    out: dict[str, torch.Tensor] = {}
    for path in sorted(root.glob("*.safetensors")):
        out |= safetensors.torch.load_file(str(path))
    return out


def quantization_config(root) -> tuple[dict, QuantizationConfig]:
    """config.json's quantization_config as written, and as the package parses it."""
    written = json.loads((root / "config.json").read_text())["quantization_config"]
    return written, QuantizationConfig.model_validate(written)


def check_config(written: dict, parsed: QuantizationConfig) -> None:
    """The package reads our config as written: one scheme, the compressor we named."""
    assert parsed.quant_method == "compressed-tensors"
    assert parsed.quantization_status == "compressed"
    assert parsed.format == written["format"]
    assert parsed.ignore == written["ignore"]
    (scheme,) = parsed.config_groups.values()
    assert scheme.targets == ["Linear"]
    assert scheme.input_activations is None
    assert scheme.output_activations is None
    weights = written["config_groups"]["group_0"]["weights"]
    assert {k: getattr(scheme.weights, k) for k in weights} == weights
    assert scheme.weights.block_structure is None
    assert scheme.weights.actorder is None
    # the compressor the package picks for a Linear layer of this scheme is the format named
    assert infer_module_format(torch.nn.Linear, scheme).value == written["format"]


def expected(ours: np.ndarray, scale: torch.Tensor | None) -> np.ndarray:
    """Our float32 values as the package computes them: in the dtype of the scales."""
    if scale is None:
        return ours  # not quantized: as stored
    return ours.astype(COMPUTED_IN[scale.dtype]).astype(np.float32)


def same_bits(got: torch.Tensor, want: np.ndarray, name: str) -> None:
    values = got.detach().to(torch.float32).numpy()  # bfloat16 and float16 widen exactly
    assert values.shape == want.shape, name
    np.testing.assert_array_equal(values.view(np.uint32), want.view(np.uint32), name)


def dequantized(root) -> dict[str, torch.Tensor]:
    """Every tensor of a compressed-tensors directory, quantized weights decompressed."""
    dequantizer = CompressedTensorsDequantizer(str(root), dtype=torch.float32)
    return dequantizer.validate(files(root))


def ours(root) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in precision.load(root, as_arrays=True).items()}


# --------------------------------------------------------------------------
# every format and scaling the layout holds, on one Linear layer

CASES = [
    (["--to", "int8", "--scaling", "per-axis:0"], (48, 96)),
    (["--to", "int8", "--scaling", "per-block:32:pow2"], (48, 96)),
    (["--to", "int8", "--scaling", "per-axis:0:fp16"], (5, 102)),  # rows padded to words
    (["--to", "int4", "--scaling", "per-block:32"], (48, 96)),
    (["--to", "int4", "--scaling", "per-axis:0"], (5, 102)),
    (["--to", "int4", "--scaling", "per-tensor:bf16"], (48, 96)),
    (["--to", "int4", "--scaling", "per-block:34:bf16"], (5, 102)),
    (["--to", "int2", "--scaling", "per-block:16:fp16"], (48, 96)),
    (["--to", "int2", "--scaling", "per-tensor"], (5, 102)),
    (["--to", "float8_e4m3fn", "--scaling", "per-axis:0"], (48, 96)),
    (["--to", "float8_e4m3fn", "--scaling", "per-tensor:bf16"], (48, 96)),
    (["--to", "mxfp4"], (48, 96)),
]


class Model(torch.nn.Module):
    def __init__(self, shape: tuple[int, int]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(shape[1], shape[0])


@pytest.mark.parametrize(
    ("flags", "shape"),
    CASES,
    ids=[" ".join(f[1::2]) + (" padded" if s[1] % 32 else "") for f, s in CASES],
)
def test_the_package_decompresses_each_format_as_we_decode_it(tmp_path, flags, shape):
    model(tmp_path / "in", shape)
    convert(tmp_path / "in", tmp_path / "ct", *flags, "--layout", "compressed-tensors")
    convert(tmp_path / "in", tmp_path / "ours", *flags)
    written, parsed = quantization_config(tmp_path / "ct")
    check_config(written, parsed)
    assert written["ignore"] == [r"re:(.*\.)?lm_head$"]  # the toy model may have a tied head
    stored = files(tmp_path / "ct")
    want = ours(tmp_path / "ours")
    scale = stored["layer.weight_scale"]
    want = {"layer.weight": expected(want["layer.weight"], scale), "layer.bias": want["layer.bias"]}

    # the package's dequantization of the checkpoint directory
    got = dequantized(tmp_path / "ct")
    assert set(got) == set(want)
    for name in want:
        same_bits(got[name], want[name], name)

    # the route transformers loads a model by
    compressor = ModelCompressor.from_compression_config(CompressedTensorsConfig(**written))
    with torch.device("meta"):
        net = Model(shape)
    apply_quantization_config(net, compressor.quantization_config, show_progress=False)
    compressor.compress_model(net)
    net.load_state_dict(stored, strict=True, assign=True)  # names and shapes as registered
    compressor.decompress_model(net)
    assert set(net.layer.state_dict()) == {"weight", "bias", "weight_scale"} | (
        {"weight_shape"} if written["format"] == "pack-quantized" else set()
    )
    same_bits(net.layer.weight, want["layer.weight"], "layer.weight")
    same_bits(net.layer.bias, want["layer.bias"], "layer.bias")


# --------------------------------------------------------------------------
# whole models, loaded by transformers

FORMATS = {
    "int8": ["--to", "int8"],  # per row
    "int4-g64": ["--to", "int4", "--scaling", "per-block:64"],
    "fp8-row": ["--to", "float8_e4m3fn", "--scaling", "per-axis:0"],
    "int2": ["--to", "int2"],  # per block of 32
    "int4-g32-bf16": ["--to", "int4", "--scaling", "per-block:32:bf16"],
    "mxfp4": ["--to", "mxfp4"],  # loaded in bfloat16: its weights decompress to bfloat16
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    write_llama_like(root / "llama-tied", tied=True)
    write_llama_like(root / "llama-untied", tied=False)
    write_gpt2_like(root / "gpt2", **size(), head=True)  # its one Linear layer: the head
    return root


def loaded(path, dtype):
    """The model transformers builds from a directory, and its loading report."""
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # the report is checked, not printed
    try:
        net, info = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, output_loading_info=True
        )
    finally:
        transformers_logging.set_verbosity(verbosity)
    assert not any(info.values()), info  # missing, unexpected, mismatched keys, errors
    return net.eval()


def reference(root, dst) -> None:
    """The architecture of compressed-tensors directory `root` with no quantization, in
    `dst`: its weights decoded from the files in numpy, exact in float32.

    transformers casts 16-bit scales to the model's dtype as it loads them, so a float32
    model holds these exact products, and a bfloat16 one these rounded as it loads them.
    """
    dst.mkdir()
    config = json.loads((root / "config.json").read_text())
    del config["quantization_config"]
    (dst / "config.json").write_text(json.dumps(config))
    weights = decode(root)
    safetensors.numpy.save_file(weights, str(dst / "model.safetensors"), {"format": "pt"})


def check_loads(src, tmp_path, flags: list[str], dtype: torch.dtype, names: bool = True) -> None:
    """Convert `src`; transformers loads the output with no missing or unexpected key and
    computes, bit for bit, what it computes from the weights `ct_reference` decodes; every
    `ignore` entry names one module of the model, left in float, and the modules it
    quantized are those the files store quantized (with `names`: where transformers
    keeps the file's module names)."""
    convert(src, tmp_path / "ct", *flags, "--layout", "compressed-tensors")
    reference(tmp_path / "ct", tmp_path / "ref")
    net, ref = loaded(tmp_path / "ct", dtype), loaded(tmp_path / "ref", dtype)
    ids = torch.tensor([[1, 7, 30, 2, 255, 0, 64, 9]])
    with torch.no_grad():
        logits, expected = net(ids).logits, ref(ids).logits
    assert torch.equal(logits, expected)
    got = net.state_dict()  # decompressed by the first forward
    for key, value in ref.state_dict().items():
        assert got[key].dtype == value.dtype, key
        assert torch.equal(got[key], value), key
    if not names:
        return
    ignore = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    modules = dict(net.named_modules())
    for entry in ignore["ignore"]:
        named = [m for m in modules if match_name(m, entry)]
        assert len(named) == 1, entry
        assert not hasattr(modules[named[0]], "quantization_scheme"), named
    quantized = {m for m, module in modules.items() if hasattr(module, "quantization_scheme")}
    stored = {n[: -len(".weight_scale")] for n in files(tmp_path / "ct") if "weight_scale" in n}
    assert {m.removeprefix("transformer.") for m in quantized} == stored
    assert all(not ignored(ignore["ignore"], m) for m in quantized)


@pytest.mark.parametrize("keep", [[], ["--keep", "norm"]], ids=["keep-default", "keep-norm"])
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", ["llama-tied", "llama-untied", "gpt2"])
def test_transformers_loads_the_model_that_the_files_describe(models, tmp_path, name, fmt, keep):
    dtype = torch.bfloat16 if fmt == "mxfp4" else torch.float32
    check_loads(models / name, tmp_path, [*FORMATS[fmt], *keep], dtype)


@pytest.mark.parametrize("fmt", ["int8", "int4-g64", "fp8-row"])
def test_a_mixture_of_experts_loads_with_its_router_in_float(tmp_path, fmt):
    """transformers builds Mixtral's router as a parameter of its own module (quantized, it
    would be missing and drawn at random) and merges the experts' Linear weights into
    stacked parameters after decompressing them; it also renames `block_sparse_moe` to
    `mlp`, so the module names are not the file's."""
    write_llama_like(tmp_path / "in", tied=False, experts=4)
    check_loads(tmp_path / "in", tmp_path, FORMATS[fmt], torch.float32, names=False)


def test_a_tied_head_written_in_the_file_loads_tied(tmp_path):
    """Some exporters write a tied head's weight too; quantized, transformers could not
    tie it to the embeddings (it fails loading): it is kept in float with them."""
    write_llama_like(tmp_path / "in", tied=True, head=True)
    check_loads(tmp_path / "in", tmp_path, ["--to", "int8"], torch.float32)


def test_a_sharded_model_dequantizes_bit_for_bit_like_our_layout(models, tmp_path):
    flags = ["--to", "int4", "--scaling", "per-block:64"]
    layout = ["--layout", "compressed-tensors", "--max-shard-size", "256KB"]
    convert(models / "llama-untied", tmp_path / "ct", *flags, *layout)
    convert(models / "llama-untied", tmp_path / "ours", *flags)
    assert len(list((tmp_path / "ct").glob("*.safetensors"))) > 1
    written, parsed = quantization_config(tmp_path / "ct")
    check_config(written, parsed)
    got = dequantized(tmp_path / "ct")
    want = ours(tmp_path / "ours")
    assert set(got) == set(want)
    stored = files(tmp_path / "ct")
    quantized = 0
    for name, values in want.items():
        scale = stored.get(name + "_scale")
        quantized += scale is not None
        same_bits(got[name], expected(values, scale), name)
    assert quantized == 7 * 2 + 1  # seven Linear layers in each of two blocks, the head


# --------------------------------------------------------------------------
# what the package refuses, convert refuses


def test_a_group_that_does_not_divide_the_rows_is_refused_as_the_package_refuses_it(
    tmp_path, capsys
):
    model(tmp_path / "in", (5, 102))
    flags = ["--to", "int4", "--scaling", "per-block:64", "--layout", "compressed-tensors"]
    argv = ["convert", str(tmp_path / "in"), "-o", str(tmp_path / "ct"), *flags, "-q"]
    assert main(argv) == 1
    assert "divide each row" in capsys.readouterr().err
    # the same weight in the layout with a shorter last group, packed by the package itself
    seed = torch.Generator().manual_seed(0)
    codes = torch.randint(-7, 8, (5, 102), dtype=torch.int8, generator=seed)
    root = tmp_path / "partial"
    root.mkdir()
    tensors = {
        "layer.weight_packed": pack_to_int32(codes, 4),
        "layer.weight_scale": torch.ones(5, 2),
        "layer.weight_shape": torch.tensor([5, 102]),
    }
    safetensors.torch.save_file(tensors, str(root / "model.safetensors"), {"format": "pt"})
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}
    group = {"targets": ["Linear"], "weights": weights | {"group_size": 64, "dynamic": False}}
    quant = {"quant_method": "compressed-tensors", "format": "pack-quantized"}
    quant |= {"config_groups": {"group_0": group}, "quantization_status": "compressed"}
    (root / "config.json").write_text(json.dumps({"quantization_config": quant}))
    with pytest.raises(ValueError, match="group_size 64"):
        dequantized(root)
