"""A Hugging Face style GPT-2 checkpoint with random weights, and a safetensors reader.

The checkpoint has GPT-2's tensor names and shape relations (its Conv1D weights are
(in, out); norms, biases and position embeddings as GPT-2 has them) in shards with a
`model.safetensors.index.json`, beside a `config.json`, a generation config and
tokenizer files, as a model hub publishes it. `SMALL` keeps the quick test run quick;
`FULL` is GPT-2 small's size (124M parameters), used under the `hunt` profile.

`read_safetensors` parses a safetensors file from its published layout (an 8-byte
little-endian header length, a JSON header, raw little-endian bytes) with nothing of
this library's, so a test sees exactly the bytes another tool would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import safetensors.numpy

SMALL = {"n_embd": 128, "n_layer": 2, "vocab": 1024, "n_ctx": 256}
FULL = {"n_embd": 768, "n_layer": 12, "vocab": 50257, "n_ctx": 1024}

#: Files a hub's GPT-2 directory holds beside its weights (contents made up).
SIDE_FILES = {
    "generation_config.json": '{"bos_token_id": 50256, "eos_token_id": 50256}\n',
    "tokenizer_config.json": '{"model_max_length": 1024}\n',
    "vocab.json": '{"!": 0, "\\"": 1}\n',
    "merges.txt": "#version: 0.2\nĠ t\n",
}


def size() -> dict[str, int]:
    return FULL if os.environ.get("HYPOTHESIS_PROFILE") == "hunt" else SMALL


def gpt2_shapes(n_embd: int, n_layer: int, vocab: int, n_ctx: int) -> dict[str, tuple[int, ...]]:
    d = n_embd
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (vocab, d), "wpe.weight": (n_ctx, d)}
    for i in range(n_layer):
        h = f"h.{i}."
        shapes |= {
            h + "ln_1.weight": (d,),
            h + "ln_1.bias": (d,),
            h + "attn.c_attn.weight": (d, 3 * d),
            h + "attn.c_attn.bias": (3 * d,),
            h + "attn.c_proj.weight": (d, d),
            h + "attn.c_proj.bias": (d,),
            h + "ln_2.weight": (d,),
            h + "ln_2.bias": (d,),
            h + "mlp.c_fc.weight": (d, 4 * d),
            h + "mlp.c_fc.bias": (4 * d,),
            h + "mlp.c_proj.weight": (4 * d, d),
            h + "mlp.c_proj.bias": (d,),
        }
    return shapes | {"ln_f.weight": (d,), "ln_f.bias": (d,)}


def write_gpt2_like(
    root: Path,
    *,
    n_embd: int,
    n_layer: int,
    vocab: int,
    n_ctx: int,
    shards: int = 3,
    seed: int = 0,
    head: bool = False,
) -> dict[str, np.ndarray]:
    """Write the checkpoint into the new directory `root`; return its tensors.

    GPT-2's output head is tied to `wte` and has no tensor; `head=True` gives it one of
    its own, `lm_head.weight` (a Linear layer's (vocab, n_embd)), and says so in the config
    (`tie_word_embeddings: false`).
    """
    rng = np.random.default_rng(seed)
    shapes = gpt2_shapes(n_embd, n_layer, vocab, n_ctx)
    if head:
        shapes["lm_head.weight"] = (vocab, n_embd)
    tensors = {n: (0.02 * rng.standard_normal(s)).astype(np.float32) for n, s in shapes.items()}
    root.mkdir(parents=True)
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        group = names[i * per : (i + 1) * per]
        safetensors.numpy.save_file(
            {n: tensors[n] for n in group}, str(root / shard), metadata={"format": "pt"}
        )
        weight_map |= dict.fromkeys(group, shard)
    total = sum(t.nbytes for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_embd": n_embd,
        "n_layer": n_layer,
        "n_head": max(1, n_embd // 64),
        "n_positions": n_ctx,
        "vocab_size": vocab,
        "torch_dtype": "float32",
    }
    if head:
        config["tie_word_embeddings"] = False
    (root / "config.json").write_text(json.dumps(config, indent=2))
    for name, text in SIDE_FILES.items():
        (root / name).write_text(text)
    return tensors


_DTYPES = {
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",  # bits: widened by the caller (x << 16 as float32)
    "F8_E4M3": "u1",  # bits: decoded by the caller
    "I64": "<i8",
    "I32": "<i4",
    "U8": "u1",
    "I8": "i1",
}


def read_safetensors(path: Path) -> tuple[dict[str, tuple[str, np.ndarray]], dict[str, str]]:
    """{name: (safetensors dtype, array of its raw values)} and the `__metadata__`."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        data = np.frombuffer(raw[8 + n + begin : 8 + n + end], _DTYPES[entry["dtype"]])
        out[name] = (entry["dtype"], data.reshape(entry["shape"]))
    return out, meta


def read_directory(root: Path) -> tuple[dict[str, tuple[str, np.ndarray]], dict]:
    """Every tensor of a sharded directory (through its index), and the index."""
    index = json.loads((root / "model.safetensors.index.json").read_text())
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for shard in sorted(set(index["weight_map"].values())):
        found, meta = read_safetensors(root / shard)
        assert meta.get("format") == "pt"  # what transformers checks before loading
        tensors |= found
    assert set(tensors) == set(index["weight_map"])
    return tensors, index
