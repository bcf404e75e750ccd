"""A Hugging Face model as llama.cpp reads it from a GGUF file: names, keys, layout.

llama.cpp runs a GGUF file when it finds, besides the tensors, its own names for them
(`token_embd.weight`, `blk.0.attn_q.weight`, ...), the architecture's hyperparameters
under `ARCH.*` keys and the tokenizer under `tokenizer.ggml.*` (`_gguf_vocab`). Two
architectures are described here, from the model's `config.json`:

* **llama** (`LlamaForCausalLM`): RMSNorm, SwiGLU, rotary positions, grouped-query
  attention. Hugging Face rotates the two halves of each head's query and key rows
  (`rotate_half`); llama.cpp's rotation of this architecture pairs neighbouring rows,
  so the query and key rows of each head are interleaved (row `i` of the first half
  becomes row `2i`, row `i` of the second half row `2i + 1`): the same function.
* **gpt2** (`GPT2LMHeadModel`): LayerNorm, learned positions, a fused query-key-value
  projection, GELU (tanh). Its `Conv1D` weights are stored (inputs, outputs); ggml
  wants every matrix as (outputs, inputs), so they are transposed.

Both moves act on whole rows (a permutation) or swap the two axes, so a quantized
weight is converted in the orientation that puts its blocks of 32 along the inputs
and then moved as codes and scales, nothing re-rounded (`transform`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

import numpy as np

from .._errors import SaveError

__all__ = ["ARCHITECTURES", "Mapped", "Model", "describe", "permute_rows", "transform"]

#: What `--layout gguf` writes for llama.cpp: Hugging Face class -> llama.cpp architecture.
ARCHITECTURES = {"LlamaForCausalLM": "llama", "GPT2LMHeadModel": "gpt2"}

_TENSORS_ONLY = (
    "--layout gguf-tensors (the tensors alone under their Hugging Face names: the gguf "
    "package and precision.load read it, llama.cpp does not run it)"
)


@dataclasses.dataclass(frozen=True)
class Mapped:
    """One Hugging Face tensor as llama.cpp holds it: its name there and the move made
    on the way (`""`, `"transpose"`, or `"rope:N"`: rows interleaved per head of N)."""

    name: str
    move: str = ""


@dataclasses.dataclass
class Model:
    """What a GGUF file of this model holds beside the tensors, and where each goes.

    Attributes:
        arch: llama.cpp's architecture name.
        keys: (key, kind, value) of every metadata key but the tokenizer's; `kind` is
            one of "u32", "f32", "str", "bool".
        tensors: Hugging Face name -> `Mapped`.
        dropped: Hugging Face name -> why it is not written (buffers llama.cpp computes).
        config: the model's config.json.
    """

    arch: str
    keys: list[tuple[str, str, Any]]
    tensors: dict[str, Mapped]
    dropped: dict[str, str]
    config: dict[str, Any] = dataclasses.field(default_factory=dict)


def _config(home: str) -> dict[str, Any]:
    path = os.path.join(home, "config.json")
    if not os.path.isfile(path):
        raise SaveError(
            f"--layout gguf writes a file llama.cpp runs, which needs the model's config.json: "
            f"{home} has none; give IN as the Hugging Face model directory, or use "
            f"{_TENSORS_ONLY}"
        )
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise SaveError(f"{path}: not a JSON config ({exc})") from None
    if not isinstance(config, dict):
        raise SaveError(f"{path}: not a JSON object")
    return config


def _positive(key: str, value: Any, kind: type) -> Any:
    """`value` of config key `key`, refused unless a positive int (or number)."""
    ok = isinstance(value, kind if kind is int else int | float) and not isinstance(value, bool)
    if not ok or value <= 0:
        raise SaveError(
            f"config.json: {key} is {value!r}; llama.cpp needs a positive "
            f"{'integer' if kind is int else 'number'} there"
        )
    return value


def _number(config: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    return _positive(key, config.get(key, default), kind)


def _refuse(config: dict[str, Any], key: str, allowed: tuple[Any, ...], why: str) -> None:
    value = config.get(key, allowed[0])
    if value not in allowed:
        raise SaveError(
            f"config.json: {key} = {value!r}, which {why}; --layout gguf does not write this "
            f"model for llama.cpp; for its tensors alone use {_TENSORS_ONLY}"
        )


# --------------------------------------------------------------------------
# llama


def _llama_keys(config: dict[str, Any]) -> tuple[list[tuple[str, str, Any]], int, int]:
    _refuse(config, "hidden_act", ("silu",), "llama.cpp's llama does not compute")
    _refuse(config, "rope_scaling", (None,), "is a rope scaling this writer does not describe")
    _refuse(config, "attention_bias", (False,), "adds biases this writer does not map")
    _refuse(config, "mlp_bias", (False,), "adds biases this writer does not map")
    d = _number(config, "hidden_size", int)
    heads = _number(config, "num_attention_heads", int)
    kv = _positive("num_key_value_heads", config.get("num_key_value_heads") or heads, int)
    head_dim = config.get("head_dim") or d // heads
    if heads % kv or head_dim % 2:
        raise SaveError(
            f"config.json: {heads} attention heads, {kv} key-value heads, head size "
            f"{head_dim}: llama.cpp needs the heads a multiple of the key-value heads and an "
            "even head size"
        )
    keys = [
        ("llama.context_length", "u32", _number(config, "max_position_embeddings", int)),
        ("llama.embedding_length", "u32", d),
        ("llama.block_count", "u32", _number(config, "num_hidden_layers", int)),
        ("llama.feed_forward_length", "u32", _number(config, "intermediate_size", int)),
        ("llama.attention.head_count", "u32", heads),
        ("llama.attention.head_count_kv", "u32", kv),
        ("llama.attention.layer_norm_rms_epsilon", "f32", _number(config, "rms_norm_eps", float)),
        ("llama.rope.freq_base", "f32", float(_number(config, "rope_theta", float, 10000.0))),
        ("llama.rope.dimension_count", "u32", head_dim),
        ("llama.vocab_size", "u32", _number(config, "vocab_size", int)),
    ]
    if head_dim != d // heads:
        keys += [
            ("llama.attention.key_length", "u32", head_dim),
            ("llama.attention.value_length", "u32", head_dim),
        ]
    return keys, heads, kv


_LLAMA_LAYER = {
    "input_layernorm.weight": ("attn_norm.weight", ""),
    "self_attn.q_proj.weight": ("attn_q.weight", "q"),
    "self_attn.k_proj.weight": ("attn_k.weight", "k"),
    "self_attn.v_proj.weight": ("attn_v.weight", ""),
    "self_attn.o_proj.weight": ("attn_output.weight", ""),
    "post_attention_layernorm.weight": ("ffn_norm.weight", ""),
    "mlp.gate_proj.weight": ("ffn_gate.weight", ""),
    "mlp.up_proj.weight": ("ffn_up.weight", ""),
    "mlp.down_proj.weight": ("ffn_down.weight", ""),
}
_LLAMA_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _llama(config: dict[str, Any], names: list[str]) -> Model:
    keys, heads, kv = _llama_keys(config)
    layer = re.compile(r"model\.layers\.(\d+)\.(.+)")
    tensors, dropped = {}, {}
    for name in names:
        match = layer.fullmatch(name)
        if name in _LLAMA_TOP:
            tensors[name] = Mapped(_LLAMA_TOP[name])
        elif match and match[2] in _LLAMA_LAYER:
            target, rope = _LLAMA_LAYER[match[2]]
            move = {"q": f"rope:{heads}", "k": f"rope:{kv}", "": ""}[rope]
            tensors[name] = Mapped(f"blk.{match[1]}.{target}", move)
        elif match and match[2] == "self_attn.rotary_emb.inv_freq":
            dropped[name] = "rotary frequencies, which llama.cpp computes from rope.freq_base"
    return Model("llama", keys, tensors, dropped)


# --------------------------------------------------------------------------
# gpt2


def _gpt2_keys(config: dict[str, Any]) -> list[tuple[str, str, Any]]:
    _refuse(
        config,
        "activation_function",
        ("gelu_new", "gelu_pytorch_tanh"),
        "llama.cpp's gpt2 does not compute (its GELU is the tanh approximation)",
    )
    for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        _refuse(config, key, (False,), "changes the attention llama.cpp's gpt2 computes")
    _refuse(config, "scale_attn_weights", (True,), "changes the attention llama.cpp computes")
    d = _number(config, "n_embd", int)
    inner = config.get("n_inner") or 4 * d
    positions = config.get("n_positions", config.get("n_ctx"))
    return [
        ("gpt2.context_length", "u32", _positive("n_positions", positions, int)),
        ("gpt2.embedding_length", "u32", d),
        ("gpt2.feed_forward_length", "u32", _positive("n_inner", inner, int)),
        ("gpt2.block_count", "u32", _number(config, "n_layer", int)),
        ("gpt2.attention.head_count", "u32", _number(config, "n_head", int)),
        (
            "gpt2.attention.layer_norm_epsilon",
            "f32",
            float(_number(config, "layer_norm_epsilon", float, 1e-5)),
        ),
    ]


_GPT2_LAYER = {
    "ln_1": "attn_norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
}
_GPT2_TOP = {
    "wte.weight": "token_embd.weight",
    "wpe.weight": "position_embd.weight",
    "ln_f.weight": "output_norm.weight",
    "ln_f.bias": "output_norm.bias",
}


def _gpt2(config: dict[str, Any], names: list[str]) -> Model:
    keys = _gpt2_keys(config)
    layer = re.compile(r"h\.(\d+)\.(.+)\.(weight|bias)")
    tensors, dropped = {}, {}
    for full in names:
        name = full.removeprefix("transformer.")
        match = layer.fullmatch(name)
        if name in _GPT2_TOP:
            tensors[full] = Mapped(_GPT2_TOP[name])
        elif full == "lm_head.weight":
            tensors[full] = Mapped("output.weight")
        elif match and match[2] in _GPT2_LAYER:
            conv = match[3] == "weight" and not match[2].startswith("ln_")
            target = f"blk.{match[1]}.{_GPT2_LAYER[match[2]]}.{match[3]}"
            tensors[full] = Mapped(target, "transpose" if conv else "")
        elif re.fullmatch(r"h\.\d+\.attn\.(masked_)?bias", name):
            dropped[full] = "the causal mask buffer, which llama.cpp builds itself"
    return Model("gpt2", keys, tensors, dropped)


# --------------------------------------------------------------------------
# the model


def _architecture(config: dict[str, Any], home: str) -> str:
    listed = config.get("architectures")
    names = listed if isinstance(listed, list) else [listed]
    for name in names:
        if name in ARCHITECTURES:
            return str(name)
    supported = ", ".join(ARCHITECTURES)
    raise SaveError(
        f"{home}/config.json: architecture {listed!r} is not one --layout gguf writes for "
        f"llama.cpp (supported: {supported}); for another architecture use {_TENSORS_ONLY}"
    )


def describe(home: str, names: list[str]) -> Model:
    """The model in directory `home` (its config.json) whose tensors are `names`: where
    each goes in llama.cpp's file, and its keys. Every tensor is placed or dropped with a
    reason; a name the architecture does not know is refused, never left out unsaid."""
    config = _config(home)
    arch = _architecture(config, home)
    model = (_llama if ARCHITECTURES[arch] == "llama" else _gpt2)(config, names)
    unknown = [n for n in names if n not in model.tensors and n not in model.dropped]
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise SaveError(
            f"{home}: tensor {shown}{more} is not part of {arch} as llama.cpp runs it, so this "
            f"checkpoint is not a plain {arch}; for its tensors alone use {_TENSORS_ONLY}"
        )
    targets = {m.name for m in model.tensors.values()}
    need = "token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight"
    missing = [n for n in need if n not in targets]
    if missing:
        raise SaveError(f"{home}: no tensor for llama.cpp's {missing[0]} among {arch}'s")
    model.config = config
    name = config.get("_name_or_path") or os.path.basename(os.path.abspath(home))
    model.keys = [
        ("general.architecture", "str", model.arch),
        ("general.name", "str", str(name)),
        *model.keys,
    ]
    return model


# --------------------------------------------------------------------------
# moving the tensors


def permute_rows(rows: int, heads: int) -> np.ndarray:
    """The source row of each row of a rotary weight in llama.cpp's order: per head of
    `rows // heads` rows, row i of the first half goes to 2i, of the second to 2i + 1."""
    size = rows // heads
    half = np.arange(size // 2)
    within = np.stack([half, half + size // 2], axis=1).reshape(-1)  # 0, h, 1, h+1, ...
    out: np.ndarray = (np.arange(heads)[:, None] * size + within[None, :]).reshape(-1)
    return out


def transform(move: str, array: np.ndarray) -> np.ndarray:
    """`array` (rows first) moved as llama.cpp holds it: rows permuted for `rope:N`,
    axes swapped for `transpose`. Used on values, codes and ggml's block rows alike."""
    if move.startswith("rope:"):
        out: np.ndarray = array[permute_rows(array.shape[0], int(move[5:]))]
        return out
    if move == "transpose":
        return np.ascontiguousarray(array.T)
    return array
