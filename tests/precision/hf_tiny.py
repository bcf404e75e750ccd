"""Tiny Hugging Face model directories (Llama, GPT-2) with real tokenizers, no torch.

Each directory holds what a hub publishes for the model: `config.json`, the weights in
`model.safetensors` (the Hugging Face names, orientations and dtypes), and a
`tokenizer.json` that the `tokenizers` package trains here on a fixed text: byte-level
BPE, GPT-2's pre-tokenizer for GPT-2 and Llama 3's for Llama. Weights are random but
scaled so that the logits spread over several nats (a comparison of distributions
then means something); sizes are multiples of 32 so every matrix quantizes in blocks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import safetensors.numpy

#: Llama 3's pre-tokenizer pattern, as its tokenizer.json spells it.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TEXT = (
    "The quick brown fox jumps over the lazy dog. It's 2024, and we'll see 1234567890 "
    "numbers, tabs\tand new\nlines.\n\nParagraphs\n\n\nand  double  spaces, punctuation!? "
    "(brackets) [and] {braces}; IT'S WE'LL x(y) naïve café, Grüße, 東京, emoji 🙂. The the THE "
) * 8

#: Strings whose token ids llama.cpp and `tokenizers` must agree on.
SAMPLES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space and  two  spaces\n\nnew lines\t tab",
    "It's 2024: 1234567890 numbers, we'll see; IT'S WE'LL x(y)",
    "Paragraphs\n\n\nand\n\nmore",
    "naïve café Grüße 東京 🙂",
]


def tokenizer(kind: str, vocab: int = 320):
    """A byte-level BPE `tokenizers.Tokenizer` trained on `TEXT`: `kind` "gpt2" or "llama"."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    llama = kind == "llama"
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] if llama else ["<|endoftext|>"]
    tok = Tokenizer(models.BPE(ignore_merges=llama))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not llama)
    if llama:
        split = pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False)
        tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer)
    if llama:
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _save(root: Path, tensors: dict[str, np.ndarray], config: dict, tok) -> None:
    root.mkdir(parents=True)
    safetensors.numpy.save_file(tensors, str(root / "model.safetensors"), {"format": "pt"})
    (root / "config.json").write_text(json.dumps(config, indent=2))
    tok.save(str(root / "tokenizer.json"))


def write_llama(
    root: Path, *, tied: bool = False, seed: int = 0, d: int = 64, layers: int = 2
) -> dict[str, np.ndarray]:
    """A LlamaForCausalLM directory: 4 query heads, 2 key-value heads, SwiGLU 128."""
    tok = tokenizer("llama")
    vocab = tok.get_vocab_size() + 3  # rows beyond the tokenizer's: padding tokens
    heads, kv, ffn = 4, 2, 128
    hd = d // heads
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (gain * rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t = {"model.embed_tokens.weight": (0.3 * rng.standard_normal((vocab, d))).astype(np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(d)
        t[p + "self_attn.q_proj.weight"] = mat(heads * hd, d, 0.5)
        t[p + "self_attn.k_proj.weight"] = mat(kv * hd, d, 0.5)
        t[p + "self_attn.v_proj.weight"] = mat(kv * hd, d)
        t[p + "self_attn.o_proj.weight"] = mat(d, heads * hd)
        t[p + "post_attention_layernorm.weight"] = norm(d)
        t[p + "mlp.gate_proj.weight"] = mat(ffn, d)
        t[p + "mlp.up_proj.weight"] = mat(ffn, d)
        t[p + "mlp.down_proj.weight"] = mat(d, ffn)
    # logits of a few nats: the final norm smaller for a head tied to the embedding
    t["model.norm.weight"] = norm(d) * np.float32(0.3 if tied else 1.0)
    if not tied:
        t["lm_head.weight"] = mat(vocab, d, 0.7)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": d,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "bos_token_id": tok.token_to_id("<|begin_of_text|>"),
        "eos_token_id": tok.token_to_id("<|end_of_text|>"),
        "torch_dtype": "float32",
    }
    _save(root, t, config, tok)
    return t


def write_gpt2(root: Path, *, seed: int = 0, d: int = 64, layers: int = 2) -> dict[str, np.ndarray]:
    """A GPT2LMHeadModel directory (Conv1D weights stored inputs x outputs; tied head)."""
    tok = tokenizer("gpt2")
    vocab = tok.get_vocab_size()
    rng = np.random.default_rng(seed)

    def conv(cols_in: int, cols_out: int, gain: float = 1.0) -> np.ndarray:
        return (gain * rng.standard_normal((cols_in, cols_out)) / np.sqrt(cols_in)).astype(
            np.float32
        )

    def vec(n: int, mean: float = 0.0, scale: float = 0.1) -> np.ndarray:
        return (mean + scale * rng.standard_normal(n)).astype(np.float32)

    t = {
        "wte.weight": (0.3 * rng.standard_normal((vocab, d))).astype(np.float32),
        "wpe.weight": (0.5 * rng.standard_normal((128, d))).astype(np.float32),
    }
    for i in range(layers):
        p = f"h.{i}."
        t |= {
            p + "ln_1.weight": vec(d, 1.0, 0.2),
            p + "ln_1.bias": vec(d),
            p + "attn.c_attn.weight": conv(d, 3 * d, 0.7),
            p + "attn.c_attn.bias": vec(3 * d),
            p + "attn.c_proj.weight": conv(d, d),
            p + "attn.c_proj.bias": vec(d),
            p + "ln_2.weight": vec(d, 1.0, 0.2),
            p + "ln_2.bias": vec(d),
            p + "mlp.c_fc.weight": conv(d, 4 * d),
            p + "mlp.c_fc.bias": vec(4 * d),
            p + "mlp.c_proj.weight": conv(4 * d, d),
            p + "mlp.c_proj.bias": vec(d),
        }
    t |= {"ln_f.weight": vec(d, 0.3, 0.05), "ln_f.bias": vec(d)}  # logits of a few nats
    eot = tok.token_to_id("<|endoftext|>")
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_embd": d,
        "n_layer": layers,
        "n_head": 4,
        "n_positions": 128,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "vocab_size": vocab,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "torch_dtype": "float32",
    }
    _save(root, t, config, tok)
    return t
