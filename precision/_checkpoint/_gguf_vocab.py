"""A `tokenizer.json` as llama.cpp's `tokenizer.ggml.*` keys: byte-level BPE.

llama.cpp tokenizes a byte-level BPE vocabulary (GPT-2's kind, and Llama 3's) itself,
from the keys written here: the model `gpt2`, its pre-tokenizer by name, every token
with its type, the merges in rank order, the special token ids and whether a
beginning-of-text token is added. Its pre-tokenizers are fixed regular expressions
chosen by name, so the name is read off the tokenizer's own pre-tokenizer, and anything
that llama.cpp would split differently is refused, naming what was found:

* `gpt-2`: `ByteLevel` with its built-in regular expression (GPT-2, and the
  byte-level tokenizers `tokenizers` trains by default);
* `llama-bpe`: Llama 3's `Split` regular expression, then `ByteLevel` without its own.

A normalizer, byte fallback, subword prefixes or dropout have no llama.cpp
counterpart in this mode and are refused the same way.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .._errors import SaveError

__all__ = ["vocabulary"]

#: Llama 3's pre-tokenizer pattern (the `Split` of its tokenizer.json).
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: llama.cpp's token types.
_NORMAL, _UNUSED, _CONTROL, _USER = 1, 5, 3, 4


def _pre(doc: dict[str, Any], where: str) -> str:
    """llama.cpp's name of the tokenizer's pre-tokenizer."""
    pre = doc.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        name = "gpt-2"
    elif (
        kinds == ["Split", "ByteLevel"]
        and steps[0].get("pattern", {}).get("Regex") == _LLAMA3
        and steps[0].get("behavior") == "Isolated"
        and not steps[0].get("invert", False)
        and not steps[1].get("use_regex", True)
    ):
        name = "llama-bpe"
    else:
        raise SaveError(
            f"{where}: pre-tokenizer {json.dumps(pre)[:200]} is not one llama.cpp "
            "applies by name (ByteLevel with its own regex: gpt-2; Llama 3's Split then "
            "ByteLevel: llama-bpe); llama.cpp would split text differently"
        )
    if any(s.get("add_prefix_space") for s in steps):
        raise SaveError(
            f"{where}: its ByteLevel adds a prefix space, which llama.cpp's {name} does not"
        )
    return name


def _check_model(doc: dict[str, Any], where: str) -> dict[str, Any]:
    model = doc.get("model") or {}
    if model.get("type") != "BPE":
        raise SaveError(
            f"{where}: a {model.get('type')!r} tokenizer; --layout gguf writes byte-level BPE "
            "tokenizers (GPT-2's and Llama 3's kind) for llama.cpp"
        )
    for key in ("continuing_subword_prefix", "end_of_word_suffix", "dropout", "normalizer"):
        value = doc.get(key) if key == "normalizer" else model.get(key)
        if value:
            raise SaveError(f"{where}: {key} {value!r} has no counterpart in llama.cpp's BPE")
    if model.get("byte_fallback"):
        raise SaveError(f"{where}: byte_fallback is SentencePiece's, not byte-level BPE's")
    if (doc.get("decoder") or {}).get("type") != "ByteLevel":
        raise SaveError(f"{where}: its decoder is not ByteLevel, so it is not byte-level BPE")
    return model


def _added(doc: dict[str, Any], where: str) -> dict[int, tuple[str, int]]:
    out = {}
    for token in doc.get("added_tokens") or []:
        out[int(token["id"])] = (str(token["content"]), _CONTROL if token.get("special") else _USER)
    return out


def _adds(doc: dict[str, Any]) -> tuple[bool, bool]:
    """(adds a token first, adds one last): the post-processor's template for one text."""
    post = doc.get("post_processor") or {}
    steps = post.get("processors", []) if post.get("type") == "Sequence" else [post]
    for step in steps:
        if step.get("type") == "TemplateProcessing":
            single = step.get("single") or []
            first = bool(single) and "SpecialToken" in single[0]
            last = bool(single) and "SpecialToken" in single[-1]
            return first, last
    return False, False


def _special_id(config: dict[str, Any], key: str, size: int, where: str) -> int | None:
    value = config.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise SaveError(f"{where}: {key} {value!r} is not a token of its {size} tokens")
    return value


def vocabulary(home: str, config: dict[str, Any], size: int) -> list[tuple[str, str, Any]]:
    """The `tokenizer.ggml.*` keys (key, kind, value) for the tokenizer of the model in
    `home`, padded to `size` tokens (the embedding's rows) with unused ones."""
    path = os.path.join(home, "tokenizer.json")
    if not os.path.isfile(path):
        raise SaveError(
            f"{home} has no tokenizer.json: llama.cpp reads the tokenizer from the GGUF file, "
            "and --layout gguf writes it from the Hugging Face tokenizer.json (byte-level BPE)"
        )
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise SaveError(f"{path}: not a JSON tokenizer ({exc})") from None
    model = _check_model(doc, path)
    pre = _pre(doc, path)
    if bool(model.get("ignore_merges")) != (pre == "llama-bpe"):
        raise SaveError(
            f"{path}: ignore_merges is {bool(model.get('ignore_merges'))} with the {pre} "
            f"pre-tokenizer; llama.cpp's {pre} {'ignores' if pre == 'llama-bpe' else 'applies'} "
            "the merges of a word found whole in the vocabulary, so it would split some "
            "words differently"
        )
    tokens: dict[int, tuple[str, int]] = {
        int(i): (str(t), _NORMAL) for t, i in model.get("vocab", {}).items()
    }
    tokens.update(_added(doc, path))
    top = max(tokens, default=-1) + 1
    if top > size:
        raise SaveError(f"{path}: token id {top - 1} is beyond the model's {size} embedding rows")
    texts = [tokens.get(i, (f"[PAD{i}]", _UNUSED))[0] for i in range(size)]
    types = [tokens.get(i, ("", _UNUSED))[1] for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if not merges:
        raise SaveError(
            f"{path}: a BPE tokenizer without merges; llama.cpp's byte-level BPE reads at "
            "least one (tokenizer.ggml.merges)"
        )
    first, last = _adds(doc)
    keys: list[tuple[str, str, Any]] = [
        ("tokenizer.ggml.model", "str", "gpt2"),
        ("tokenizer.ggml.pre", "str", pre),
        ("tokenizer.ggml.tokens", "strs", texts),
        ("tokenizer.ggml.token_type", "i32s", types),
        ("tokenizer.ggml.merges", "strs", merges),
        ("tokenizer.ggml.add_bos_token", "bool", first),
        ("tokenizer.ggml.add_eos_token", "bool", last),
    ]
    for key, name in (
        ("bos_token_id", "bos"),
        ("eos_token_id", "eos"),
        ("pad_token_id", "padding"),
    ):
        found = _special_id(config, key, size, f"{home}/config.json")
        if found is not None:
            keys.append((f"tokenizer.ggml.{name}_token_id", "u32", found))
    return keys
