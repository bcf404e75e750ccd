"""`precision convert` on what model hubs publish: sharded directories, presets, plans, warnings.

Inputs are written with the `safetensors` package and an index file written
here by hand (the layout model hubs use); outputs are read back with
`safetensors` and `json`, and converted values compared with `Format.encode`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open

import dtypes
import precision
from precision._cli import _main as _cli

RNG = np.random.default_rng(3)
# GPT-2's naming: what --keep keeps by default (norms, biases, embeddings) and what it converts.
TENSORS = {
    "wte.weight": RNG.standard_normal((64, 32)).astype(np.float32),
    "h.0.ln_1.weight": RNG.standard_normal(32).astype(np.float32),
    "h.0.attn.c_attn.weight": RNG.standard_normal((32, 96)).astype(np.float32),
    "h.0.attn.c_attn.bias": RNG.standard_normal(96).astype(np.float32),
    "h.0.mlp.c_fc.weight": RNG.standard_normal((32, 128)).astype(np.float32),
    "h.1.mlp.c_proj.weight": RNG.standard_normal((128, 32)).astype(np.float32),
    "h.10.mlp.c_proj.weight": RNG.standard_normal((128, 32)).astype(np.float32),
    "ln_f.weight": RNG.standard_normal(32).astype(np.float32),
}
CONVERTED = ["h.0.attn.c_attn.weight", "h.0.mlp.c_fc.weight", "h.1.mlp.c_proj.weight"]
CONVERTED.append("h.10.mlp.c_proj.weight")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Three shards and model.safetensors.index.json, as a hub publishes them."""
    root = tmp_path_factory.mktemp("hub") / "gpt"
    root.mkdir()
    names = list(TENSORS)
    groups = [names[:3], names[3:6], names[6:]]
    weight_map = {}
    for i, group in enumerate(groups):
        shard = f"model-{i + 1:05d}-of-00003.safetensors"
        safetensors.numpy.save_file(
            {n: TENSORS[n] for n in group}, str(root / shard), metadata={"format": "pt"}
        )
        weight_map.update(dict.fromkeys(group, shard))
    total = sum(v.nbytes for v in TENSORS.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return root


def read_dir(path) -> tuple[dict[str, np.ndarray], dict, dict[str, dict]]:
    index = json.loads((path / "model.safetensors.index.json").read_text())
    arrays, metadata = {}, {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(path / shard), framework="numpy") as f:
            metadata[shard] = f.metadata()
            for name in f.keys():
                arrays[name] = f.get_tensor(name)
    return arrays, index, metadata


def test_sharded_round_trip(sharded, tmp_path, capsys):
    out = tmp_path / "gpt-int4"
    argv = ["convert", str(sharded), "-o", str(out), "--to", "int4", "--max-shard-size", "9KB"]
    assert _cli.main([*argv, "-q"]) == 0
    arrays, index, metadata = read_dir(out)
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3
    n = len(shards)
    assert shards == [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    # every array is in the shard the index names, the total is the bytes of the arrays
    assert set(index["weight_map"]) == set(arrays)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in arrays.values())
    for shard in shards:
        assert os.path.getsize(out / shard) < 9000 + 4096  # data under the limit (+ header)
        assert metadata[shard]["format"] == "pt"  # the source metadata kept
        assert "int4" in metadata[shard]["converted_by"]  # and extended
    # converted tensors hold the library's int4 per-block 32 codes; the rest is untouched
    for name in CONVERTED:
        expected = dtypes.int4.encode(jnp.asarray(TENSORS[name]), scaling=dtypes.PerBlock(32))
        np.testing.assert_array_equal(arrays[name].view(np.uint8), np.asarray(expected.data))
        np.testing.assert_array_equal(arrays[name + ":scale"], np.asarray(expected.scale))
        assert index["weight_map"][name] == index["weight_map"][name + ":scale"]
    for name in set(TENSORS) - set(CONVERTED):
        assert arrays[name].tobytes() == TENSORS[name].tobytes()
    # each shard loads on its own
    first = precision.load(out / shards[0])
    assert first


def test_sharded_in_single_file_out_and_index_path(sharded, tmp_path, capsys):
    out = tmp_path / "one.safetensors"
    index = sharded / "model.safetensors.index.json"
    assert _cli.main(["convert", str(index), "-o", str(out), "--to", "bf16", "-q"]) == 0
    with safe_open(str(out), framework="numpy") as f:
        assert set(f.keys()) == set(TENSORS)
        assert f.metadata()["format"] == "pt"


def test_single_file_metadata_kept(tmp_path):
    src, out = tmp_path / "m.safetensors", tmp_path / "o.safetensors"
    safetensors.numpy.save_file(TENSORS, str(src), metadata={"format": "pt", "note": "x"})
    assert _cli.main(["convert", str(src), "-o", str(out), "--to", "int8", "-q"]) == 0
    with safe_open(str(out), framework="numpy") as f:
        meta = f.metadata()
    assert (meta["format"], meta["note"]) == ("pt", "x")
    assert meta["converted_by"].startswith("precision convert --to int8")


def test_dry_run_lists_every_tensor_and_writes_nothing(sharded, tmp_path, capsys):
    out = tmp_path / "never"
    assert _cli.main(["convert", str(sharded), "-o", str(out), "--to", "int4", "--dry-run"]) == 0
    assert not out.exists()
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in lines[2:] if line and not line.startswith(" ")}
    for name in CONVERTED:
        assert "int4 (per-block 32" in rows[name]
        assert "converted" in rows[name]
    for name in ["wte.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.bias", "ln_f.weight"]:
        assert "unchanged" in rows[name]
        assert "--keep default" in rows[name]
    assert any(line.startswith("would convert 4 tensor(s) to int4") for line in lines)


@pytest.mark.parametrize(
    "name",
    ["model.norm.weight", "layers.3.input_layernorm.weight", "bert.LayerNorm.bias",
     "h.11.ln_2.bias", "transformer.ln_f.weight", "model.embed_tokens.weight",
     "bert.embeddings.word_embeddings.weight", "wpe.weight", "encoder.layer.0.attention.bias"],
)  # fmt: skip
def test_default_keep_matches_common_names(name):
    import re

    from precision._cli._convert_command import DEFAULT_KEEP

    assert re.search(DEFAULT_KEEP, name, re.IGNORECASE)


@pytest.mark.parametrize(
    "name", ["h.0.attn.c_attn.weight", "layers.3.mlp.down_proj.weight", "lm_head.weight"]
)
def test_default_keep_spares_weights(name):
    import re

    from precision._cli._convert_command import DEFAULT_KEEP

    assert not re.search(DEFAULT_KEEP, name, re.IGNORECASE)


def test_warnings_for_rules_that_match_nothing_and_low_sqnr(sharded, tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["convert", str(sharded), "-o", str(out), "--to", "int2", "-q"]
    assert _cli.main([*argv, "--exclude", "nothing-like-this"]) == 0
    err = capsys.readouterr().err
    assert "warning: --exclude 'nothing-like-this' matches no tensor" in err
    assert "below 15 dB SQNR" in err  # int2: a few dB


NOTHING = {
    "include matches nothing": ["--include", "absent"],
    "scaling fits nothing": ["--scaling", "per-axis:5"],
}


@pytest.mark.parametrize("flags", NOTHING.values(), ids=NOTHING.keys())
def test_nothing_to_convert_is_a_usage_error(sharded, tmp_path, capsys, flags):
    out = tmp_path / "o"
    assert _cli.main(["convert", str(sharded), "-o", str(out), "--to", "int8", *flags]) == 2
    err = capsys.readouterr().err
    assert "nothing to convert" in err
    assert err.count("\n") <= 2  # a warning at most, then the error
    assert not out.exists()


CLI_USAGE = {
    "seed too large": (["--to", "int4", "--rounding", "stochastic", "--seed", str(2**80)], "seed"),
    "seed not an int": (["--to", "int4", "--seed", "2**80"], "seed"),
    "int1 pow2": (["--to", "int1", "--scaling", "per-tensor:pow2"], "int1"),
    "float64": (["--to", "float64"], "float64"),
    "unknown format": (["--to", "int3"], "unknown format"),
    "bad rounding": (["--to", "int8", "--rounding", "up-ish"], "rounding"),
    "bad shard size": (["--to", "int8", "--max-shard-size", "lots"], "size"),
    "bad keep": (["--to", "int8", "--keep", "("], "--keep"),
}


@pytest.mark.parametrize(("flags", "word"), CLI_USAGE.values(), ids=CLI_USAGE.keys())
def test_usage_errors_exit_2_in_one_line(tmp_path, flags, word):
    src = tmp_path / "m.safetensors"
    safetensors.numpy.save_file({"w": np.ones((4, 32), np.float32)}, str(src))
    argv = [sys.executable, "-m", "precision", "convert", str(src), "-o", str(tmp_path / "o")]
    result = subprocess.run([*argv, *flags], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") <= 2, result.stderr
    assert word in result.stderr, result.stderr
    assert not (tmp_path / "o").exists()


def test_version():
    from importlib.metadata import version

    result = subprocess.run(
        [sys.executable, "-m", "precision", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert result.stdout.strip() == f"precision {version('precision')}"
    assert precision.__version__ == version("precision")


def test_every_registry_format_is_reachable_by_name(tmp_path, capsys):
    w = RNG.standard_normal((4, 64)).astype(np.float32)
    signed, positive = tmp_path / "m.safetensors", tmp_path / "p.safetensors"
    safetensors.numpy.save_file({"w": w}, str(signed))
    safetensors.numpy.save_file({"w": np.abs(w) + np.float32(2**-8)}, str(positive))
    for name, fmt in dtypes.REGISTRY.items():  # element formats and named encodings
        src = positive if fmt.kind == "scale" else signed  # E8M0 holds 2**k > 0 only
        code = _cli.main(["convert", str(src), "--to", name, "--dry-run"])
        said = capsys.readouterr()
        if fmt.bits > 32:  # wider than float32: refused with a reason
            assert code == 2, name
            assert "wider than the float32 values" in said.err
            continue
        assert code == 0, (name, said.err)
        assert f"would convert 1 tensor(s) to {name}" in said.out
        if name in dtypes.ENCODINGS:
            continue  # written for real by test_cli.py::test_convert_to_every_format
        out = tmp_path / f"{name}.safetensors"
        code = _cli.main(["convert", str(src), "-o", str(out), "--to", name, "-q"])
        assert code == 0, (name, capsys.readouterr().err)
        assert precision.load(out)["w"].format.name in (name, "float32"), name
