"""`precision convert --preset NAME`: named recipes, a `--to` and a `--scaling` each.

Imports nothing, so `precision --help` lists them without loading the formats.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named `--to` and `--scaling`, for the common weight-only recipes."""

    to: str
    scaling: str | None
    what: str


#: `--preset NAME`: the recipes people ask for by name. The axis of a per-channel
#: scale is 0: PyTorch and Hugging Face checkpoints store a layer's weight as
#: (out_features, in_features), so axis 0 indexes its output channels.
PRESETS = {
    "w8-channel": Preset(
        "int8", "per-axis:0", "int8 weights, one float32 scale per output channel (axis 0)"
    ),
    "w4-g128": Preset(
        "int4",
        "per-block:128:fp16",
        "int4 weights, one float16 scale per 128 consecutive values of a row (GPTQ/AWQ groups)",
    ),
    "fp8-tensor": Preset(
        "float8_e4m3fn", "per-tensor", "float8 e4m3 weights, one float32 scale per tensor"
    ),
    "q8_0": Preset(
        "int8",
        "per-block:32:fp16",
        "ggml's Q8_0: int8 weights, one float16 scale per 32 values of a row",
    ),
    "q4_0": Preset(
        "int4",
        "per-block:32:fp16",
        "ggml's Q4_0: int4, one float16 scale per 32 values of a row (in --layout gguf "
        "rounded as ggml's own quantizer rounds, codes -8..7)",
    ),
    "mxfp4": Preset("mxfp4", None, "OCP MXFP4 (ggml's MXFP4): e2m1 values, an E8M0 scale per 32"),
}


def preset_help() -> str:
    """The `--preset` help text: each preset with the flags it stands for."""
    lines = [
        f"{name} (--to {p.to}{'' if p.scaling is None else ' --scaling ' + p.scaling}: {p.what})"
        for name, p in PRESETS.items()
    ]
    return "a named recipe: " + "; ".join(lines) + "; --rounding and the other flags still apply"
