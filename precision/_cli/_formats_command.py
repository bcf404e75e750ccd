"""`precision formats`: the storage formats and named encodings, with their true storage.

Each row is read from `dtypes`' registries; the bits a value takes are measured
from the format's own `nbytes` at two sizes (`_true_bits`), so scales, zero points
and tensor scales are counted as stored.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._output import _table


def _format_row(fmt: Any, registry: str) -> dict[str, Any]:
    import dtypes

    names = dtypes.ALIASES if registry == "FORMATS" else dtypes.ENCODING_ALIASES
    aliases = sorted(a for a, n in names.items() if n == fmt.name)
    per_value, per_tensor = _true_bits(fmt)
    scaling = fmt.default_scaling()
    row: dict[str, Any] = {
        "name": fmt.name,
        "registry": registry,
        "kind": fmt.kind,
        "bits": fmt.bits,
        "container": fmt.container.name + (" (packed)" if fmt.packed else ""),
        "max": fmt.max,
        "smallest": getattr(fmt, "smallest_subnormal", None),
        "eps": getattr(fmt, "eps", None),
        "scaled": "always" if fmt.kind in ("int", "uint", "codebook") else "optional",
        "scaling": None if scaling is None else str(scaling),
        "bits_per_value": per_value,
        "bytes_per_tensor": per_tensor,
        "aliases": aliases,
    }
    return row


def _true_bits(fmt: Any) -> tuple[float, int]:
    """(storage bits per value of a large tensor, bytes held once per tensor), with the
    format's default scaling: codes, scales, zero points and tensor scales all counted.

    Two sizes whose last axis every block size divides tell them apart: the
    difference of their `nbytes` is per value, the rest per tensor.
    """
    from fractions import Fraction

    rows, cols = 256, 4096
    small, large = fmt.nbytes((rows, cols)), fmt.nbytes((2 * rows, cols))
    per_value = Fraction(8 * (large - small), rows * cols)
    per_tensor = small - per_value * rows * cols / 8
    return float(per_value), int(per_tensor)


def _brief_scaling(scaling: Any) -> str:
    """A composition's scaling in a few words: `per-block 32, E8M0 scales`."""
    if scaling is None:
        return "-"
    kind = type(scaling).__name__
    where = {"PerTensor": "per-tensor", "PerAxis": f"per-axis {getattr(scaling, 'axis', '')}"}
    text = where.get(kind, f"per-block {getattr(scaling, 'size', '')}")
    names = {"float8_e8m0fnu": "E8M0", "float8_e4m3fn": "e4m3", "float32": "float32"}
    scale_format = scaling.scale_format
    text += f", {names.get(scale_format, scale_format)} scales"
    if scaling.two_level:
        text += " x float32 tensor scale"
    return text


def _cmd_formats(args: argparse.Namespace) -> int:
    """`precision formats`: every storage format and named encoding, with the numbers
    that decide between them (`--json`: the rows as JSON)."""
    import dtypes

    rows = [_format_row(f, "FORMATS") for f in dtypes.FORMATS.values()]
    encodings = [_format_row(f, "ENCODINGS") for f in dtypes.ENCODINGS.values()]
    if args.json:
        print(json.dumps(rows + encodings, indent=2))
        return 0

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.6g}"

    table = [
        [
            r["name"],
            r["kind"],
            str(r["bits"]),
            r["container"],
            num(r["max"]),
            num(r["smallest"]),
            num(r["eps"]),
            r["scaled"],
            ", ".join(r["aliases"]),
        ]
        for r in rows
    ]
    header = ["format", "kind", "bits", "container", "max", "smallest", "eps", "scales", "aliases"]
    print(_table(table, header, right={2, 4, 5, 6}))
    print("\nint max is the largest code: values are code * scale.")
    table = [
        [
            r["name"],
            r["kind"],
            str(r["bits"]),
            num(r["max"]),
            _brief_scaling(fmt.default_scaling()),
            f"{r['bits_per_value']:g}",
            str(r["bytes_per_tensor"]) if r["bytes_per_tensor"] else "-",
            ", ".join(r["aliases"]),
        ]
        for r, fmt in zip(encodings, dtypes.ENCODINGS.values(), strict=True)
    ]
    header = ["encoding", "kind", "bits", "max", "scaling", "bits/value", "+B/tensor", "aliases"]
    print("\nNamed encodings (ml_dtypes layouts, OCP MX, NVFP4, code books, zero points):\n")
    print(_table(table, header, right={2, 3, 5, 6}))
    print(
        "\nbits/value: storage of a large tensor per value, scales and zero points included; "
        "+B/tensor: bytes held once per tensor (NVFP4's float32 tensor scale, per-tensor "
        "scales and zero points)."
    )
    return 0
