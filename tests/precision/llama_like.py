"""A tiny Hugging Face style Llama checkpoint with random weights.

Llama's tensor names and shape relations (`model.embed_tokens`, the attention's
`q_proj`/`k_proj`/`v_proj`/`o_proj` with fewer key/value heads than query heads, the
gated MLP's `gate_proj`/`up_proj`/`down_proj`, RMS norms, `lm_head`), all Linear weights
stored (out, in), in one `model.safetensors` beside a `config.json` that transformers
builds `LlamaForCausalLM` from, offline. The head is tied to the embeddings (no
`lm_head.weight`, `tie_word_embeddings: true`) or has a weight of its own. With
`experts=N` it is a Mixtral: each block's MLP is N experts (`w1`, `w2`, `w3`, named as
the hub names them) chosen by a router, `block_sparse_moe.gate`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import safetensors.numpy

#: Widths that every block size the layout tests use (32, 64) divides.
SIZE = {"hidden": 128, "intermediate": 256, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 256}


def llama_shapes(
    hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int
) -> dict[str, tuple[int, ...]]:
    kv = hidden // heads * kv_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "mlp.gate_proj.weight": (intermediate, hidden),
            p + "mlp.up_proj.weight": (intermediate, hidden),
            p + "mlp.down_proj.weight": (hidden, intermediate),
        }
    return shapes | {"model.norm.weight": (hidden,)}


def mixtral_shapes(experts: int) -> dict[str, tuple[int, ...]]:
    """Llama's shapes with each block's MLP made `experts` experts and their router."""
    shapes = {}
    for name, shape in llama_shapes(**SIZE).items():
        block, _, rest = name.partition(".mlp.")
        if not rest:
            shapes[name] = shape
            continue
        if rest == "gate_proj.weight":
            shapes[f"{block}.block_sparse_moe.gate.weight"] = (experts, SIZE["hidden"])
        for e in range(experts):
            w = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}[rest.split(".")[0]]
            shapes[f"{block}.block_sparse_moe.experts.{e}.{w}.weight"] = shape
    return shapes


def write_llama_like(
    root: Path,
    *,
    tied: bool,
    head: bool | None = None,
    seed: int = 0,
    dtype: str = "float32",
    experts: int = 0,
) -> dict[str, np.ndarray]:
    """Write the checkpoint into the new directory `root`; return its tensors.

    `head` (default: not `tied`) writes `lm_head.weight`; a tied model with one is what
    some exporters write (transformers ties it to the embeddings all the same).
    """
    rng = np.random.default_rng(seed)
    shapes = mixtral_shapes(experts) if experts else llama_shapes(**SIZE)
    if not tied if head is None else head:
        shapes["lm_head.weight"] = (SIZE["vocab"], SIZE["hidden"])
    tensors = {
        name: (
            1 + 0.1 * rng.standard_normal(shape)
            if len(shape) == 1
            else 0.05 * rng.standard_normal(shape)
        ).astype(np.float32)
        for name, shape in shapes.items()
    }
    if "lm_head.weight" in tensors and tied:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    root.mkdir(parents=True)
    safetensors.numpy.save_file(tensors, str(root / "model.safetensors"), {"format": "pt"})
    config: dict[str, object] = {
        "architectures": ["MixtralForCausalLM" if experts else "LlamaForCausalLM"],
        "model_type": "mixtral" if experts else "llama",
        "hidden_size": SIZE["hidden"],
        "intermediate_size": SIZE["intermediate"],
        "num_hidden_layers": SIZE["layers"],
        "num_attention_heads": SIZE["heads"],
        "num_key_value_heads": SIZE["kv_heads"],
        "vocab_size": SIZE["vocab"],
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tied,
        "torch_dtype": dtype,
    }
    if experts:
        config |= {"num_local_experts": experts, "num_experts_per_tok": 2}
    (root / "config.json").write_text(json.dumps(config, indent=2))
    return tensors
