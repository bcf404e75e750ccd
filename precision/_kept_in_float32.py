"""What a quantized model keeps in float32: the one pattern `quantize` and the CLI share.

Free of JAX, so the command line can read it before it loads JAX.
"""

from __future__ import annotations

__all__ = ["KEEP"]

KEEP = (
    r"norm|(^|[._/])ln(_?[a-z0-9]+)?([._/]|$)|bias"
    r"|embed|(^|[._/])(wte|wpe|shared|tok_embeddings)([._/]|$)"
)
"""What `precision.quantize` and `precision convert --keep` keep in float32 for formats of
8 bits or fewer: norms, biases and embeddings, in the spellings of the common model
families (GPT-2 ln_1/ln_f/wte/wpe, BERT LayerNorm/word_embeddings, Llama
input_layernorm/embed_tokens/norm, T5 layer_norm/shared; a Flax LayerNorm's `scale`
sits under the norm's name). A regex, searched case-insensitively in a leaf's key path
or a checkpoint's tensor name."""
