"""The `precision` command line: formats, convert, report, demo.

Exit codes: 0 success, 2 usage error (bad flags, unknown format, bad regex),
1 data error (unreadable or corrupted checkpoint, unwritable destination,
non-finite values in a scaled conversion). Errors are one line on stderr,
never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

import dtypes
from dtypes import Encoded

from . import _io
from ._errors import PrecisionError

__all__ = ["main"]

PROG = "precision"
_DEFAULT = object()  # --scaling not given: the format's own default


class _DataError(Exception):
    """A problem with the data (exit status 1), reported as one line."""


class _UsageError(Exception):
    """Flags that cannot go together (exit status 2), reported as one line."""


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
# helpers


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def _table(rows: list[list[str]], header: list[str], right: set[int]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _fmt_db(x: float) -> str:
    return "inf" if x == math.inf else ("-inf" if x == -math.inf else f"{x:.2f}")


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
# convert


@dataclasses.dataclass
class _Plan:
    leaf: _io.Leaf  # as stored in the input
    out: _io.Leaf  # as written to the output
    reason: str | None  # why it is copied unchanged, or None when converted


def _target_scaling(args: argparse.Namespace) -> dtypes.Scaling | None:
    fmt: dtypes.Format = args.to
    scaling = fmt.default_scaling() if args.scaling is _DEFAULT else args.scaling
    if fmt.kind == "int" and scaling is None:
        raise _UsageError(
            f"{fmt.name} always needs a scaling; use --scaling per-tensor, per-axis:AXIS or "
            "per-block:SIZE"
        )
    if scaling is not None and fmt.kind == "float":
        # Ask the format itself whether it takes this scaling at all (float
        # formats with float32's exponent range refuse every scaling).
        probe = np.ones((1,) * (abs(getattr(scaling, "axis", 0)) + 1), np.float32)
        try:
            fmt.encode(probe, scaling=scaling)
        except ValueError as exc:
            raise _UsageError(f"--scaling {scaling}: {exc}") from None
    return scaling


def _plan(reader: _io.Reader, args: argparse.Namespace) -> list[_Plan]:
    fmt: dtypes.Format = args.to
    scaling = _target_scaling(args)
    plans = []
    for leaf in reader.leaves:
        reason = None
        if args.include is not None and not args.include.search(leaf.name):
            reason = "not included"
        elif args.exclude is not None and args.exclude.search(leaf.name):
            reason = "excluded"
        elif leaf.kind == "array" and leaf.dtype.name not in ("float32", "float16", "bfloat16"):
            reason = f"{leaf.dtype.name} array"
        elif leaf.kind == "tensor" and leaf.dtype != np.float32:
            reason = f"{leaf.dtype.name} tensor"
        elif scaling is not None and leaf.shape and not _fits(scaling, leaf.shape):
            reason = f"{scaling} does not fit shape {list(leaf.shape)}"
        elif scaling is not None and not leaf.shape and not isinstance(scaling, dtypes.PerTensor):
            reason = f"{scaling} does not fit a scalar"
        if reason is not None:
            plans.append(_Plan(leaf, leaf, reason))
            continue
        full = fmt.is_full_precision and scaling is None
        out_fmt = dtypes.float32 if full else fmt
        out = _io.Leaf(
            leaf.name,
            leaf.path,
            "tensor",
            np.dtype(np.float32),
            leaf.shape,
            out_fmt,
            scaling,
            None if scaling is None else leaf.name + _io.SCALE_SUFFIX,
        )
        plans.append(_Plan(leaf, out, None))
    return plans


def _fits(scaling: dtypes.Scaling, shape: tuple[int, ...]) -> bool:
    try:
        scaling.validate(shape)
    except ValueError:
        return False
    return True


_CHUNK = 1 << 18  # values per slice of the error statistics (1 MiB of float32)

# Compiled programs by (format, scaling, rounding), then by shape: a process
# that converts several checkpoints (the tests, a notebook) compiles once.
_COMPILED: dict[tuple, dict[tuple, Any]] = {}


class _Converter:
    """The library's own encode of one tensor at a time, and its error energy.

    Memory is what this is built around. XLA fuses an encode into one pass
    from the float32 input to the output codes (plus a reduction for the
    scales), so the only full-size buffers are the input and the output; the
    error statistics are computed apart, in slices of `_CHUNK` values (fused
    into the encode they made XLA materialize two float32 copies of the
    tensor). Everything is compiled for a tensor's shape *before* the tensor
    is read (`prepare`), so the compiler's own transient memory never adds
    to a tensor's.
    """

    def __init__(self, fmt: dtypes.Format, scaling: dtypes.Scaling | None, rounding: str):
        import jax
        import jax.numpy as jnp

        self.fmt, self.scaling = fmt, scaling

        def encode(x, key):
            enc = fmt.encode(x, scaling=scaling, rounding=rounding, key=key)
            return enc.data, enc.scale

        def decode(data, scale, last):
            return Encoded(data, scale, fmt, scaling, last).decode(jnp.float32)

        self._encode = jax.jit(encode)
        self._decode = jax.jit(decode, static_argnums=2)
        self._key_spec = (
            jax.eval_shape(lambda: jax.random.key(0)) if rounding == "stochastic" else None
        )
        self._compiled = _COMPILED.setdefault((fmt, scaling, rounding), {})

    @staticmethod
    def _pieces(out: _io.Leaf) -> list[slice | None]:
        """Row slices of the error statistics (None: the whole tensor at once)."""
        shape, scale_shape = out.shape, out.scale_shape
        if len(shape) < 2 or (scale_shape is not None and scale_shape[0] not in (1, shape[0])):
            return [None]  # groups span the first axis, or nothing to slice
        step = max(1, _CHUNK // max(int(np.prod(shape[1:], dtype=np.int64)), 1))
        return [slice(r, min(r + step, shape[0])) for r in range(0, shape[0], step)] or [None]

    def _specs(self, out: _io.Leaf, piece: slice | None):
        import jax

        data_shape, scale_shape = out.data_shape, out.scale_shape
        if piece is not None:
            n = piece.stop - piece.start
            data_shape = (n, *data_shape[1:])
            if scale_shape is not None and scale_shape[0] != 1:
                scale_shape = (n, *scale_shape[1:])
        data = jax.ShapeDtypeStruct(data_shape, out.container)
        scale = None if scale_shape is None else jax.ShapeDtypeStruct(scale_shape, np.float32)
        return data, scale

    def _last(self, out: _io.Leaf) -> int | None:
        return (out.shape[-1] if out.shape else None) if out.format.packed else None

    def prepare(self, out: _io.Leaf) -> None:
        """Compile the encode and the sliced decodes for `out`'s shape."""
        import jax

        key = ("encode", out.shape)
        if key not in self._compiled:
            x = jax.ShapeDtypeStruct(out.shape, np.float32)
            self._compiled[key] = self._encode.lower(x, self._key_spec).compile()
        for piece in self._pieces(out):
            data, scale = self._specs(out, piece)
            key = ("decode", out.shape, data.shape, None if scale is None else scale.shape)
            if key not in self._compiled:
                lowered = self._decode.lower(data, scale, self._last(out))
                self._compiled[key] = lowered.compile()

    def encode(self, out: _io.Leaf, x, key) -> tuple[Any, Any]:
        return self._compiled[("encode", out.shape)](x, key)

    def energy(self, out: _io.Leaf, x: np.ndarray, data, scale) -> tuple[bool, float, float]:
        """(all finite, Σ x², Σ (x - decoded)²) over the finite values of `x`, in float64."""
        finite, signal, noise = True, 0.0, 0.0
        for piece in self._pieces(out):
            spec_d, spec_s = self._specs(out, piece)
            shapes = (spec_d.shape, None if spec_s is None else spec_s.shape)
            decode = self._compiled[("decode", out.shape, *shapes)]
            d, s, xc = data, scale, x
            if piece is not None:
                d, xc = data[piece], x[piece]
                s = scale if scale is None or scale.shape[0] == 1 else scale[piece]
            y = np.asarray(decode(d, s), np.float64)
            xc = np.asarray(xc, np.float64)
            ok = np.isfinite(xc)
            finite = finite and bool(ok.all())
            xc = np.where(ok, xc, 0.0)
            diff = np.where(ok, xc - y, 0.0)
            signal += float(np.dot(xc.ravel(), xc.ravel()))
            noise += float(np.dot(diff.ravel(), diff.ravel()))
        return finite, signal, noise


def _release_memory() -> None:
    """Hand freed heap memory back to the system (glibc keeps it otherwise).

    Between tensors the process holds nothing large, but glibc's allocator
    keeps the pages that XLA's compiler and the statistics freed; without
    this the resident size creeps up by tens of MiB per tensor.
    """
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)  # glibc only
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _logical(leaf: _io.Leaf, data: np.ndarray, scale: np.ndarray | None):
    """float32 logical values of an input leaf, as a jax array."""
    import jax
    import jax.numpy as jnp

    if leaf.kind == "array":
        return jax.device_put(data if data.dtype == np.float32 else data.astype(np.float32))
    if leaf.format == dtypes.float32 and scale is None:
        return jax.device_put(data)  # aliases the aligned read buffer: no copy
    return _io.encoded(leaf, data, scale).decode(jnp.float32)


_STREAM_BYTES = 16 << 20  # input bytes per row block of a streamed conversion

# Input containers whose float32 value is their logical value (an exact cast).
_RAW_FLOATS = {np.dtype(t) for t in ("float32", "float16", "bfloat16")} | {
    np.dtype(dtypes.float8_e4m3fn.container),
    np.dtype(dtypes.float8_e5m2.container),
}


def _streamable(plan: _Plan, rounding: str) -> bool:
    """Whether a tensor can be converted in row blocks, giving the same bytes.

    True when every value's encoding depends only on its own row: unscaled
    formats, one scale per row (per-axis 0) or blocks along the last axis,
    and deterministic rounding (stochastic rounding draws its bits by element
    index in the whole tensor). The input must be raw floats, read as they
    are. Such tensors never need to be whole in memory.
    """
    leaf, out = plan.leaf, plan.out
    if len(out.shape) < 2 or rounding == "stochastic":
        return False
    if leaf.scale is not None or leaf.data_dtype not in _RAW_FLOATS:
        return False
    if leaf.kind == "tensor" and leaf.format.native_dtype != leaf.data_dtype:
        return False
    scaling, ndim = out.scaling, len(out.shape)
    return (
        scaling is None
        or (isinstance(scaling, dtypes.PerAxis) and scaling.axis % ndim == 0)
        or (isinstance(scaling, dtypes.PerBlock) and scaling.axis % ndim == ndim - 1)
    )


def _rows(out: _io.Leaf, n: int) -> _io.Leaf:
    """`out` cut to its first `n` rows (what one row block encodes as)."""
    return dataclasses.replace(out, shape=(n, *out.shape[1:]))


def _cmd_convert(args: argparse.Namespace) -> int:
    import jax

    src, dst = args.input, args.output
    _target_scaling(args)
    if os.path.exists(dst) and os.path.exists(src) and os.path.samefile(src, dst):
        if not args.overwrite:
            raise _DataError(
                f"refusing to convert {src} onto itself; pass --overwrite to replace it (the "
                "original stays intact until the converted file is complete)"
            )
    elif os.path.lexists(dst) and not args.overwrite:
        raise _DataError(f"{dst} already exists; pass --overwrite to replace it")
    fmt: dtypes.Format = args.to
    with _io.Reader(src) as reader:
        plans = _plan(reader, args)
        scaling = next((p.out.scaling for p in plans if p.reason is None), None)
        converter = _Converter(fmt, scaling, args.rounding)
        key = jax.random.key(args.seed) if args.rounding == "stochastic" else None
        worst: list[tuple[float, str]] = []
        total_in = sum(e.nbytes for e in reader.entries.values())
        progress = _progress(total_in, args.quiet)

        def not_finite(plan: _Plan) -> _DataError:
            return _DataError(
                f"tensor {plan.leaf.name!r} holds NaN or inf, which a scaled "
                f"{fmt.name} encoding cannot hold; exclude it (--exclude) or choose an "
                "unscaled float format"
            )

        def stream(plan: _Plan, scales: list[np.ndarray]) -> Iterator[np.ndarray]:
            """Encoded row blocks of one tensor, read and converted block by block."""
            out = plan.out
            row_bytes = int(np.prod(out.shape[1:], dtype=np.int64)) * plan.leaf.data_dtype.itemsize
            step = max(1, _STREAM_BYTES // max(row_bytes, 1))
            for n in {min(step, out.shape[0] - r) for r in range(0, out.shape[0], step)}:
                converter.prepare(_rows(out, n))
            _release_memory()
            finite, signal, noise = True, 0.0, 0.0
            for block in reader.iter_rows(plan.leaf.name, step):
                part = _rows(out, block.shape[0])
                x = jax.device_put(block if block.dtype == np.float32 else block.astype(np.float32))
                data, scale = converter.encode(part, x, None)
                ok, sig, noi = converter.energy(part, np.asarray(x), data, scale)
                del x, block
                gc.collect()  # see below: frees the aliased input block now
                if out.scaling is not None and not ok:
                    raise not_finite(plan)
                finite, signal, noise = finite and ok, signal + sig, noise + noi
                if scale is not None:
                    scales.append(np.asarray(scale))
                yield np.asarray(data).view(out.data_dtype)
                progress.update(part.shape[0] * row_bytes)
            worst.append((_sqnr(signal, noise), plan.leaf.name))

        def produce() -> Iterator[tuple[str, Any]]:
            for i, plan in enumerate(plans):
                progress.set_postfix_str(plan.leaf.name, refresh=False)
                if plan.reason is None and _streamable(plan, args.rounding):
                    scales: list[np.ndarray] = []
                    yield plan.out.name, stream(plan, scales)
                    if plan.out.scale is not None:
                        yield plan.out.scale, np.concatenate(scales, axis=0)
                    _release_memory()
                    continue
                if plan.reason is None:
                    converter.prepare(plan.out)  # compile before the tensor is in memory
                    _release_memory()
                data, scale = reader.read_leaf(plan.leaf)
                nbytes = data.nbytes + (0 if scale is None else scale.nbytes)
                if plan.reason is not None:
                    yield plan.leaf.name, data
                    if scale is not None:
                        yield plan.leaf.scale, scale
                    progress.update(nbytes)
                    continue
                x = _logical(plan.leaf, data, scale)
                k = None if key is None else jax.random.fold_in(key, i)
                out_data, out_scale = converter.encode(plan.out, x, k)
                finite, signal, noise = converter.energy(
                    plan.out, np.asarray(x), out_data, out_scale
                )
                del x, data, scale
                # A jax array aliasing a numpy buffer sits in a reference
                # cycle: collect it now, or the input tensor outlives its turn.
                gc.collect()
                if plan.out.scaling is not None and not bool(finite):
                    raise not_finite(plan)
                worst.append((_sqnr(float(signal), float(noise)), plan.leaf.name))
                arr = np.asarray(out_data)
                yield plan.out.name, arr.view(plan.out.data_dtype)
                del arr, out_data
                if out_scale is not None:
                    yield plan.out.scale, np.asarray(out_scale)
                del out_scale
                _release_memory()
                progress.update(nbytes)

        try:
            size_out = _io.write(dst, [p.out for p in plans], produce(), overwrite=True)
        finally:
            progress.close()
    converted = [p for p in plans if p.reason is None]
    skipped = [p for p in plans if p.reason is not None]
    where = f" ({scaling})" if scaling is not None else ""
    print(
        f"converted {len(converted)} tensor(s) to {fmt.name}{where}, kept {len(skipped)} "
        f"unchanged; wrote {dst}"
    )
    reasons: dict[str, int] = {}
    for p in skipped:
        reasons[p.reason] = reasons.get(p.reason, 0) + 1
    for reason, count in sorted(reasons.items()):
        print(f"  kept {count}: {reason}")
    ratio = size_out / os.path.getsize(src) if os.path.getsize(src) else 1.0
    print(f"bytes: {_human(os.path.getsize(src))} -> {_human(size_out)} ({ratio:.1%})")
    if worst:
        db, name = min(worst)
        print(f"worst SQNR: {_fmt_db(db)} dB ({name})")
    return 0


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10 * math.log10(signal / noise)


def _progress(total: int, quiet: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=True if quiet else None,  # None: shown only on a terminal
        desc="converting",
        leave=False,
    )


# --------------------------------------------------------------------------
# report


def _error_report(ref, approx):
    try:
        from .testing import error_report
    except ImportError:  # pragma: no cover - before the testing kit exports it
        from .testing._metrics import error_report
    # No format: the table needs no ULP histogram, which is the costly part.
    return error_report(ref, approx)


def _report_row(name: str, leaf: _io.Leaf, nbytes: int, ref, other) -> dict[str, Any]:
    rep = _error_report(ref, other)
    fmt_name = leaf.format.name if leaf.format is not None else leaf.dtype.name
    return {
        "name": name,
        "format": fmt_name,
        "scaling": None if leaf.scaling is None else str(leaf.scaling),
        "bytes": nbytes,
        "max_abs_error": float(rep.max_abs_error),
        "mean_abs_error": float(rep.mean_abs_error),
        "max_rel_error": float(rep.max_rel_error),
        "mean_rel_error": float(rep.mean_rel_error),
        "sqnr_db": float(rep.sqnr_db),
    }


def _values(reader: _io.Reader, leaf: _io.Leaf):
    import jax.numpy as jnp

    data, scale = reader.read_leaf(leaf)
    if leaf.kind == "array":
        return jnp.asarray(data.astype(np.float32))
    return _io.encoded(leaf, data, scale).decode(jnp.float32)


def _cmd_report(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    errors: dict[str, np.ndarray] = {}
    problems: list[str] = []
    with _io.Reader(args.ref) as ref, _io.Reader(args.other) as other:
        ref_leaves = {leaf.name: leaf for leaf in ref.leaves}
        other_leaves = {leaf.name: leaf for leaf in other.leaves}
        only_ref = [n for n in ref_leaves if n not in other_leaves]
        only_other = [n for n in other_leaves if n not in ref_leaves]
        for name, oleaf in other_leaves.items():
            rleaf = ref_leaves.get(name)
            if rleaf is None:
                continue
            if rleaf.shape != oleaf.shape:
                problems.append(
                    f"{name!r} has shape {list(rleaf.shape)} in REF but {list(oleaf.shape)} "
                    "in OTHER"
                )
                continue
            if not (_floating(rleaf) and _floating(oleaf)):
                continue
            r, o = _values(ref, rleaf), _values(other, oleaf)
            nbytes = sum(other.entries[n].nbytes for n, _, _ in oleaf.arrays())
            rows.append(_report_row(name, oleaf, nbytes, r, o))
            if args.plot:
                errors[name] = _rel_errors(np.asarray(r), np.asarray(o))
    for name in only_ref:
        print(f"{PROG}: note: {name!r} is only in REF", file=sys.stderr)
    for name in only_other:
        print(f"{PROG}: note: {name!r} is only in OTHER", file=sys.stderr)
    if problems:
        raise _DataError("; ".join(problems))
    if not rows:
        raise _DataError(f"{args.ref} and {args.other} have no floating tensor in common")
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        table = [
            [
                r["name"],
                r["format"],
                str(r["bytes"]),
                f"{r['max_rel_error']:.3e}",
                f"{r['mean_rel_error']:.3e}",
                _fmt_db(r["sqnr_db"]),
            ]
            for r in rows
        ]
        header = ["tensor", "format", "bytes", "max rel err", "mean rel err", "SQNR dB"]
        print(_table(table, header, right={2, 3, 4, 5}))
        total = sum(r["bytes"] for r in rows)
        worst = min(rows, key=lambda r: r["sqnr_db"])
        print(
            f"\n{len(rows)} tensor(s), {_human(total)}; worst SQNR "
            f"{_fmt_db(worst['sqnr_db'])} dB ({worst['name']})"
        )
    if args.plot:
        _plot(errors, rows, args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


def _floating(leaf: _io.Leaf) -> bool:
    return leaf.kind == "tensor" or leaf.dtype.kind == "f" or leaf.dtype.name == "bfloat16"


def _rel_errors(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Relative errors |other - ref| / |ref| of the finite, nonzero reference values."""
    ref = ref.astype(np.float64).ravel()
    other = other.astype(np.float64).ravel()
    ok = np.isfinite(ref) & (ref != 0) & np.isfinite(other)
    return np.abs(other[ok] - ref[ok]) / np.abs(ref[ok])


def _plot(errors: dict[str, np.ndarray], rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    shown = sorted(rows, key=lambda r: r["sqnr_db"])[:10]
    finite = [e[e > 0] for e in errors.values() if np.any(e > 0)]
    lo = min((float(e.min()) for e in finite), default=1e-8)
    hi = max((float(e.max()) for e in finite), default=1.0)
    bins = np.logspace(np.log10(lo), np.log10(hi) + 1e-9, 60)
    for r in shown:
        e = errors[r["name"]]
        e = e[e > 0]
        if e.size:
            ax.hist(e, bins=bins, histtype="step", label=f"{r['name']} ({r['format']})")
    ax.set_xscale("log")
    ax.set_xlabel("relative error |other - ref| / |ref|")
    ax.set_ylabel("values")
    title = "relative error per tensor"
    if len(rows) > len(shown):
        title += f" ({len(shown)} worst of {len(rows)})"
    ax.set_title(title)
    if shown:
        ax.legend(fontsize="small")
    names = [r["name"] for r in rows]
    top = max([r["sqnr_db"] for r in rows if math.isfinite(r["sqnr_db"])] + [1.0]) * 1.1
    sqnr = [min(max(r["sqnr_db"], 0.0), top) for r in rows]
    bars = bx.barh(range(len(rows)), sqnr)
    for bar, r in zip(bars, rows, strict=True):
        if not math.isfinite(r["sqnr_db"]):
            bar.set_hatch("//")
            bx.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " exact", va="center")
    bx.set_yticks(range(len(rows)), names, fontsize="small")
    bx.invert_yaxis()
    bx.set_xlabel("SQNR (dB)")
    bx.set_title("signal-to-quantization-noise ratio")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


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
