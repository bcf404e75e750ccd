"""`convert --layout gguf` checked by llama.cpp itself (node-llama-cpp; skipped without it).

Tiny Hugging Face directories (`hf_tiny`: Llama with grouped-query attention, tied and
untied, and GPT-2) are converted with the command line; llama.cpp loads each file
without a warning and returns its next-token logits on a fixed token sequence, which
are compared, as distributions (KL divergence per token), with a forward pass written
here in float64 numpy from the Hugging Face definitions (rotary halves, Conv1D,
SwiGLU, grouped-query attention) on the weights the file holds: the float32 weights
themselves, or the Q8_0/Q4_0/MXFP4 ones decoded by the `gguf` package and moved back to the
Hugging Face layout by the inverse moves written here. The decoded weights are also
checked, bit for bit, against this library's own encode of the original weights with
blocks of 32 along their inputs. llama.cpp's tokenizer, read from the file, gives the
ids `tokenizers` gives.
"""

from __future__ import annotations

import numpy as np
import pytest
from hf_tiny import SAMPLES, tokenizer, write_gpt2, write_llama
from llama_cpp import kl, start

import dtypes
from precision._cli import main

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

MODELS = {"llama": write_llama, "llama-tied": write_llama, "gpt2": write_gpt2}


@pytest.fixture(scope="module")
def llama_cpp():
    server = start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    made = {}
    for name, write in MODELS.items():
        kwargs = {"tied": True, "seed": 1} if name == "llama-tied" else {}
        made[name] = (root / name, write(root / name, **kwargs))
    return made


def convert(src, dst, *flags: str) -> None:
    argv = ["convert", str(src), "-o", str(dst), *flags, "--layout", "gguf", "--no-stats", "-q"]
    assert main(argv) == 0


# --------------------------------------------------------------------------
# the reference forward passes (float64 numpy, Hugging Face's definitions)


def _softmax_attention(q, k, v):
    """Causal attention; q (T, H, hd), k and v (T, KV, hd) shared by H / KV heads each."""
    t, heads, hd = q.shape
    k, v = (np.repeat(a, heads // a.shape[1], axis=1) for a in (k, v))
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", weights, v).reshape(t, heads * hd)


def _rotary(x, theta):
    """Hugging Face's rotary embedding: the two halves of each head rotated together."""
    t, _, hd = x.shape
    angles = np.arange(t)[:, None] * theta ** (-np.arange(0, hd, 2) / hd)[None, :]
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None, :]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None, :]
    rotated = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
    return x * cos + rotated * sin


def llama_forward(w, tokens, heads=4, kv=2, eps=1e-5, theta=10000.0):
    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g

    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    x = w["model.embed_tokens.weight"][tokens]
    t = len(tokens)
    layers = len({k.split(".")[2] for k in w if k.startswith("model.layers.")})
    for i in range(layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, heads, -1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, kv, -1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, kv, -1)
        o = _softmax_attention(_rotary(q, theta), _rotary(k, theta), v)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        x = (
            x
            + (gate / (1 + np.exp(-gate)) * (h @ w[p + "mlp.up_proj.weight"].T))
            @ w[p + "mlp.down_proj.weight"].T
        )
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return rms(x, w["model.norm.weight"]) @ head.T


def gpt2_forward(w, tokens, heads=4, eps=1e-5):
    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))

    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    t = len(tokens)
    x = w["wte.weight"][tokens] + w["wpe.weight"][:t]
    layers = len({k.split(".")[1] for k in w if k.startswith("h.")})
    for i in range(layers):
        p = f"h.{i}."
        qkv = ln(x, p + "ln_1") @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (a.reshape(t, heads, -1) for a in np.split(qkv, 3, axis=-1))
        o = _softmax_attention(q, k, v)
        x = x + o @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = gelu(ln(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return ln(x, "ln_f") @ w["wte.weight"].T


# --------------------------------------------------------------------------
# the file's weights, back in the Hugging Face layout (the inverse moves, written here)


_LLAMA = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GPT2 = {
    "token_embd": "wte",
    "position_embd": "wpe",
    "output_norm": "ln_f",
    "attn_norm": "ln_1",
    "attn_qkv": "attn.c_attn",
    "attn_output": "attn.c_proj",
    "ffn_norm": "ln_2",
    "ffn_up": "mlp.c_fc",
    "ffn_down": "mlp.c_proj",
}


def _halves(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's interleaved rotary rows back to Hugging Face's halves per head."""
    n, d = rows.shape
    return rows.reshape(heads, n // heads // 2, 2, d).transpose(0, 2, 1, 3).reshape(n, d)


def file_weights(path, arch: str) -> dict[str, tuple[str, np.ndarray]]:
    """{Hugging Face name: (ggml type, float64 values)} of a GGUF file, by the gguf
    package's reader and dequantization alone."""
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)
        parts = t.name.split(".")
        if parts[0] == "blk":
            role, layer, leaf = parts[2], parts[1], parts[3]
        else:
            role, layer, leaf = parts[0], None, parts[1]
        table = _LLAMA if arch == "llama" else _GPT2
        if arch == "llama":
            name = (
                f"model.layers.{layer}.{table[role]}.{leaf}" if layer else f"{table[role]}.{leaf}"
            )
            if role in ("attn_q", "attn_k"):
                values = _halves(values, 4 if role == "attn_q" else 2)
        else:
            name = f"h.{layer}.{table[role]}.{leaf}" if layer else f"{table[role]}.{leaf}"
            if values.ndim == 2 and role not in ("token_embd", "position_embd"):
                values = values.T  # Conv1D: inputs x outputs
        out[name] = (t.tensor_type.name, values)
    return out


def _fixed_tokens(arch: str) -> list[int]:
    tok = tokenizer("llama" if arch.startswith("llama") else "gpt2")
    return tok.encode(SAMPLES[1] + SAMPLES[2]).ids[:40]


# --------------------------------------------------------------------------
# the tests


@pytest.mark.parametrize("arch", list(MODELS))
def test_float32_file_is_the_model(llama_cpp, hub, tmp_path, arch):
    src, weights = hub[arch]
    convert(src, tmp_path / "m.gguf", "--to", "float32")
    assert llama_cpp.load(tmp_path / "m.gguf") == []  # not a warning, tokenizer included
    stored = file_weights(tmp_path / "m.gguf", arch[:5] if arch != "gpt2" else "gpt2")
    assert set(stored) == set(weights)
    for name, (kind, values) in stored.items():
        assert kind == "F32", name
        np.testing.assert_array_equal(values, weights[name], name)  # the moves undone exactly
    tokens = _fixed_tokens(arch)
    forward = gpt2_forward if arch == "gpt2" else llama_forward
    divergence = kl(forward(weights, tokens), llama_cpp.logits(tokens))
    assert divergence.max() <= 1e-5, divergence


#: The three quantized types on both architectures (a tied Llama head among them).
QUANTIZED = [
    ("llama", "q4_0"),
    ("llama-tied", "q8_0"),
    ("llama", "mxfp4"),
    ("gpt2", "q8_0"),
    ("gpt2", "q4_0"),
    ("gpt2", "mxfp4"),
]
#: What this llama.cpp build (node-llama-cpp 3.22.1) logs of a file whose tensors are mostly
#: MXFP4: its guess of the file type from the most common tensor type has no case for MXFP4
#: (the `general.file_type` written, 38, is read after it). It computes with MXFP4 all the
#: same, as the distributions compared below show; a GPT-2 file, mostly float32 1-D
#: tensors, loads without it.
MXFP4_GUESS = ("warn", "llama_model_loader: unknown type mxfp4")
#: Weights whose codes are compared with this library's encode (one attention, one MLP).
CHECKED = {"llama": ("self_attn.k_proj", "mlp.down_proj"), "gpt2": ("attn.c_attn", "mlp.c_proj")}


def _ggml_q4_0(w: np.ndarray, *, transposed: bool) -> np.ndarray:
    """`w` quantized to Q4_0 and back by the `gguf` package (ggml's rule, `d = max / -8`),
    blocks along ggml's rows: a Conv1D weight's inputs are its first axis."""
    gguf = pytest.importorskip("gguf")
    q4_0 = gguf.GGMLQuantizationType.Q4_0
    rows = np.ascontiguousarray(w.T if transposed else w, np.float32)
    back = gguf.quants.dequantize(gguf.quants.quantize(rows, q4_0), q4_0).reshape(rows.shape)
    return np.asarray(back.T if transposed else back, np.float64)


@pytest.mark.parametrize(("arch", "preset"), QUANTIZED, ids=[f"{a}-{p}" for a, p in QUANTIZED])
def test_quantized_file_runs_its_codes(llama_cpp, hub, tmp_path, arch, preset):
    src, weights = hub[arch]
    convert(src, tmp_path / "m.gguf", "--preset", preset)
    logs = llama_cpp.load(tmp_path / "m.gguf")
    if preset == "mxfp4":  # the one word this llama.cpp says of MXFP4 (see MXFP4_GUESS)
        logs = [line for line in logs if line != MXFP4_GUESS]
    assert logs == []
    family = "gpt2" if arch == "gpt2" else "llama"
    stored = file_weights(tmp_path / "m.gguf", family)
    fmt = dtypes.get({"q8_0": "int8", "q4_0": "int4", "mxfp4": "mxfp4"}[preset])
    # blocks of 32 along the inputs: axis 0 of a Conv1D weight, the last of a Linear one;
    # float16 scales in Q8_0 and Q4_0, E8M0 (powers of two) in MXFP4
    axis = 0 if family == "gpt2" else -1
    if preset == "mxfp4":
        scaling = dtypes.PerBlock(32, axis, power_of_two=True, scale_format="float8_e8m0fnu")
    else:
        scaling = dtypes.PerBlock(32, axis, scale_format="float16")
    for name, (kind, values) in stored.items():
        if kind == "F32":  # kept: norms, biases, embeddings (the default --keep)
            np.testing.assert_array_equal(values, weights[name], name)
            continue
        assert kind == preset.upper(), name
        if name.startswith(("model.layers.0.", "h.0.")) and any(c in name for c in CHECKED[family]):
            if preset == "q4_0":  # ggml's own rounding (the gguf package's port of it)
                ours = _ggml_q4_0(weights[name], transposed=family == "gpt2")
            else:
                ours = np.asarray(fmt.encode(weights[name], scaling=scaling).decode(), np.float64)
            np.testing.assert_array_equal(values, ours, name)  # the same codes and scales
    decoded = {name: values for name, (_, values) in stored.items()}
    tokens = _fixed_tokens(arch)
    forward = gpt2_forward if arch == "gpt2" else llama_forward
    divergence = kl(forward(decoded, tokens), llama_cpp.logits(tokens))
    assert divergence.max() <= 1e-3, divergence
    # and the quantization is visible: the same file is not the float32 model
    assert kl(forward(weights, tokens), forward(decoded, tokens)).max() > 1e-6


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tokenizer_gives_the_ids_tokenizers_gives(llama_cpp, hub, tmp_path, arch):
    src, _ = hub[arch]
    convert(src, tmp_path / "m.gguf", "--to", "float16")
    assert llama_cpp.load(tmp_path / "m.gguf") == []
    tok = tokenizer(arch)
    for text in SAMPLES:
        assert llama_cpp.tokenize(text) == tok.encode(text, add_special_tokens=False).ids, text
