"""`convert` of a model directory: the files beside the tensors come along, atomically.

A Hugging Face directory holds `config.json`, the tokenizer's files and a generation
config beside its weights; a converted directory holds them too (byte for byte, links
into a hub cache followed), written in the same temporary directory as the shards, so
an error or an interrupt leaves nothing and an existing output is replaced only under
`--overwrite`. Weights in other formats and subdirectories are left out, and said so.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from gpt2_like import SIDE_FILES, write_gpt2_like

import dtypes
import precision
from precision._cli import _convert_command, _convert_engine, _convert_modes, _output_layouts, main

SHAPE = {"n_embd": 32, "n_layer": 1, "vocab": 64, "n_ctx": 16}


@pytest.fixture
def hub(tmp_path):
    """GPT-2 with a head of its own: --layout compressed-tensors quantizes that Linear layer
    (GPT-2's others are Conv1D, which it keeps in float)."""
    root = tmp_path / "gpt2"
    write_gpt2_like(root, **SHAPE, head=True)
    return root


def names(path) -> list[str]:
    return sorted(os.listdir(path))


def convert(src, dst, *flags: str) -> int:
    return main(["convert", str(src), "-o", str(dst), "--to", "int8", *flags, "-q"])


def test_the_files_beside_the_tensors_are_copied(hub, tmp_path, capsys):
    (hub / "pytorch_model.bin").write_bytes(b"weights in another format")
    (hub / "original").mkdir()
    (hub / ".gitattributes").write_text("*.bin lfs\n")
    assert convert(hub, tmp_path / "out") == 0
    out = capsys.readouterr().out
    assert "copied 5 file(s) beside the tensors: config.json, generation_config.json" in out
    assert "not copied: original/ (a directory), pytorch_model.bin (weights in another" in out
    got = names(tmp_path / "out")
    assert [n for n in got if "safetensors" not in n] == sorted(["config.json", *SIDE_FILES])
    for name in ["config.json", *SIDE_FILES]:
        assert (tmp_path / "out" / name).read_bytes() == (hub / name).read_bytes()
    loaded = precision.load(tmp_path / "out")
    assert loaded["h.0.mlp.c_fc.weight"].format.name == "int8"


def test_a_directory_with_one_file_gives_a_directory(tmp_path):
    root = tmp_path / "model"
    root.mkdir()
    precision.save(root / "model.safetensors", {"w": np.ones((4, 32), np.float32)})
    (root / "config.json").write_text("{}")
    assert convert(root, tmp_path / "out") == 0
    assert "config.json" in names(tmp_path / "out")
    assert convert(root, tmp_path / "one.safetensors") == 0  # a file name: one file
    assert (tmp_path / "one.safetensors").is_file()


def test_links_into_a_hub_cache_are_followed(hub, tmp_path):
    blob = tmp_path / "blob"
    blob.write_text('{"cached": true}')
    (hub / "generation_config.json").unlink()
    (hub / "generation_config.json").symlink_to(blob)
    assert convert(hub, tmp_path / "out") == 0
    copied = tmp_path / "out" / "generation_config.json"
    assert not copied.is_symlink()
    assert json.loads(copied.read_text()) == {"cached": True}


def test_an_existing_output_is_replaced_only_with_overwrite(hub, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("theirs")
    assert convert(hub, out) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert names(out) == ["config.json"]
    assert (out / "config.json").read_text() == "theirs"
    assert convert(hub, out, "--overwrite") == 0
    assert (out / "config.json").read_bytes() == (hub / "config.json").read_bytes()
    assert names(tmp_path) == ["gpt2", "out"]  # nothing left beside it


@pytest.mark.parametrize("layout", ["precision", "compressed-tensors"])
@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt])
def test_a_failure_or_an_interrupt_after_the_copies_leaves_nothing(
    hub, tmp_path, capsys, monkeypatch, layout, failure
):
    copy = _output_layouts.copy_files

    def copy_then_fail(*args, **kwargs):
        copied = copy(*args, **kwargs)
        assert copied[0]
        raise failure

    monkeypatch.setattr(_output_layouts, "copy_files", copy_then_fail)
    monkeypatch.setattr(_convert_command, "copy_files", copy_then_fail)
    code = convert(hub, tmp_path / "out", "--layout", layout)
    assert code == (130 if failure is KeyboardInterrupt else 1)
    assert names(tmp_path) == ["gpt2"]  # no output, no hidden temporary directory


def test_compressed_tensors_writes_the_config_it_quantized(hub, tmp_path):
    assert (
        convert(hub, tmp_path / "out", "--scaling", "per-axis:0", "--layout", "compressed-tensors")
        == 0
    )
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    source = json.loads((hub / "config.json").read_text())
    assert config.pop("quantization_config")["quant_method"] == "compressed-tensors"
    assert config == source
    for name in SIDE_FILES:
        assert (tmp_path / "out" / name).read_text() == SIDE_FILES[name]


# --------------------------------------------------------------------------
# the default scaling of a Conv1D weight (GPT-2's, stored inputs x outputs)

CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def scalings(path) -> dict[str, object]:
    return {n: t.encoded.scaling for n, t in precision.load(path).items() if t.encoded is not None}


@pytest.mark.parametrize(
    ("to", "linear", "conv1d"),
    [
        ("int8", dtypes.PerAxis(0), dtypes.PerAxis(1)),  # a scale per output channel
        ("int4", dtypes.PerBlock(32), dtypes.PerBlock(32, axis=0)),  # blocks along inputs
    ],
)
def test_conv1d_weights_get_their_output_channels_by_default(
    hub, tmp_path, capsys, to, linear, conv1d
):
    # config.json says gpt2: its Conv1D weights are (in, out), so the default that gives a
    # Linear layer's (out, in) weight a scale per output channel gives them axis 1
    argv = ["convert", str(hub), "-o", str(tmp_path / "out"), "--to", to, "--keep", "none"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "4 Conv1D weight(s) of gpt2, stored inputs x outputs, take" in out
    assert f"(--scaling {'per-axis:0' if to == 'int8' else 'per-block:32'} " in out
    got = scalings(tmp_path / "out")
    for module in CONV1D:
        assert got[f"h.0.{module}.weight"] == conv1d, module
    assert got["lm_head.weight"] == linear  # a Linear layer: (vocab, n_embd)
    assert got["wte.weight"] == linear  # an embedding, (vocab, n_embd)
    # a scaling given is every tensor's, as typed
    text = "per-axis:0" if to == "int8" else "per-block:32"
    assert main([*argv, "--scaling", text, "--overwrite"]) == 0
    assert "Conv1D" not in capsys.readouterr().out
    assert {s for n, s in scalings(tmp_path / "out").items() if n.endswith("weight")} == {linear}


def test_a_single_file_reads_the_config_beside_it(hub, tmp_path, capsys):
    one = hub / "model-00001-of-00003.safetensors"  # h.0.attn.c_attn.weight among others
    assert convert(one, tmp_path / "one.safetensors", "--keep", "none") == 0
    assert scalings(tmp_path / "one.safetensors")["h.0.attn.c_attn.weight"] == dtypes.PerAxis(1)
    # without a config.json (or with another model type) the names alone say nothing
    (hub / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert convert(one, tmp_path / "two.safetensors", "--keep", "none") == 0
    assert scalings(tmp_path / "two.safetensors")["h.0.attn.c_attn.weight"] == dtypes.PerAxis(0)
    (hub / "config.json").unlink()
    assert convert(hub, tmp_path / "three", "--keep", "none") == 0
    assert scalings(tmp_path / "three")["h.0.attn.c_attn.weight"] == dtypes.PerAxis(0)


def test_conv1d_codes_are_the_library_encode_of_the_output_channels(hub, tmp_path):
    # an independent reading: each output column's scale is its absmax / 127
    assert convert(hub, tmp_path / "out", "--keep", "none") == 0
    shard = safetensors.numpy.load_file(str(hub / "model-00001-of-00003.safetensors"))
    w = shard["h.0.attn.c_attn.weight"]
    got = precision.load(tmp_path / "out")["h.0.attn.c_attn.weight"]
    scale = np.asarray(got.encoded.scale, np.float32).reshape(-1)
    np.testing.assert_array_equal(scale, np.max(np.abs(w), axis=0) / np.float32(127))
    np.testing.assert_allclose(np.asarray(got.numpy()), w, atol=float(np.max(scale)) / 2 * 1.0001)


def test_blocks_down_the_rows_stream_as_the_library_encodes(hub, tmp_path, monkeypatch, capsys):
    # int4's default on a Conv1D weight, blocks of 32 down its inputs, streamed in blocks
    # of whole scale blocks of rows: mlp.c_proj (128 x 32) in two of 96 rows, the last
    # padded; the codes and scales are those of the library's encode of the whole tensor
    monkeypatch.setattr(_convert_modes, "_BLOCK", 3500)  # 96 rows of 32: whole blocks
    shapes = []
    block = _convert_engine._Engine.block
    monkeypatch.setattr(
        _convert_engine._Engine,
        "block",
        lambda self, x, *a, **k: shapes.append(x.shape) or block(self, x, *a, **k),
    )
    argv = ["convert", str(hub), "-o", str(tmp_path / "out"), "--to", "int4", "--keep", "none"]
    assert main([*argv, "--dry-run"]) == 0
    assert "h.0.mlp.c_proj.weight   128x32" in capsys.readouterr().out
    one = ["--include", "mlp.c_proj.weight", "-o", str(tmp_path / "one")]
    assert main([*argv, *one]) == 0
    assert shapes == [(96, 32), (96, 32)]
    assert main(argv) == 0
    tensors = {}
    for shard in sorted(hub.glob("*.safetensors")):
        tensors |= safetensors.numpy.load_file(str(shard))
    loaded = precision.load(tmp_path / "out")
    for module in CONV1D:
        name = f"h.0.{module}.weight"
        enc = loaded[name].encoded
        want = dtypes.int4.encode(jnp.asarray(tensors[name]), scaling=dtypes.PerBlock(32, axis=0))
        np.testing.assert_array_equal(np.asarray(enc.data), np.asarray(want.data), err_msg=name)
        assert np.asarray(enc.scale).tobytes() == np.asarray(want.scale).tobytes(), name
