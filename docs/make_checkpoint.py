"""Write a GPT-2-sized checkpoint of random weights, laid out as Hugging Face publishes GPT-2.

    python docs/make_checkpoint.py [DIR] [--shards N] [--seed S] [--llama]

DIR (default `gpt2`) gets `config.json`, `generation_config.json`, a `tokenizer.json` (a
byte-level BPE of GPT-2's kind: the 256 bytes, then made-up merges of two of them up to the
vocabulary's size, and `<|endoftext|>`) and the weights in safetensors: `model.safetensors`,
or with `--shards N` the files
`model-00001-of-0000N.safetensors` … and their index `model.safetensors.index.json`.
The 148 float32 tensors have GPT-2's names and shapes (`wte.weight` 50257 x 768,
`h.0.attn.c_attn.weight` 768 x 2304, …: 124,439,808 values, 475 MiB) and values drawn like
a freshly initialised model's (normal, standard deviation 0.02; layer norms near 1). The
command line examples of the docs start from it. Needs numpy only.

`--llama` writes a Llama-style model of about the same size instead (`LlamaForCausalLM`:
`model.embed_tokens.weight` 32000 x 768, `q_proj`/`k_proj`/`v_proj`/`o_proj` and
`gate_proj`/`up_proj`/`down_proj` Linear layers in 12 blocks, RMS norms, an `lm_head` of
its own: 111 float32 tensors, 124,668,672 values), whose Linear layers the
compressed-tensors layout quantizes.

`PRECISION_DOCS_SMALL=1` in the environment writes the same names at a small width (two
layers, 64 wide, a 1000-word vocabulary): the docs' tests run every example on it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path

import numpy as np

GPT2 = {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024, "vocab_size": 50257}
SMALL = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128, "vocab_size": 1000}
LLAMA = {
    "num_hidden_layers": 12,
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}
LLAMA_SMALL = LLAMA | {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128}
LLAMA_SMALL |= {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}


def weights(size: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """GPT-2's tensors by name."""
    rng = np.random.default_rng(seed)
    d = size["n_embd"]

    def normal(*shape: int) -> np.ndarray:
        return 0.02 * rng.standard_normal(shape, np.float32)

    def norm(prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}.weight": 1 + normal(d), f"{prefix}.bias": normal(d)}

    out = {
        "wte.weight": normal(size["vocab_size"], d),
        "wpe.weight": normal(size["n_positions"], d),
    }
    for i in range(size["n_layer"]):
        h = f"h.{i}"
        out |= norm(f"{h}.ln_1")
        out |= {f"{h}.attn.c_attn.weight": normal(d, 3 * d), f"{h}.attn.c_attn.bias": normal(3 * d)}
        out |= {f"{h}.attn.c_proj.weight": normal(d, d), f"{h}.attn.c_proj.bias": normal(d)}
        out |= norm(f"{h}.ln_2")
        out |= {f"{h}.mlp.c_fc.weight": normal(d, 4 * d), f"{h}.mlp.c_fc.bias": normal(4 * d)}
        out |= {f"{h}.mlp.c_proj.weight": normal(4 * d, d), f"{h}.mlp.c_proj.bias": normal(d)}
    return out | norm("ln_f")


def llama_weights(size: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """A Llama-style model's tensors by name (Linear weights are (out, in))."""
    rng = np.random.default_rng(seed)
    d, f, v = size["hidden_size"], size["intermediate_size"], size["vocab_size"]
    kv = d // size["num_attention_heads"] * size["num_key_value_heads"]

    def normal(*shape: int) -> np.ndarray:
        return 0.02 * rng.standard_normal(shape, np.float32)

    out = {"model.embed_tokens.weight": normal(v, d)}
    for i in range(size["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out |= {f"{p}.input_layernorm.weight": 1 + normal(d)}
        for name, rows in (("q_proj", d), ("k_proj", kv), ("v_proj", kv), ("o_proj", d)):
            out[f"{p}.self_attn.{name}.weight"] = normal(rows, d)
        out |= {f"{p}.post_attention_layernorm.weight": 1 + normal(d)}
        out |= {f"{p}.mlp.gate_proj.weight": normal(f, d), f"{p}.mlp.up_proj.weight": normal(f, d)}
        out |= {f"{p}.mlp.down_proj.weight": normal(d, f)}
    return out | {"model.norm.weight": 1 + normal(d), "lm_head.weight": normal(v, d)}


def llama_config(size: dict[str, int]) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
        **size,
    }


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors layout: an 8-byte header length, a JSON header, the bytes in order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    tensors = dict(sorted(tensors.items()))  # by name, as the safetensors library writes them
    for name, array in tensors.items():
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for array in tensors.values():
            f.write(np.ascontiguousarray(array, "<f4").tobytes())


def config(size: dict[str, int]) -> dict[str, object]:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-05,
        "n_ctx": size["n_positions"],
        "bos_token_id": size["vocab_size"] - 1,
        "eos_token_id": size["vocab_size"] - 1,
        "torch_dtype": "float32",
        **size,
    }


def byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: the character standing for each byte 0..255 (printable
    Latin-1 bytes stand for themselves, the others for 256, 257, ... in byte order)."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def tokenizer(vocab_size: int) -> dict[str, object]:
    """A `tokenizer.json` of byte-level BPE with `vocab_size` tokens, the last one
    `<|endoftext|>`: the bytes, then pairs of bytes merged in a fixed order."""
    symbols = byte_symbols()
    vocab = {s: i for i, s in enumerate(symbols)}
    merges = []
    for a, b in itertools.product(symbols[:224], repeat=2):
        if len(vocab) >= vocab_size - 1:
            break
        vocab[a + b] = len(vocab)
        merges.append(f"{a} {b}")
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    end = {"content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": vocab_size - 1, **end, "normalized": True, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": {"type": "ByteLevel", **byte_level},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "vocab": vocab,
            "merges": merges,
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", nargs="?", default="gpt2", type=Path)
    parser.add_argument("--shards", type=int, default=1, help="files to split the weights over")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--llama", action="store_true", help="a Llama-style model instead")
    args = parser.parse_args(argv)
    small = os.environ.get("PRECISION_DOCS_SMALL") == "1"
    if args.llama:
        size = LLAMA_SMALL if small else LLAMA
        tensors, doc = llama_weights(size, args.seed), llama_config(size)
        generation = {"bos_token_id": 1, "eos_token_id": 2}
    else:
        size = SMALL if small else GPT2
        tensors, doc = weights(size, args.seed), config(size)
        eos = size["vocab_size"] - 1
        generation = {"bos_token_id": eos, "eos_token_id": eos}
    args.dir.mkdir(parents=True, exist_ok=True)
    (args.dir / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    text = json.dumps(tokenizer(size["vocab_size"]), ensure_ascii=False)
    (args.dir / "tokenizer.json").write_text(text + "\n", encoding="utf-8")
    if args.shards == 1:
        write_safetensors(args.dir / "model.safetensors", tensors)
    else:
        names = list(tensors)
        weight_map = {}
        for k, part in enumerate(np.array_split(np.arange(len(names)), args.shards), 1):
            file = f"model-{k:05d}-of-{args.shards:05d}.safetensors"
            write_safetensors(args.dir / file, {names[i]: tensors[names[i]] for i in part})
            weight_map |= {names[i]: file for i in part}
        total = sum(a.nbytes for a in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (args.dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    count = sum(a.size for a in tensors.values())
    print(f"wrote {args.dir}/: {len(tensors)} tensors, {count:,} float32 values")


if __name__ == "__main__":
    main()
