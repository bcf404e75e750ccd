"""The `precision` command line: formats, convert, report, demo.

Exit codes: 0 success, 2 usage error (bad flags, unknown format, bad regex),
1 data error (unreadable or corrupted checkpoint, unwritable destination,
non-finite values in a scaled conversion). Errors are one line on stderr,
never a traceback.

This module holds the parser, the `formats` subcommand and `main`; `convert`
and `report` live in `_cli_convert` and `_cli_report`, and what they share
(the one-line errors, table formatting) in `_cli_output`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

import dtypes

from .._errors import PrecisionError
from ._convert import _DEFAULT, _cmd_convert
from ._output import PROG, _DataError, _table, _UsageError
from ._report import _cmd_report

__all__ = ["main"]


# --------------------------------------------------------------------------
# argument types


def _format_arg(text: str) -> dtypes.Format:
    try:
        return dtypes.get(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# --scaling grammar:
#   none                  unscaled (float formats only)
#   per-tensor[:pow2]     one scale per tensor
#   per-axis:AXIS[:pow2]  one scale per index along AXIS
#   per-block:SIZE[:pow2] one scale per SIZE consecutive values of the last axis
def _scaling_arg(text: str) -> dtypes.Scaling | None:
    parts = text.strip().lower().split(":")
    pow2 = parts[-1] == "pow2"
    if pow2:
        parts = parts[:-1]
    kind, args = parts[0], parts[1:]
    try:
        if kind == "none" and not args and not pow2:
            return None
        if kind == "per-tensor" and not args:
            return dtypes.PerTensor(power_of_two=pow2)
        if kind == "per-axis" and len(args) == 1:
            return dtypes.PerAxis(int(args[0]), power_of_two=pow2)
        if kind == "per-block" and len(args) == 1:
            return dtypes.PerBlock(int(args[0]), power_of_two=pow2)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(
        f"bad scaling {text!r}; use per-tensor, per-axis:AXIS, per-block:SIZE (each optionally "
        "followed by :pow2 for power-of-two scales) or none"
    )


def _regex_arg(text: str) -> re.Pattern:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"bad regular expression {text!r}: {exc}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Reduced-precision formats and checkpoints for JAX.",
        epilog="Run 'precision COMMAND --help' for the options of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "formats",
        help="list the storage formats",
        description="List every built-in storage format with its numbers and aliases.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_formats)

    p = sub.add_parser(
        "convert",
        help="convert a checkpoint to another format",
        description=(
            "Convert every floating tensor of a safetensors checkpoint to FORMAT, one tensor at "
            "a time, and write the result atomically (the destination is replaced only once the "
            "new file is complete)."
        ),
        epilog=(
            "Examples: precision convert model.safetensors -o model-int8.safetensors --to int8; "
            "precision convert m.safetensors -o m4.safetensors --to int4 --scaling per-block:32 "
            "--exclude 'norm|bias'"
        ),
    )
    p.add_argument("input", metavar="IN", help="checkpoint to read (safetensors)")
    p.add_argument("-o", "--output", metavar="OUT", required=True, help="checkpoint to write")
    p.add_argument(
        "--to",
        metavar="FORMAT",
        required=True,
        type=_format_arg,
        help="target format: a name or alias from 'precision formats'",
    )
    p.add_argument(
        "--scaling",
        type=_scaling_arg,
        default=_DEFAULT,
        help=(
            "per-tensor, per-axis:AXIS, per-block:SIZE (add :pow2 for power-of-two scales) or "
            "none; default: per-tensor for integer formats, none for float formats"
        ),
    )
    p.add_argument(
        "--rounding",
        choices=dtypes.ROUNDING_MODES,
        default="nearest_even",
        help="rounding mode (default: nearest_even)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="random seed of --rounding stochastic (default 0)"
    )
    p.add_argument(
        "--include",
        metavar="REGEX",
        type=_regex_arg,
        help="convert only tensors whose name matches (re.search)",
    )
    p.add_argument(
        "--exclude",
        metavar="REGEX",
        type=_regex_arg,
        help="keep tensors whose name matches unchanged (applied after --include)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace OUT if it exists (even when OUT is IN)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser(
        "report",
        help="compare two checkpoints tensor by tensor",
        description=(
            "Compare the logical values of OTHER against REF, tensor by tensor (matched by name): "
            "OTHER's format and bytes, max and mean relative error, and SQNR."
        ),
        epilog="Example: precision report model.safetensors model-int8.safetensors --plot err.png",
    )
    p.add_argument("ref", metavar="REF", help="reference checkpoint")
    p.add_argument("other", metavar="OTHER", help="checkpoint to compare with REF")
    p.add_argument("--plot", metavar="FILE.png", help="write histograms of the errors to a PNG")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_report)

    sub.add_parser(
        "demo",
        help="train the demo CNN in every precision mode (see 'precision demo --help')",
        add_help=False,
    )
    return parser


# --------------------------------------------------------------------------
# formats


def _format_row(fmt: dtypes.Format) -> dict[str, Any]:
    aliases = sorted(a for a, n in dtypes.ALIASES.items() if n == fmt.name)
    row: dict[str, Any] = {
        "name": fmt.name,
        "kind": fmt.kind,
        "bits": fmt.bits,
        "container": fmt.container.name + (" (packed)" if fmt.packed else ""),
        "max": fmt.max,
        "smallest": getattr(fmt, "smallest_subnormal", None),
        "eps": getattr(fmt, "eps", None),
        "scaled": "always" if fmt.kind == "int" else "optional",
        "aliases": aliases,
    }
    return row


def _cmd_formats(args: argparse.Namespace) -> int:
    rows = [_format_row(f) for f in dtypes.FORMATS.values()]
    if args.json:
        print(json.dumps(rows, indent=2))
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
    return 0


# --------------------------------------------------------------------------
# entry point


def _demo(argv: list[str]) -> int:
    try:
        from . import _demo
    except ImportError as exc:
        print(f"{PROG}: error: the demo is not available ({exc})", file=sys.stderr)
        return 1
    try:
        return int(_demo.main(argv))
    except SystemExit as exc:  # the demo's own --help or usage error
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def main(argv: list[str] | None = None) -> int:
    """Run the `precision` command line with `argv` (default: sys.argv[1:]).

    Returns the exit status: 0 success, 1 data error, 2 usage error.

    Examples:
        >>> main(["formats"])  # doctest: +ELLIPSIS
        format ...
        0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":
        return _demo(argv[1:])
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    try:
        return args.func(args)
    except _UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (_DataError, PrecisionError, ValueError, OSError) as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing was written", file=sys.stderr)
        return 130


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
