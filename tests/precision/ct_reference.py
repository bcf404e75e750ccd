"""The compressed-tensors layout read from its published description, in plain numpy.

`decode` reads a compressed-tensors model directory with nothing of this library's: its
`config.json` scheme, `weight_packed` / `weight_scale` / `weight_shape`, each code plus
2**(bits-1) in `bits`-bit fields of little-endian int32 words from the low bits, e4m3
codes, mxfp4's e2m1 nibbles under E8M0 scales; a value is its code times its group's
scale. `ignored` is the readers' rule for an `ignore` entry: the module's name itself,
or `re:` and a regular expression matched at the start of the name.
"""

from __future__ import annotations

import json
import re

import ml_dtypes
import numpy as np
from gpt2_like import read_directory


def _float32(dtype: str, raw: np.ndarray) -> np.ndarray:
    if dtype == "BF16":
        return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return raw.astype(np.float32)


# e2m1 codes: sign bit 3, then the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6
_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6] * 2, np.float32) * np.float32([1] * 8 + [-1] * 8)


def _groups(scale: np.ndarray, weights: dict, shape: tuple[int, int]) -> np.ndarray:
    """A scale per value: one for the tensor, per row (channel) or per group of a row."""
    strategy = weights["strategy"]
    if strategy == "tensor":
        assert scale.shape == (1,)
        return np.broadcast_to(scale.reshape(1, 1), shape)
    if strategy == "channel":
        assert scale.shape == (shape[0], 1)
        return np.broadcast_to(scale, shape)
    assert strategy == "group"  # ceil(cols / group_size) groups: the last may be shorter
    size = weights["group_size"]
    assert scale.shape == (shape[0], -(-shape[1] // size))
    return np.repeat(scale, size, axis=1)[:, : shape[1]]


def decode(root) -> dict[str, np.ndarray]:
    """Every tensor of a compressed-tensors directory as float32 values.

    Quantized weights are the exact products: float32 holds every product of a code of at
    most 8 bits and a 16-bit scale (or a power of two).
    """
    config = json.loads((root / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors"
    assert config["quantization_status"] == "compressed"
    (group,) = config["config_groups"].values()
    assert group["targets"] == ["Linear"]
    weights = group["weights"]
    assert weights["symmetric"] is True
    assert weights["dynamic"] is False
    tensors, _ = read_directory(root)
    out = {}
    for name, (dtype, raw) in tensors.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith((".weight_scale", ".weight_shape")):
            continue
        quantized = name.endswith(".weight_packed") or (
            name.endswith(".weight") and f"{module}.weight_scale" in tensors
        )
        if not quantized:
            out[name] = _float32(dtype, raw)  # as stored
            continue
        sdtype, sraw = tensors[f"{module}.weight_scale"]
        if name.endswith(".weight_packed") and config["format"] == "pack-quantized":
            assert dtype == "I32"
            bits = weights["num_bits"]
            assert weights["type"] == "int"
            shape = tuple(tensors[f"{module}.weight_shape"][1])
            assert tensors[f"{module}.weight_shape"][0] == "I64"
            words = raw.view(np.uint32)
            assert words.shape == (shape[0], -(-shape[1] * bits // 32))
            j = np.arange(shape[1])
            fields = (words[:, j * bits // 32] >> (j * bits % 32).astype(np.uint32)) & (
                (1 << bits) - 1
            )
            codes = fields.astype(np.int64) - (1 << (bits - 1))
            scale = _groups(_float32(sdtype, sraw), weights, shape)
            value = codes.astype(np.float32) * scale
        elif name.endswith(".weight_packed"):
            assert config["format"] == "mxfp4-pack-quantized"
            assert dtype == "U8"
            assert sdtype == "U8"
            assert weights["group_size"] == 32
            assert weights["type"] == "float"
            nibbles = np.stack([raw & 15, raw >> 4], axis=-1).reshape(raw.shape[0], -1)
            scale = np.ldexp(np.float32(1), sraw.astype(np.int32) - 127).astype(np.float32)
            value = _E2M1[nibbles] * np.repeat(scale, 32, axis=1)
        else:
            assert config["format"] == "naive-quantized"
            assert dtype == "F8_E4M3"
            assert weights["type"] == "float"
            assert weights["num_bits"] == 8
            values = raw.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
            value = values * _groups(_float32(sdtype, sraw), weights, raw.shape)
        out[module + ".weight"] = np.ascontiguousarray(value)  # (fancy indexing: F order)
    return out


def ignored(ignore: list[str], module: str) -> bool:
    """Whether an entry of `ignore` names `module`, as the readers match it."""
    return any(
        re.match(entry[3:], module) is not None if entry.startswith("re:") else entry == module
        for entry in ignore
    )
