"""The `precision` command line: formats, convert, report, demo.

Exit codes: 0 success, 2 usage error (bad flags, unknown format, bad regex,
flags that cannot go together, nothing to convert), 1 data error
(unreadable or corrupted checkpoint, unwritable destination, non-finite
values in a scaled conversion), 130 interrupted (Ctrl-C: nothing written).
Errors are one line on stderr, never a traceback.

This module holds the parser and `main`. It imports neither JAX nor the
commands until the arguments are parsed, so `--help`, `--version` and usage
errors answer at once; `formats`, `convert` and `report` live in
`_formats_command`, `_convert_command` and `_report`, what they share (the
one-line errors, table formatting) in `_output`.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import textwrap
from typing import Any, NoReturn

from .._errors import UsageError
from ._interrupts import acting_from_here, check_interrupt, deferring, interrupt_handler
from ._output import PROG, seed_argument
from ._presets import PRESETS, preset_help

__all__ = ["main"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("precision")
    except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
        return "unknown"


class _VersionAction(argparse.Action):
    """`--version`: the installed version, read from the package metadata only when asked
    (importing `importlib.metadata` and reading it is a tenth of a short convert's time)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        sys.stdout.write(f"{PROG} {_version()}\n")
        parser.exit()


# --------------------------------------------------------------------------
# argument types (checked without importing JAX; formats and scalings are
# resolved against the registry once the arguments are parsed)

# --scaling grammar:
#   none                            unscaled (float formats only)
#   per-tensor[:pow2][:SCALES]      one scale per tensor
#   per-axis:AXIS[:pow2][:SCALES]   one scale per index along AXIS
#   per-block:SIZE[:pow2][:SCALES]  one scale per SIZE consecutive values of the last axis
# :pow2 rounds the scales to powers of two; SCALES names their format
# (float32, bfloat16, float16, float8_e4m3fn, float8_e8m0fnu or an alias that
# dtypes.get resolves to one: f32, bf16, fp16, e4m3, e8m0). Without SCALES a
# named encoding keeps its own scale format and anything else stores float32.
# SCALES is resolved, and the whole scaling checked against --to, in
# _convert_command before anything is read.
_SCALING = re.compile(
    r"none|(per-tensor|per-axis:-?\d{1,3}|per-block:\d{1,9})(:pow2)?(:[a-z][a-z0-9_]{0,31})?"
)
_SCALING_HELP = (
    "use per-tensor, per-axis:AXIS, per-block:SIZE (each optionally followed by :pow2 for "
    "power-of-two scales, then by a scale format: f32, bf16, fp16, e4m3 or e8m0) or none"
)


def _scaling_text(text: str) -> str:
    text = text.strip().lower()
    if not _SCALING.fullmatch(text):
        raise argparse.ArgumentTypeError(f"bad scaling {text!r}; {_SCALING_HELP}")
    return text


def _regex_arg(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text, re.IGNORECASE)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"bad regular expression {text!r}: {exc}") from None


def _size_arg(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r}; give bytes with an optional unit, e.g. 5GB, 500MiB, 1000000"
        )
    unit = (m.group(2) or "b").rstrip("b") or "b"
    base = 1024 if unit.endswith("i") else 1000
    power = {"b": 0, "k": 1, "m": 2, "g": 3, "t": 4}[unit[0]]
    size = int(float(m.group(1)) * base**power)
    if size < 1:
        raise argparse.ArgumentTypeError(f"shard size {text!r} must be at least one byte")
    return size


def _db_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad SQNR threshold {text!r}; give decibels") from None
    if value != value:
        raise argparse.ArgumentTypeError("the SQNR threshold cannot be NaN")
    return value


def _positive_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


class _HelpFormatter(argparse.HelpFormatter):
    """Help wrapped between words only: `per-axis:0` and `--max-shard-size` stay whole,
    so what the help shows can be copied."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        text = " ".join(text.split())
        return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        text = " ".join(text.split())
        return textwrap.fill(
            text,
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
            break_long_words=False,
        )


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (the usage is one --help away), and
    whose unknown options name the command's option they may have meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def parse_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._command(parsed)
            command.error(_unrecognized(extras, command))
        return parsed

    def _command(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The parser of the command `parsed` ran (this one if it has none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(str(getattr(parsed, action.dest, "")))
                if isinstance(chosen, argparse.ArgumentParser):
                    return chosen
        return self


def _unrecognized(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """'unrecognized arguments: ...', with the option each unknown one may have meant."""
    known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    guesses = []
    for extra in extras:
        word = extra.split("=", 1)[0]
        if word.startswith("-"):
            close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
            if close:
                guesses.append(f"{word}: did you mean {close[0]}?")
    text = f"unrecognized arguments: {' '.join(extras)}"
    return text + (f" ({'; '.join(guesses)})" if guesses else "")


def _parser() -> argparse.ArgumentParser:
    """The argument parser of every command: a table, one `add_argument` per option
    with its help text, read best whole (it is the one function over 60 lines that
    tests/test_module_sizes.py allows)."""
    parser = _Parser(
        prog=PROG,
        description="Reduced-precision formats and checkpoints for JAX.",
        epilog="Run 'precision COMMAND --help' for the options of a command.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="show the program's version number and exit"
    )
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_Parser
    )

    p = sub.add_parser(
        "formats",
        help="list the storage formats",
        description="List every storage format of the registry with its numbers and aliases.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser(
        "convert",
        help="convert a checkpoint to another format",
        description=(
            "Convert the floating tensors of a safetensors checkpoint (one file, or a sharded "
            "directory with model.safetensors.index.json) to FORMAT, streaming each tensor in "
            "blocks, and write the result atomically: nothing is written unless the whole "
            "conversion succeeds, and an interrupt (Ctrl-C) leaves no trace."
        ),
        epilog=(
            "Examples: precision convert model.safetensors -o model-int8.safetensors --to int8; "
            "precision convert llm/ -o llm-int4/ --to int4 --dry-run"
        ),
    )
    p.add_argument(
        "input",
        metavar="IN",
        nargs="?",  # required unless --list-keep: checked by the command
        help="checkpoint to read: a .safetensors file, a directory of shards with an index "
        "file, or the index file itself",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="checkpoint to write: a file, or a directory of shards (with the files beside "
        "IN's tensors) when IN is a directory or --max-shard-size is given (required unless "
        "--dry-run)",
    )
    p.add_argument(
        "--to",
        metavar="FORMAT",
        help="target format: any name or alias that 'precision formats' lists (required "
        "unless --preset)",
    )
    p.add_argument("--preset", choices=list(PRESETS), help=preset_help())
    p.add_argument(
        "--scaling",
        type=_scaling_text,
        default=None,
        help="per-tensor, per-axis:AXIS, per-block:SIZE or none; add :pow2 for power-of-two "
        "scales, then the scales' format: f32 (default), bf16, fp16, e4m3 or e8m0 (e.g. "
        "per-block:128:bf16, per-block:32:pow2:e8m0); default: per-block:32 for 4-bit and "
        "narrower integer formats, per-axis:0 for int8 and uint8 (a scale per output channel; "
        "per-tensor for tensors of one axis), the format's own default (scale format "
        "included) for float formats and named encodings; a Conv1D weight stored inputs x "
        "outputs (GPT-2's, by the config.json beside the tensors) gets per-axis:1 and blocks "
        "along its inputs (axis 0)",
    )
    p.add_argument(
        "--rounding",
        default="nearest_even",
        help="rounding mode: nearest_even (default), nearest_away, toward_zero, up, down or "
        "stochastic",
    )
    p.add_argument(
        "--seed",
        type=seed_argument,
        default=0,
        help="random seed of --rounding stochastic (0 to 2**63 - 1; default 0)",
    )
    p.add_argument(
        "--include",
        metavar="REGEX",
        type=_regex_arg,
        help="convert only tensors whose name matches (re.search, case-insensitive)",
    )
    p.add_argument(
        "--exclude",
        metavar="REGEX",
        type=_regex_arg,
        help="keep tensors whose name matches unchanged (applied after --include)",
    )
    p.add_argument(
        "--keep",
        metavar="REGEX",
        help="keep tensors whose name matches unchanged; default for formats of 8 bits or "
        "fewer: norms, biases and embeddings (see 'precision convert --list-keep'); "
        "'none' keeps nothing",
    )
    p.add_argument(
        "--list-keep",
        action="store_true",
        help="print the default --keep pattern and exit",
    )
    p.add_argument(
        "--dry-run",
        "--list",
        dest="dry_run",
        action="store_true",
        help="print what each tensor becomes and why, write nothing",
    )
    p.add_argument(
        "--no-stats",
        action="store_true",
        help="skip the SQNR statistics (faster; no SQNR warnings)",
    )
    p.add_argument(
        "--warn-sqnr",
        metavar="DB",
        type=_db_arg,
        default=None,
        help="warn about tensors whose SQNR falls below DB decibels (default 15)",
    )
    p.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        type=_size_arg,
        help="write a directory of shards no larger than SIZE each (e.g. 5GB, 500MiB; default "
        "for a sharded input: 5GB)",
    )
    p.add_argument(
        "--layout",
        choices=("precision", "compressed-tensors", "gguf", "gguf-tensors"),
        default="precision",
        help="how OUT lays the tensors out: precision (default: this library's safetensors, "
        "every format), compressed-tensors (a Hugging Face directory that vLLM and "
        "transformers load: int8, int4, int2, float8_e4m3fn or mxfp4 Linear weights, the "
        "rest kept in float), gguf (one GGUF file llama.cpp runs, of a Llama or GPT-2 model "
        "directory: Q8_0, Q4_0, MXFP4, F32, F16, BF16) or gguf-tensors (the tensors alone "
        "in a GGUF file, under their own names); see docs/cli.md",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace OUT if it exists (even when OUT is IN)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    p = sub.add_parser(
        "report",
        help="compare two checkpoints tensor by tensor",
        description=(
            "Compare the logical values of OTHER against REF, tensor by tensor (matched by name, "
            "read one at a time): OTHER's format and size, SQNR and errors. Only tensors that "
            "differ are listed unless --all; the worst SQNR comes first."
        ),
        epilog="Example: precision report model.safetensors model-int8.safetensors --plot err.png",
    )
    p.add_argument("ref", metavar="REF", help="reference checkpoint (file or sharded directory)")
    p.add_argument(
        "other",
        metavar="OTHER",
        nargs="?",
        help="checkpoint to compare with REF (without it, a GGUF file REF is listed: its "
        "keys, and each tensor's ggml type, shape and bytes)",
    )
    p.add_argument(
        "--plot", metavar="FILE.png", help="write SQNR bars and error histograms to a PNG"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--all", action="store_true", help="list unchanged tensors too")
    p.add_argument(
        "--sort",
        choices=["sqnr", "name", "size"],
        default="sqnr",
        help="table order: worst SQNR first (default), natural name order, or largest first",
    )
    p.add_argument(
        "--top",
        metavar="N",
        type=_positive_arg,
        default=None,
        help="list only the first N rows of the table",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    sub.add_parser(
        "demo",
        help="train the demo CNN in every precision mode (see 'precision demo --help')",
        add_help=False,
    )
    return parser


# --------------------------------------------------------------------------
# entry point


def _demo(argv: list[str]) -> int:
    try:
        with deferring():
            from . import _demo

        return int(_demo.main(argv))
    except ImportError as exc:
        name = getattr(exc, "name", None) or ""
        if not name or name.startswith("precision"):
            print(f"{PROG}: error: the demo is not available ({exc})", file=sys.stderr)
        else:
            print(
                f"{PROG}: error: the demo needs the {name.split('.')[0]} package; install it "
                "with pip install 'precision[demo]'",
                file=sys.stderr,
            )
        return 1
    except SystemExit as exc:  # the demo's own --help or usage error
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def _run(args: argparse.Namespace) -> int:
    if args.command == "formats":
        from ._formats_command import _cmd_formats

        return _cmd_formats(args)
    # JAX's extension modules must not be interrupted while they initialise:
    # a SIGINT during these imports is only recorded, and acted on after them.
    if args.command == "convert":
        with deferring():
            from ._convert_command import _cmd_convert
        return _cmd_convert(args)
    with deferring():
        from ._report import _cmd_report
    return _cmd_report(args)


def main(argv: list[str] | None = None) -> int:
    """`precision._cli.main` once the command's modules are loaded (documented there)."""
    program = argv is None
    try:
        with interrupt_handler(program):
            acting_from_here()  # one recorded while the command loaded stops it here
            code = _main(argv, program)
            check_interrupt()  # one recorded where raising was unsafe, and not yet acted on
            return code
    except BrokenPipeError:
        # The reader of stdout went away (`precision convert ... --dry-run | head -1`):
        # nothing more can be shown, which is no error of the command's. Output is
        # pointed at /dev/null so the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing was written", file=sys.stderr)
        if program:
            # Everything written was discarded on the way out; end now rather
            # than tear down an interpreter whose XLA threads may be mid-step.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        return 130


def _main(argv: list[str] | None, program: bool) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":
        return _demo(argv[1:])
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        args.program = program
    except SystemExit as exc:  # --help/--version (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        return _run(args)
    except UsageError as exc:
        return _failed(2, f"{PROG} {args.command}: error: {_one_line(exc)}")
    except ModuleNotFoundError as exc:  # an optional package: the message names its extra
        return _failed(1, f"{PROG}: error: {_one_line(exc)}")
    except BrokenPipeError:
        raise  # stdout's reader is gone: `main` ends quietly
    except (OSError, ValueError, TypeError, MemoryError) as exc:
        # PrecisionError subclasses are ValueError/TypeError: a data problem here.
        return _failed(1, f"{PROG}: error: {_one_line(exc)}")


def _failed(code: int, message: str) -> int:
    """Report a failure on stderr and return `code`; a Ctrl-C recorded before the failure
    stops the command instead (130, its one line)."""
    check_interrupt()
    print(message, file=sys.stderr)
    return code


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, MemoryError):
        return f"out of memory ({text or 'MemoryError'})"
    return text or type(exc).__name__
