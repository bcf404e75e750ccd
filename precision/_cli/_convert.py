"""`precision convert`: a checkpoint converted to another format, one tensor at a time."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

import dtypes
from dtypes import Encoded

from .._checkpoint._io import encoded, write
from .._checkpoint._layout import SCALE_SUFFIX, Leaf
from .._checkpoint._reader import Reader
from ._output import _DataError, _fmt_db, _human, _UsageError

_DEFAULT = object()  # --scaling not given: the format's own default


@dataclasses.dataclass
class _Plan:
    leaf: Leaf  # as stored in the input
    out: Leaf  # as written to the output
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


def _plan(reader: Reader, args: argparse.Namespace) -> list[_Plan]:
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
        out = Leaf(
            leaf.name,
            leaf.path,
            "tensor",
            np.dtype(np.float32),
            leaf.shape,
            out_fmt,
            scaling,
            None if scaling is None else leaf.name + SCALE_SUFFIX,
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
    def _pieces(out: Leaf) -> list[slice | None]:
        """Row slices of the error statistics (None: the whole tensor at once)."""
        shape, scale_shape = out.shape, out.scale_shape
        if len(shape) < 2 or (scale_shape is not None and scale_shape[0] not in (1, shape[0])):
            return [None]  # groups span the first axis, or nothing to slice
        step = max(1, _CHUNK // max(int(np.prod(shape[1:], dtype=np.int64)), 1))
        return [slice(r, min(r + step, shape[0])) for r in range(0, shape[0], step)] or [None]

    def _specs(self, out: Leaf, piece: slice | None):
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

    def _last(self, out: Leaf) -> int | None:
        return (out.shape[-1] if out.shape else None) if out.format.packed else None

    def prepare(self, out: Leaf) -> None:
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

    def encode(self, out: Leaf, x, key) -> tuple[Any, Any]:
        return self._compiled[("encode", out.shape)](x, key)

    def energy(self, out: Leaf, x: np.ndarray, data, scale) -> tuple[bool, float, float]:
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


def _logical(leaf: Leaf, data: np.ndarray, scale: np.ndarray | None):
    """float32 logical values of an input leaf, as a jax array."""
    import jax
    import jax.numpy as jnp

    if leaf.kind == "array":
        return jax.device_put(data if data.dtype == np.float32 else data.astype(np.float32))
    if leaf.format == dtypes.float32 and scale is None:
        return jax.device_put(data)  # aliases the aligned read buffer: no copy
    return encoded(leaf, data, scale).decode(jnp.float32)


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


def _rows(out: Leaf, n: int) -> Leaf:
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
    with Reader(src) as reader:
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
            size_out = write(dst, [p.out for p in plans], produce(), overwrite=True)
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
