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

import numpy as np
import pytest
from gpt2_like import SIDE_FILES, write_gpt2_like

import precision
from precision._cli import _convert_command, _output_layouts, main

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
