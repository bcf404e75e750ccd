"""The compressed-tensors layout: quantized weights as vLLM and transformers load them.

A Hugging Face checkpoint directory whose `config.json` holds a `quantization_config`
with `"quant_method": "compressed-tensors"`. Each quantized weight `M.weight` (a 2-D
`Linear` weight: rows are output channels, the last axis is summed over) is stored as:

* **pack-quantized** (symmetric integers of 2, 4 or 8 bits, weights only):
  `M.weight_packed` (I32, rows × ceil(cols·bits / 32)): each code plus 2**(bits-1) as an
  unsigned field, element j of a row at bit j·bits of the row's little-endian bit
  stream, padding bits zero; `M.weight_scale`; `M.weight_shape` (I64, [rows, cols]);
* **naive-quantized** (float8 e4m3, weights only): `M.weight` (F8_E4M3), `M.weight_scale`;
* **mxfp4-pack-quantized**: `M.weight_packed` (U8, two e2m1 codes a byte, the first in
  the low nibble), `M.weight_scale` (U8: E8M0 bytes, one per 32 values of a row).

A value is its code times the scale of its group. The groups (`strategy`): `tensor`,
one scale of shape (1,); `channel`, one per row, (rows, 1); `group`, `group_size`
consecutive values of a row, (rows, cols / group_size). Scales are F32, BF16 or F16.
`group_size` must divide the rows: the compressed-tensors package refuses to decompress
a shorter last group (written here, it is refused before converting; read, another
writer's shorter last group has its own scale).

These coincide with this library's symmetric encodings (`IntFormat` with `PerTensor`,
`PerAxis(0)` or `PerBlock(g)`, scales in float32, bfloat16 or float16; float8_e4m3fn
likewise; MXFP4): our int codes are two's complement fields packed along rows from the
low bits, so adding 2**(bits-1) to a field is flipping its top bit, and a row of our
bytes, padded to whole 32-bit words, is the packed row. Everything else has no
equivalent here and is refused (`refusal`). The command line writes the files
(`precision/_cli/_output_layouts.py`); `read` turns them back into leaves for `load`.

The readers quantize what they build as a Linear layer (transformers' `nn.Linear`,
vLLM's `LinearBase`) and nothing else: a quantized array of any other module is an
unexpected key to them, and that module's `weight` a missing one, filled at random. So
what `not_linear` names is written in float and its module listed in `ignore`: tensors
other than 2-D `.weight`s, embeddings (by their names), the Conv1D layers of the
architectures built with them (GPT-2's `c_attn`, `c_proj`, `c_fc`: (in, out) weights
in a module of its own, which the readers leave alone), mixture-of-experts routers, and
an output head that may share the embeddings' weight. Each `ignore` entry is
`re:(.*\\.)?NAME$`: the readers match module names, and a class for a task adds a prefix
to a base model's names (GPT-2's `h.0.attn.c_attn` is `transformer.h.0.attn.c_attn` in
`GPT2LMHeadModel`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

import dtypes
from dtypes import FloatFormat, Format, IntFormat, PerAxis, PerBlock, PerTensor, Scaling

from .._errors import CheckpointError
from ._layout import SCALE_DTYPES, Leaf, LeafArrays
from ._source import Source
from ._third_party_codes import checked, codes_of, stored, tensor_leaf

__all__ = [
    "QUANT_METHOD",
    "Model",
    "Module",
    "config_of",
    "conv1d",
    "decompressed_in_bfloat16",
    "from_words",
    "ignore_list",
    "module_of",
    "not_linear",
    "quantization_config",
    "read",
    "refusal",
    "streamed_words",
    "to_words",
]

QUANT_METHOD = "compressed-tensors"

#: Integer widths whose packing is one field per `bits` bits with no word padding
#: (every version of the layout packs these the same way).
_PACKED_BITS = (2, 4, 8)
#: Bytes whose set bits are the top bit of every field: XOR adds 2**(bits-1) to each.
_TOP_BITS = {2: 0xAA, 4: 0x88, 8: 0x80}
#: Scale formats the layout stores, by safetensors dtype.
_SCALE_FORMATS = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


#: Model types whose attention and MLP layers are Conv1D modules, (in, out) weights that
#: the readers build as a module of their own, never as a Linear layer; and their names.
_CONV1D_TYPES = frozenset(
    {"gpt2", "openai-gpt", "imagegpt", "decision_transformer", "clvp", "clvp_decoder"}
)
_CONV1D_MODULES = frozenset({"c_attn", "q_attn", "c_proj", "c_fc"})
#: Module names of embeddings (embed_tokens, word_embeddings, wte, T5's shared, ...).
_EMBEDDING = re.compile(r"(^|\.)(\w*embed\w*|wte|wpe|shared|tok_embeddings)$", re.IGNORECASE)
#: The last names of mixture-of-experts routers (Mixtral's `block_sparse_moe.gate`, Qwen's
#: `mlp.gate` and `shared_expert_gate`, `mlp.router`): built as parameters of a router
#: module, not as Linear layers, or left unquantized by the readers.
_ROUTERS = frozenset({"gate", "router", "shared_expert_gate"})
#: The output head a causal language model's class adds (tied to the embeddings or not).
_HEAD = "lm_head"


@dataclasses.dataclass(frozen=True)
class Model:
    """What a model's `config.json` says about the modules its readers build."""

    model_type: str
    tied: bool  # the output head may share the input embeddings' weight

    @classmethod
    def of(cls, config: dict[str, Any]) -> Model:
        """From `config.json`: a head is tied unless `tie_word_embeddings` is false (at
        the top or in `text_config`), as the class default may tie it."""
        text = config.get("text_config")
        tie = config.get("tie_word_embeddings")
        if tie is None and isinstance(text, dict):
            tie = text.get("tie_word_embeddings")
        model_type = config.get("model_type")
        return cls(model_type if isinstance(model_type, str) else "", tie is not False)


def conv1d(name: str, model: Model) -> bool:
    """Whether tensor `name` is the weight of one of `model`'s Conv1D modules, stored
    (in, out) where a Linear layer's weight is (out, in)."""
    module = name.removesuffix(".weight")
    return (
        module != name
        and model.model_type in _CONV1D_TYPES
        and module.rsplit(".", 1)[-1] in _CONV1D_MODULES
    )


def not_linear(name: str, shape: tuple[int, ...], model: Model) -> str | None:
    """Why the readers would not quantize tensor `name` as a Linear layer's weight, or None.

    Such a tensor is kept in float (the caller lists its module in `ignore`); the reason
    (which names no tensor: the caller counts them) is what `convert` prints.
    """
    if not name.endswith(".weight") or len(shape) != 2:
        return "not a 2-D weight: compressed-tensors quantizes those of Linear layers only"
    module = name[: -len(".weight")]
    if _EMBEDDING.search(module):
        return "an embedding (by its name): compressed-tensors' readers quantize Linear layers only"
    if conv1d(name, model):
        return (
            f"a Conv1D weight of {model.model_type}, (in, out): compressed-tensors' readers "
            "quantize Linear layers only"
        )
    if module.rsplit(".", 1)[-1] in _ROUTERS:
        return "a mixture-of-experts router: compressed-tensors' readers do not quantize it"
    if module == _HEAD and model.tied:
        return (
            "the output head, which may share the embeddings' weight (config.json does not "
            "set tie_word_embeddings to false)"
        )
    return None


def ignore_list(quantized: Iterable[str], kept: Iterable[str], model: Model) -> list[str]:
    """The `ignore` entries of the modules whose weights are kept in float.

    `kept` are those modules (`NAME` of a `NAME.weight` written in float), and the tied
    output head is added where the file has none. Each entry matches the module under
    any prefix a reader's class adds; `ValueError` names an entry that would also match
    a quantized module (`a.b` kept and `x.a.b` quantized), which the readers would then
    load in float from arrays of codes.
    """
    quantized = set(quantized)
    names = sorted(set(kept) - quantized)
    if model.tied and _HEAD not in quantized and _HEAD not in names:
        names.append(_HEAD)
    for name in names:
        clash = sorted(q for q in quantized if q.endswith("." + name))
        if clash:
            raise ValueError(
                f"module {name!r} is kept in float and {clash[0]!r} quantized: a reader may "
                f"add a prefix to {name!r}, so no ignore entry names one and not the other; "
                f"keep {clash[0]!r} too (--exclude) or quantize {name!r}"
            )
    return [f"re:(.*\\.)?{re.escape(name)}$" for name in names]


def _e2m1(fmt: Format) -> bool:
    return (
        isinstance(fmt, FloatFormat)
        and (fmt.exponent_bits, fmt.mantissa_bits) == (2, 1)
        and bool(fmt.finite)
    )


def decompressed_in_bfloat16(fmt: Format) -> bool:
    """Whether the readers decompress weights of `fmt` in bfloat16 whatever the model's
    dtype: mxfp4's E8M0 scales become bfloat16, and so do its weights (a float32 model
    then fails in its first Linear layer)."""
    return _e2m1(fmt)


def _e4m3fn(fmt: Format) -> bool:
    ref = dtypes.float8_e4m3fn
    assert isinstance(ref, FloatFormat)
    return isinstance(fmt, FloatFormat) and all(
        getattr(fmt, a) == getattr(ref, a)
        for a in ("exponent_bits", "mantissa_bits", "finite", "nan", "saturate")
    )


@dataclasses.dataclass(frozen=True)
class Module:
    """What one converted weight becomes: its module, the layout's format and arrays."""

    module: str  # "h.0.attn.c_attn" for "h.0.attn.c_attn.weight"
    format: str  # the layout's name of the format: "pack-quantized", ...
    weights: dict[str, Any]  # the scheme's `weights` arguments
    data: tuple[str, np.dtype, tuple[int, ...]]  # the codes' array
    scale: tuple[str, np.dtype, tuple[int, ...]]
    shape: tuple[int, ...]  # the weight's shape (`weight_shape` where written)
    bits: int  # of a packed integer code, or 0

    def arrays(self) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
        """(name, dtype, shape) of the arrays the module stores, in file order."""
        out = [self.data, self.scale]
        if self.format == "pack-quantized":
            out.append((f"{self.module}.weight_shape", np.dtype("<i8"), (2,)))
        return out


def _strategy(scaling: Scaling, shape: tuple[int, ...]) -> tuple[str, int | None] | None:
    """The layout's (strategy, group_size) of `scaling` on a 2-D weight, or None."""
    if isinstance(scaling, PerTensor):
        return "tensor", None
    if isinstance(scaling, PerAxis) and scaling.kept(len(shape)) == (0,):
        return "channel", None
    if isinstance(scaling, PerBlock) and int(scaling.axis) % 2 == 1:
        return "group", int(scaling.size)
    return None


def _scale_dtype(scaling: Scaling) -> np.dtype:
    """The numpy type of stored float32, bfloat16 or float16 scales."""
    return SCALE_DTYPES[scaling.scale_format]


def refusal(name: str, fmt: Format, scaling: Scaling | None, shape: tuple[int, ...]) -> str | None:
    """Why the layout cannot hold tensor `name` converted to `fmt` with `scaling`, or None.

    `name` is a 2-D weight that `not_linear` lets through. The message (which names no
    tensor: the caller lists them) says what was asked, what the layout holds and the
    flags that would work.
    """
    where = f"{fmt.name} with {scaling or 'no scaling'}"
    if scaling is not None and "scales" not in str(scaling):
        where += ", float32 scales"
    holds = (
        "compressed-tensors holds int8, int4 and int2 (pack-quantized), float8_e4m3fn "
        "(naive-quantized) and mxfp4 weights"
    )
    if _e2m1(fmt):
        mx = PerBlock(32, power_of_two=True, scale_format="float8_e8m0fnu")
        if scaling != mx:
            return (
                f"{where}: the 4-bit float layout written is mxfp4-pack-quantized, e2m1 in "
                "blocks of 32 with E8M0 scales (compressed-tensors' NVFP4 divides by a global "
                "scale where this library multiplies by a tensor scale: not the same values); "
                "use --to mxfp4"
            )
        return _partial_group(where, scaling, shape, "--to int4 --scaling per-axis:0")
    if isinstance(fmt, IntFormat) and not fmt.binary and fmt.bits in _PACKED_BITS:
        pass
    elif _e4m3fn(fmt):
        pass
    else:
        return f"{where}: {holds}; convert with --to int8, int4, float8_e4m3fn or mxfp4"
    if scaling is None:
        return f"{where}: the layout stores a scale with every weight; add --scaling per-axis:0"
    if scaling.scale_format not in _SCALE_FORMATS:
        return (
            f"{where}: the layout stores float32, bfloat16 or float16 scales, not "
            f"{scaling.scale_format}; end --scaling with :f32, :bf16 or :fp16 instead"
        )
    if _strategy(scaling, shape) is None:
        return (
            f"{where}: the layout's scales are per tensor, per row (per-axis:0) or per "
            "block of a row (per-block:SIZE); use --scaling per-axis:0 or per-block:128"
        )
    return _partial_group(
        where, scaling, shape, "a block size that divides the rows, --scaling per-axis:0"
    )


def _partial_group(
    where: str, scaling: Scaling, shape: tuple[int, ...], instead: str
) -> str | None:
    """Why blocks of `scaling` that do not divide a row cannot be written, or None.

    The layout's `group` strategy has rows of whole groups: the compressed-tensors package
    refuses to decompress a shorter last group.
    """
    if isinstance(scaling, PerBlock) and shape[1] % int(scaling.size):
        return (
            f"{where}: the layout's groups divide each row (the compressed-tensors package "
            f"refuses a shorter last group); use {instead}, or keep these tensors (--exclude)"
        )
    return None


def module_of(name: str, fmt: Format, scaling: Scaling, shape: tuple[int, ...]) -> Module:
    """The layout of one weight that `refusal` accepts."""
    module = name[: -len(".weight")]
    strategy, group = _strategy(scaling, shape) or ("group", 32)
    scale_shape = (1,) if strategy == "tensor" else scaling.scale_shape(shape)
    data: tuple[str, np.dtype, tuple[int, ...]]
    scale: tuple[str, np.dtype, tuple[int, ...]]
    if _e2m1(fmt):
        rows, cols = shape
        data = (f"{module}.weight_packed", np.dtype(np.uint8), (rows, (cols + 1) // 2))
        scale = (f"{module}.weight_scale", np.dtype(np.uint8), tuple(scale_shape))
        args = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group"}
        args |= {"group_size": 32, "dynamic": False}
        return Module(module, "mxfp4-pack-quantized", args, data, scale, shape, 0)
    scale = (f"{module}.weight_scale", _scale_dtype(scaling), scale_shape)
    args = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy}
    args |= {"group_size": group, "dynamic": False}
    if isinstance(fmt, IntFormat):
        bits = fmt.bits
        words = (shape[1] * bits + 31) // 32
        data = (f"{module}.weight_packed", np.dtype("<i4"), (shape[0], words))
        args |= {"num_bits": bits, "type": "int"}
        return Module(module, "pack-quantized", args, data, scale, shape, bits)
    data = (f"{module}.weight", np.dtype(dtypes.float8_e4m3fn.container), shape)
    return Module(module, "naive-quantized", args, data, scale, shape, 0)


# --------------------------------------------------------------------------
# our arrays -> the layout's


def _row_bytes(cols: int, bits: int) -> int:
    return (cols * bits + 7) // 8


def _clear_padding(rows: np.ndarray, cols: int, bits: int) -> None:
    """Zero the bits after the last field of each row (in place)."""
    used = (cols * bits) % 8
    if used:
        rows[:, _row_bytes(cols, bits) - 1] &= np.uint8((1 << used) - 1)


def to_words(packed: np.ndarray, cols: int, bits: int) -> np.ndarray:
    """The layout's int32 words of our packed rows (uint8 or int8, rows × row bytes)."""
    rows = np.ascontiguousarray(packed).view(np.uint8).reshape(-1, _row_bytes(cols, bits))
    flipped = rows ^ np.uint8(_TOP_BITS[bits])
    _clear_padding(flipped, cols, bits)
    words = (cols * bits + 31) // 32
    out = np.zeros((rows.shape[0], 4 * words), np.uint8)
    out[:, : rows.shape[1]] = flipped
    return out.view("<i4")


def from_words(words: np.ndarray, cols: int, bits: int) -> np.ndarray:
    """Our packed rows (uint8, rows × row bytes) of the layout's int32 words."""
    raw = np.ascontiguousarray(words).astype("<i4", copy=False).view(np.uint8)
    rows = raw.reshape(words.shape[0], -1)[:, : _row_bytes(cols, bits)] ^ np.uint8(_TOP_BITS[bits])
    _clear_padding(rows, cols, bits)
    return np.ascontiguousarray(rows)


def streamed_words(pieces: Iterable[np.ndarray], bits: int) -> Iterator[np.ndarray]:
    """`to_words` of rows that fill whole words, piece by piece (any piece sizes)."""
    carry = np.zeros(0, np.uint8)
    for piece in pieces:
        flat = np.concatenate([carry, np.ascontiguousarray(piece).reshape(-1).view(np.uint8)])
        whole = flat.size - flat.size % 4
        carry = flat[whole:].copy()
        if whole:
            yield (flat[:whole] ^ np.uint8(_TOP_BITS[bits])).view("<i4")
    if carry.size:  # pragma: no cover - whole rows are whole words
        raise ValueError(f"{carry.size} bytes left over a word")


def quantization_config(modules: list[Module], ignore: list[str]) -> dict[str, Any]:
    """The `quantization_config` of `config.json` for these quantized modules.

    One config group per scheme; a single group targets every `Linear` layer, and
    `ignore` (from `ignore_list`) names the modules whose weights are kept in float.
    """
    groups: dict[str, tuple[str, dict[str, Any], list[str]]] = {}
    for m in modules:
        key = json.dumps([m.format, m.weights], sort_keys=True)
        groups.setdefault(key, (m.format, m.weights, []))[2].append(m.module)
    formats = {fmt for fmt, _, _ in groups.values()}
    config_groups = {}
    for i, (fmt, weights, names) in enumerate(groups.values()):
        scheme: dict[str, Any] = {
            "targets": ["Linear"] if len(groups) == 1 else sorted(names),
            "weights": weights,
            "input_activations": None,
            "output_activations": None,
        }
        if len(formats) > 1:
            scheme["format"] = fmt
        config_groups[f"group_{i}"] = scheme
    return {
        "config_groups": config_groups,
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "global_compression_ratio": None,
        "ignore": ignore,
        "kv_cache_scheme": None,
        "quant_method": QUANT_METHOD,
        "quantization_status": "compressed",
    }


# --------------------------------------------------------------------------
# the layout's arrays -> leaves (for `load`)


def config_of(source: Source) -> dict[str, Any] | None:
    """The compressed-tensors `quantization_config` beside a checkpoint, or None."""
    path = source.path
    directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    if not source.sharded and not os.path.isdir(path):
        return None  # a single file given by name: read as it is
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if isinstance(quant, dict) and quant.get("quant_method") == QUANT_METHOD:
        return quant
    return None


def _scheme(module: str, config: dict[str, Any], where: str) -> dict[str, Any]:
    """The `weights` arguments of the config group that quantizes `module`."""
    groups = [g for g in config.get("config_groups", {}).values() if isinstance(g, dict)]
    named, by_class = [], []
    for g in groups:
        targets = [t for t in g.get("targets", []) if isinstance(t, str)]
        if any(t == module or (t.startswith("re:") and re.match(t[3:], module)) for t in targets):
            named.append(g)
        elif any(not t.startswith("re:") and "." not in t for t in targets):
            by_class.append(g)  # a layer class ("Linear"): cannot be checked from a name
    found = named or by_class
    if len(found) != 1:
        raise CheckpointError(
            f"{where}: {len(found)} config groups of quantization_config may quantize "
            f"{module!r}; this reader needs exactly one"
        )
    weights = found[0].get("weights")
    if not isinstance(weights, dict):
        raise CheckpointError(f"{where}: the config group of {module!r} has no weights")
    if weights.get("symmetric") is False or weights.get("actorder") == "group":
        raise CheckpointError(
            f"{where}: {module!r} is quantized with zero points or a group index "
            "(symmetric: false or actorder: group), which this library does not read"
        )
    return weights


def _scaling(weights: dict[str, Any], scale: np.ndarray, shape: tuple[int, ...]) -> Scaling:
    strategy, group = weights.get("strategy"), weights.get("group_size")
    scale_format = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}.get(
        np.dtype(scale.dtype).name, ""
    )
    if _e2m1_scales(weights):
        return PerBlock(32, power_of_two=True, scale_format="float8_e8m0fnu")
    if not scale_format:
        raise CheckpointError(f"scales of dtype {scale.dtype} are not read")
    if strategy == "tensor" and scale.size == 1:
        return PerTensor(scale_format=scale_format)
    if strategy == "channel" and scale.shape == (shape[0], 1):
        return PerAxis(0, scale_format=scale_format)
    if strategy == "group" and isinstance(group, int) and group > 0:
        # another writer's last group shorter than the others has its own scale (the
        # scales are ceil(cols / group_size) a row, as this library's padded blocks)
        if scale.shape == (shape[0], -(-shape[1] // group)):
            return PerBlock(group, scale_format=scale_format)
    raise CheckpointError(
        f"strategy {strategy!r} (group_size {group}) with scales of shape "
        f"{list(scale.shape)} on a {list(shape)} weight is not a layout this library reads"
    )


def _e2m1_scales(weights: dict[str, Any]) -> bool:
    return weights.get("type") == "float" and weights.get("num_bits") == 4


def read(source: Source, config: dict[str, Any]) -> list[tuple[Leaf, LeafArrays]]:
    """Every leaf of a compressed-tensors checkpoint, quantized weights as encodings.

    A weight whose codes this library's formats do not hold as they are is widened or
    decoded (`_third_party_codes`); every other tensor is a plain leaf, as in any foreign file.
    """
    readers = {name: r for r in source.readers for name in r.entries}
    out: list[tuple[Leaf, LeafArrays]] = []
    done: set[str] = set()
    for reader in source.readers:
        for leaf in reader.leaves:
            if leaf.name in done:
                continue
            module = _module_name(leaf.name, readers)
            if module is None:
                out.append((leaf, reader.read_leaf(leaf)))
                continue
            done.update(n for n in readers if n.startswith(module + ".weight"))
            try:
                out.append(_weight(module, readers, config, reader.path))
            except CheckpointError as exc:
                text = str(exc)
                if text.startswith(reader.path):
                    raise
                raise CheckpointError(
                    f"{reader.path}: tensor {module + '.weight'!r}: {text}"
                ) from None
    return out


def _module_name(name: str, readers: dict[str, Any]) -> str | None:
    """The module whose quantized weight array `name` is, or None."""
    for suffix in (".weight_packed", ".weight_scale", ".weight_shape", ".weight"):
        if name.endswith(suffix):
            module = name[: -len(suffix)]
            if f"{module}.weight_scale" in readers and (
                f"{module}.weight_packed" in readers or f"{module}.weight" in readers
            ):
                return module
    return None


def _weight(
    module: str, readers: dict[str, Any], config: dict[str, Any], where: str
) -> tuple[Leaf, LeafArrays]:
    def get(suffix: str) -> np.ndarray:
        name = f"{module}.{suffix}"
        return np.asarray(readers[name].read(name))

    if f"{module}.weight_zero_point" in readers or f"{module}.weight_g_idx" in readers:
        raise CheckpointError(
            "it is stored with zero points or a group index, which this library does not read"
        )
    weights = _scheme(module, config, where)
    scale = get("weight_scale")
    name = f"{module}.weight"
    if f"{module}.weight_packed" in readers and _e2m1_scales(weights):
        data = get("weight_packed")
        if data.dtype != np.uint8 or scale.dtype != np.uint8:
            raise CheckpointError("mxfp4 codes and scales are U8 arrays")
        shape: tuple[int, ...] = (data.shape[0], 2 * data.shape[1])
        leaf = tensor_leaf(name, shape, dtypes.get("mxfp4"), _scaling(weights, scale, shape))
        return checked(leaf, data, scale, where)
    if f"{module}.weight_packed" in readers:
        bits = weights.get("num_bits")
        if bits not in _PACKED_BITS or weights.get("type") != "int":
            raise CheckpointError(
                f"packed {weights.get('type')} codes of {bits} bits are not read (int codes "
                f"of {', '.join(map(str, _PACKED_BITS))} bits are)"
            )
        shape = tuple(int(d) for d in get("weight_shape").reshape(-1))
        if len(shape) != 2:
            raise CheckpointError(f"weight_shape {list(shape)} is not a 2-D shape")
        codes = codes_of(from_words(get("weight_packed"), shape[1], bits), bits, shape[1])
        return stored(name, codes, bits, scale, _scaling(weights, scale, shape), where)
    data = get("weight")
    shape = tuple(data.shape)
    if len(shape) != 2:
        raise CheckpointError(f"a quantized weight of shape {list(shape)} is not 2-D")
    scaling = _scaling(weights, scale, shape)
    if data.dtype == np.int8:
        return stored(name, data, 8, scale, scaling, where)
    if data.dtype == np.dtype(dtypes.float8_e4m3fn.container):
        return checked(tensor_leaf(name, shape, dtypes.float8_e4m3fn, scaling), data, scale, where)
    raise CheckpointError(f"quantized weights of dtype {data.dtype} are not read")
