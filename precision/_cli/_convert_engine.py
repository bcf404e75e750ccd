"""The conversion of `precision convert`: each planned tensor, streamed in blocks.

The mode of each tensor is chosen in `_convert_modes` (its docstring lists
them); this module runs them: `_Engine` holds the compiled encodes with
their statistics, cached by input shape, `_Blocks` reads a tensor in
blocks, `_Converter` yields each tensor's output arrays in order. It never
holds more than one tensor's input, and usually only one block of it.

Every path gives the bytes the library's own `Format.encode` gives for the
whole tensor (tests/precision/test_cli.py checks each). The statistics (SQNR
per tensor) are computed in the same compiled program as the encode; in
float32 sums of values divided by the block's absmax, accumulated in
float64, so neither overflows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

import dtypes

from .._checkpoint import _q4_0
from .._checkpoint._io import encoded
from .._checkpoint._layout import Leaf
from .._checkpoint._reader import Reader
from . import _convert_modes as _modes
from ._convert_modes import _Plan, _raw
from ._convert_stats import (
    _cast_part,
    _energy,
    _in_parts,
    _int_part,
    _int_rows_part,
    _Part,
    _scratch,
    _SignalNoise,
)
from ._interrupts import check_interrupt, import_jax
from ._stored_blocks import _Blocks

if TYPE_CHECKING:
    import jax


class _Engine:
    """Compiled encodes of one (format, scaling, rounding), cached by input shape and dtype."""

    def __init__(
        self, fmt: dtypes.Format, scaling: dtypes.Scaling | None, rounding: str, stats: bool
    ):
        self.fmt, self.scaling, self.rounding, self.stats = fmt, scaling, rounding, stats
        self._cache: dict[tuple[Any, ...], Any] = {}

    def _jit(self, key: tuple[Any, ...], build: Callable[[], Callable[..., Any]]) -> Any:
        fn = self._cache.get(key)
        if fn is None:
            import jax

            fn = self._cache[key] = jax.jit(build())
        return fn

    def block(
        self,
        x: np.ndarray,
        scaling: dtypes.Scaling | None,
        absmax: Any = None,
        twolevel: bool = False,
    ) -> tuple[tuple[np.ndarray | None, ...], bool, Any]:
        """Encode one block: ((data, scale, tensor scale, zero points), all finite, stats or
        None), synchronously; absent arrays are None."""
        import jax.numpy as jnp

        fmt, rounding, stats = self.fmt, self.rounding, self.stats
        appended = absmax is not None
        slab = appended and (np.ndim(absmax) > 0 or twolevel)
        key = ("block", x.shape, x.dtype.name, scaling, appended, slab, twolevel)

        def build() -> Callable[..., Any]:
            def f(raw: jax.Array, top: jax.Array) -> tuple[tuple[Any, ...], jax.Array, Any]:
                xf = raw.astype(jnp.float32)
                finite = jnp.all(jnp.isfinite(xf))
                if slab:  # one more row: every group's absmax, or one group the tensor's
                    rows = xf.shape[0]
                    if twolevel:
                        top = jnp.zeros((1, xf.shape[1]), jnp.float32).at[0, 0].set(top)
                    enc = fmt.encode(jnp.concatenate([xf, top]), scaling=scaling, rounding=rounding)
                    data, scale = enc.data[:rows], enc.scale
                    if twolevel:
                        assert scale is not None  # two-level encodings are scaled
                        scale = scale[:rows]
                    y = enc.decode(jnp.float32)[:rows] if stats else None
                    flat = xf
                elif appended:
                    flat = xf.reshape(-1)
                    n = flat.shape[0]
                    enc = fmt.encode(
                        jnp.concatenate([flat, top.reshape(1)]), scaling=scaling, rounding=rounding
                    )
                    data = enc.data[: fmt.data_shape((n,))[0]]
                    y = enc.decode(jnp.float32)[:n] if stats else None
                    scale = enc.scale
                else:
                    enc = fmt.encode(xf, scaling=scaling, rounding=rounding)
                    data, scale = enc.data, enc.scale
                    y = enc.decode(jnp.float32).reshape(xf.shape) if stats else None
                    flat = xf
                energy = _energy(flat, y) if y is not None else None  # y: with stats
                return (data, scale, enc.tensor_scale, enc.zero_point), finite, energy

            return f

        fn = self._jit(key, build)
        top = np.float32(0) if absmax is None else np.asarray(absmax, np.float32)
        parts, finite, energy = fn(x, top)
        # np.asarray waits: the input buffer may be reused after this
        arrays = tuple(None if a is None else np.asarray(a) for a in parts)
        return arrays, bool(finite), energy

    def whole(self, x: Any, key: Any, scaling: dtypes.Scaling | None) -> tuple[Any, ...]:
        """Encode a whole tensor (raw floats, cast inside the program): (data, scale,
        tensor scale, zero points), absent arrays None."""
        import jax.numpy as jnp

        fmt, rounding = self.fmt, self.rounding
        ck = ("whole", x.shape, str(x.dtype), key is None, scaling)

        def build() -> Callable[..., Any]:
            def f(raw: jax.Array, k: jax.Array | None) -> tuple[jax.Array | None, ...]:
                enc = fmt.encode(raw.astype(jnp.float32), scaling=scaling, rounding=rounding, key=k)
                return enc.data, enc.scale, enc.tensor_scale, enc.zero_point

            return f

        parts: tuple[Any, ...] = self._jit(ck, build)(x, key)
        return parts

    def slice_energy(self, out: Leaf, x: Any, parts: tuple[Any, ...]) -> tuple[bool, _SignalNoise]:
        """Statistics and finiteness of a whole-tensor encode, taken in row slices."""
        import jax
        import jax.numpy as jnp

        fmt, scaling = out.format, out.scaling
        assert fmt is not None
        data, scale, tensor_scale, zero_point = parts
        shape, scale_shape = out.shape, out.scale_shape
        last = (shape[-1] if shape else None) if fmt.packed else None
        stats = _SignalNoise()
        finite = True
        rows = shape[0] if len(shape) >= 2 else 0
        sliceable = rows > 1 and (scale_shape is None or scale_shape[0] in (1, rows))
        row_values = math.prod(shape[1:]) if shape else 1
        step = max(1, _modes._BLOCK // max(row_values, 1)) if sliceable else max(rows, 1)
        pieces: list[slice | None] = [None]
        if sliceable:
            pieces = [slice(r, min(r + step, rows)) for r in range(0, rows, step)]
        for piece in pieces:
            if piece is None:
                d, s, z, xc, sub = data, scale, zero_point, x, shape
            else:
                n = piece.stop - piece.start
                d, xc = data[piece], x[piece]
                s = scale if scale is None or scale.shape[0] == 1 else scale[piece]
                z = zero_point
                if z is not None and z.shape[0] != 1:
                    z = z[piece]
                sub = (n, *shape[1:])
            ck = ("energy", sub, str(xc.dtype), None if s is None else s.shape)

            def build(sub: tuple[int, ...] = sub) -> Callable[..., Any]:
                def f(
                    raw: jax.Array, dd: jax.Array, ss: Any, ts: Any, zz: Any
                ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
                    xf = raw.astype(jnp.float32)
                    enc = dtypes.Encoded(dd, ss, fmt, scaling, last, tensor_scale=ts, zero_point=zz)
                    y = enc.decode(jnp.float32)
                    return jnp.all(jnp.isfinite(xf)), _energy(xf, y.reshape(xf.shape))

                return f

            ok, energy = self._jit(ck, build)(xc, d, s, tensor_scale, z)
            finite = finite and bool(ok)
            stats.add(*jax.device_get(energy))
        return finite, stats


# --------------------------------------------------------------------------
# one tensor


class _Converter:
    """Produces the output arrays of every plan, one tensor (and block) at a time."""

    def __init__(self, engine: _Engine, rounding: str, seed: int, progress: Any):
        self.engine, self.rounding, self.seed, self.progress = engine, rounding, seed, progress
        self.sqnr: dict[str, float] = {}
        self._key = None
        self.refused: str | None = None  # the tensor refused for NaN or inf, if one was

    def _not_finite(self, plan: _Plan) -> dtypes.NonFiniteError:
        fmt = plan.out.format
        assert fmt is not None
        self.refused = plan.leaf.name
        if plan.out.scaling is None:
            return dtypes.NonFiniteError(
                f"tensor {plan.leaf.name!r} holds NaN or inf, which {fmt.name} (neither inf nor "
                "NaN) cannot hold: it would become ±max or 0 silently; keep it (--exclude) or "
                "choose a format with inf and NaN"
            )
        return dtypes.NonFiniteError(
            f"tensor {plan.leaf.name!r} holds NaN or inf, which a scaled {fmt.name} encoding "
            "cannot hold; keep it (--exclude) or choose an unscaled float format"
        )

    def arrays(self, plans: list[_Plan]) -> Iterator[tuple[str, Any]]:
        for i, plan in enumerate(plans):
            check_interrupt()
            self.progress.set_postfix_str(plan.leaf.name, refresh=False)
            if plan.reason is not None:
                for name, _, _ in plan.leaf.arrays():
                    yield name, self._copy(plan.reader, name)
            elif plan.mode == "whole":
                yield from self._whole(plan, i)
            elif plan.mode == "cast":
                yield plan.out.name, self._cast(plan)
            elif plan.mode == "q4_0":
                yield from self._q4_0(plan)
            else:
                # per-group arrays, filled while the codes are written
                extras: dict[str, list[np.ndarray]] = {r: [] for r in plan.out.roles()[1:]}
                yield plan.out.name, self._streamed(plan, extras)
                for (name, dtype, shape), role in zip(
                    plan.out.arrays()[1:], plan.out.roles()[1:], strict=True
                ):
                    array = np.concatenate([a.reshape(-1) for a in extras[role]])
                    yield name, array.reshape(shape).view(dtype)

    def _copy(self, reader: Reader, name: str) -> Iterator[np.ndarray]:
        """The stored bytes, checked against their encoding's invariants as `load` would:
        a copy never writes what `load` refuses."""
        shape = tuple(reader.entries[name].shape)
        row = math.prod(shape[1:]) if len(shape) > 1 else 1
        values = max(row, (_modes._BLOCK * 4) // row * row)  # whole rows per block
        total, done = math.prod(shape), 0
        for block in _Blocks(reader, name).blocks(values):
            check_interrupt()
            done += block.size
            if len(shape) > 1:
                reader.check_values(name, block.reshape(-1, *shape[1:]))
            else:
                reader.check_values(name, block.reshape(shape), whole_rows=done == total)
            yield block
            self.progress.update(block.nbytes)

    def _q4_0(self, plan: _Plan) -> Iterator[tuple[str, Any]]:
        """ggml's Q4_0 rounding of one tensor, read in blocks of whole rows (of 32 rows
        where Q4_0's blocks run down its columns), as a uint4 encoding with zero points
        7 or 8 (`_checkpoint._q4_0`), with its statistics."""
        out, leaf = plan.out, plan.leaf
        assert isinstance(out.scaling, dtypes.PerBlock)
        shape = out.shape
        axis = out.scaling.axis % len(shape)
        row = math.prod(shape[1:])
        step = 32 if axis == 0 else 1
        rows = max(step, _modes._BLOCK // max(row, 1) // step * step)
        if _raw(leaf, plan.reader.foreign):
            chunks: Iterator[np.ndarray] = _Blocks(plan.reader, leaf.name).blocks(rows * row)
        else:  # stored encoded: decoded (one tensor), then taken in the same blocks
            whole = encoded(leaf, plan.reader.read_leaf(leaf)).decode(np.float32)
            flat = np.asarray(whole, np.float32).reshape(-1)
            chunks = (flat[i : i + rows * row] for i in range(0, flat.size, rows * row))
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        stats = _SignalNoise()
        for chunk in chunks:
            check_interrupt()
            x = np.asarray(chunk, np.float32).reshape(-1, *shape[1:])
            if not np.all(np.isfinite(x)):
                raise self._not_finite(plan)
            codes, stored, zero = _q4_0.grid_codes(x, axis)
            if self.engine.stats:  # in float64, over the chunk's absmax (as `_energy`)
                step_of = np.repeat(stored.astype(np.float64), 32, axis=axis)
                back = step_of * (codes - np.repeat(zero, 32, axis=axis))
                m = float(np.max(np.abs(x), initial=0.0)) or 1.0
                xs = x.astype(np.float64) / m
                stats.add(m, np.sum(np.square(xs)), np.sum(np.square(xs - back / m)))
            parts.append((codes.astype(np.uint8), stored, zero.astype(np.uint8)))
            self.progress.update(leaf.data_dtype.itemsize * x.size)  # (bytes as stored)
        if self.engine.stats:
            self.sqnr[leaf.name] = stats.sqnr
        codes, stored, zero = (np.concatenate(p, axis=0) for p in zip(*parts, strict=True))
        del parts
        scaling = dtypes.PerBlock(32, axis, scale_format="float16")
        enc = dtypes.from_codes(codes, stored, "uint4", scaling, zero_point=zero)
        for (name, dtype, ashape), role in zip(out.arrays(), out.roles(), strict=True):
            yield name, np.asarray(getattr(enc, role)).reshape(ashape).view(dtype)

    def _cast(self, plan: _Plan) -> Iterator[np.ndarray]:
        """Blocks cast by numpy into the format's ml_dtypes type, with their statistics."""
        assert plan.out.format is not None
        target = np.dtype(plan.out.format.container)
        blocks = _Blocks(plan.reader, plan.leaf.name).blocks(_modes._BLOCK)
        return self._numpy_blocks(plan, blocks, target, _cast_part, scratches=1)

    def _numpy_blocks(
        self,
        plan: _Plan,
        blocks: Iterator[np.ndarray],
        target: np.dtype[Any],
        part: _Part,
        scratches: int,
        unit: int = 1,
        redo: Callable[[np.ndarray], tuple[np.ndarray, list[Any]] | None] | None = None,
    ) -> Iterator[np.ndarray]:
        """Each block as float32 `x` into a `target` array `y` (`x` itself for float32) by
        `part(x, y, scratch, stats, p)` over parts `p` of whole `unit`s on worker threads
        (`scratch`: that many float32 buffers like `x`, slot 0 the statistics'); their
        energies added up, the tensor's SQNR kept. `redo(x)`, asked after the parts,
        may instead give the block's output and energies (the compiled encode's)."""
        stats = _SignalNoise()
        for block in blocks:
            check_interrupt()
            x = block if block.dtype == np.float32 else block.astype(np.float32)
            y = x if target == np.float32 else np.empty(x.shape, target)
            scratch = tuple(_scratch(x.size, slot) for slot in range(scratches))
            run = functools.partial(part, x, y, scratch, self.engine.stats)
            energies = [(1.0, *e) for e in _in_parts(run, x.size, unit) if e is not None]
            redone = redo(x) if redo is not None else None
            if redone is not None:
                y, energies = redone
            for energy in energies:
                stats.add(*energy)
            yield y.view(plan.out.data_dtype)
            self.progress.update(block.nbytes)
        if self.engine.stats:
            self.sqnr[plan.leaf.name] = stats.sqnr

    def _streamed(self, plan: _Plan, extras: dict[str, list[np.ndarray]]) -> Iterator[np.ndarray]:
        out, engine = plan.out, self.engine
        scaling = out.scaling
        total = math.prod(out.shape)
        g = _block_multiple(plan)
        per_block = _block_values(total, g)
        shape = _block_shape(plan, per_block)
        blocks = _Blocks(plan.reader, plan.leaf.name)
        if plan.mode == "introws":
            yield from self._int_row_blocks(plan, blocks.blocks(per_block), shape, extras)
            return
        absmax: np.floating | np.ndarray | None = None
        if plan.mode in ("twopass", "twolevel", "intcast"):  # the absmax first (a maximum)
            absmax = self._absmax(plan, blocks, per_block)
        elif plan.mode in ("columns", "intcols"):  # each group's absmax, as a slab of one row
            absmax = self._slab(plan, blocks, per_block)
        if plan.mode in ("intcast", "intcols"):
            assert isinstance(out.format, dtypes.IntFormat)
            assert absmax is not None
            if out.format.host_absmax(absmax):
                yield from self._int_blocks(plan, blocks, absmax, per_block, extras)
                return
            import_jax()  # the library's special scales: its compiled encode
        stats = _SignalNoise()
        done = 0
        # per-group arrays of each block, or (a per-tensor or per-axis scale
        # computed from the absmax given) one copy shared by every block
        shared = plan.mode in ("twopass", "intcast", "columns", "intcols")
        for block in blocks.blocks(per_block, pad=True):
            check_interrupt()
            n = min(per_block, total - done)
            parts, finite, energy = engine.block(
                block.reshape(shape), scaling, absmax, twolevel=plan.mode == "twolevel"
            )
            if (scaling is not None or _no_specials(plan)) and not finite:  # padding: zeros
                raise self._not_finite(plan)
            if energy is not None:
                stats.add(*energy)
            data = parts[0]
            assert data is not None  # every encoding has codes
            # Padding is proportional in every mode: whole rows, whole scale
            # groups, or (packed) a multiple of a byte's worth of values.
            yield data.reshape(-1)[: data.size * n // per_block].view(out.data_dtype)
            _keep_extras(extras, parts[1:], n, per_block, shared)
            done += n
            self.progress.update(n * plan.leaf.data_dtype.itemsize)
        if engine.stats:
            self.sqnr[plan.leaf.name] = stats.sqnr

    def _absmax(self, plan: _Plan, blocks: _Blocks, per_block: int) -> np.float32:
        """The tensor's absmax (a maximum over its blocks), refusing NaN and inf."""
        absmax = np.float32(0)
        for block in blocks.blocks(per_block):
            # two reductions, no |x| array
            m = np.float32(np.maximum(np.max(block), -np.min(block)))  # NaN kept
            if not np.isfinite(m):
                raise self._not_finite(plan)
            absmax = max(absmax, m)
        return absmax

    def _int_blocks(
        self,
        plan: _Plan,
        blocks: _Blocks,
        absmax: np.floating | np.ndarray,
        per_block: int,
        extras: dict[str, list[np.ndarray]],
    ) -> Iterator[np.ndarray]:
        """Integer codes of one scale for the whole tensor (`absmax` a number: blocks of
        any length) or one per column (a row of the columns' absmaxes: blocks of
        `per_block` values, whole rows), block by block in numpy."""
        fmt = plan.out.format
        assert isinstance(fmt, dtypes.IntFormat)
        top = np.asarray(absmax, np.float32)
        extras["scale"][:] = [fmt.host_scales(top).reshape(-1)]
        row = top.size if top.ndim else 1
        encode = functools.partial(_int_part, (fmt, top, row))
        flat = blocks.blocks(_modes._BLOCK if row == 1 else per_block)
        yield from self._numpy_blocks(plan, flat, np.dtype(np.int8), encode, 2, row)

    def _int_row_blocks(
        self,
        plan: _Plan,
        blocks: Iterator[np.ndarray],
        shape: tuple[int, ...],
        extras: dict[str, list[np.ndarray]],
    ) -> Iterator[np.ndarray]:
        """Integer codes of one scale per row, in numpy blocks of whole rows (`shape`: a
        full block's); a block holding a row whose absmax the host rule does not take
        (`IntFormat.host_absmax`) is the compiled encode's, padded to `shape` (one
        program)."""
        out = plan.out
        fmt = out.format
        assert isinstance(fmt, dtypes.IntFormat)
        row = math.prod(shape[1:])
        top = np.empty(shape[0], np.float32)  # each row's absmax, filled by the parts

        def redo(x: np.ndarray) -> tuple[np.ndarray, list[Any]] | None:
            rows = x.size // row
            if not np.all(np.isfinite(top[:rows])):
                raise self._not_finite(plan)  # as the rows mode refuses them
            if fmt.host_absmax(top[:rows]):
                extras["scale"].append(fmt.host_scales(top[:rows]))
                return None
            import_jax()  # the library's special scales: its compiled encode
            padded = np.zeros(math.prod(shape), np.float32)
            padded[: x.size] = x
            parts, _, energy = self.engine.block(padded.reshape(shape), out.scaling)
            data, scale = parts[0], parts[1]
            assert data is not None
            assert scale is not None
            extras["scale"].append(scale.reshape(-1)[:rows])
            return data.reshape(-1)[: x.size], [] if energy is None else [energy]

        part = functools.partial(_int_rows_part, (fmt, top, row))
        int8 = np.dtype(np.int8)
        yield from self._numpy_blocks(plan, blocks, int8, part, 2, row, redo)

    def _slab(self, plan: _Plan, blocks: _Blocks, per_block: int) -> np.ndarray:
        """One row, shaped like the tensor's rows, holding each per-axis group's absmax."""
        out = plan.out
        scaling = out.scaling
        assert isinstance(scaling, dtypes.PerAxis)
        ndim = len(out.shape)
        (axis,) = scaling.kept(ndim)  # one axis: several are converted whole
        others = tuple(i for i in range(ndim) if i != axis)
        top = np.zeros(out.shape[axis], np.float32)
        for block in blocks.blocks(per_block):
            part = np.abs(block.reshape(-1, *out.shape[1:]))
            m = np.max(part, axis=others) if part.size else top
            if not np.all(np.isfinite(m)):
                raise self._not_finite(plan)
            np.maximum(top, m, out=top)
        along = [1] * ndim
        along[axis] = out.shape[axis]
        return np.ascontiguousarray(np.broadcast_to(top.reshape(along), (1, *out.shape[1:])))

    def _whole(self, plan: _Plan, i: int) -> Iterator[tuple[str, Any]]:
        import jax

        out, engine = plan.out, self.engine
        stored = plan.reader.read_leaf(plan.leaf)
        if _raw(plan.leaf, plan.reader.foreign):
            x = jax.device_put(stored.data)
        else:
            x = encoded(plan.leaf, stored).decode(np.float32)
        del stored
        if out.format is not None and out.format.kind == "scale":
            # a scale format as the values' format (E8M0): refuse what it would turn to NaN
            try:
                out.format.check(x)
            except dtypes.PrecisionError as err:
                raise type(err)(f"tensor {plan.leaf.name!r}: {err}", rule=err.rule) from None
        key = None
        if self.rounding == "stochastic":
            key = jax.random.fold_in(jax.random.key(self.seed), i)
        parts = engine.whole(x, key, plan.out.scaling)
        if out.scaling is not None or engine.stats or _no_specials(plan):
            finite, stats = engine.slice_energy(out, x, parts)
            if (out.scaling is not None or _no_specials(plan)) and not finite:
                raise self._not_finite(plan)
            if engine.stats:
                self.sqnr[plan.leaf.name] = stats.sqnr
        del x
        self.progress.update(plan.leaf.data_dtype.itemsize * max(math.prod(out.shape), 1))
        present = [p for p in parts if p is not None]
        del parts
        for name, dtype, shape in out.arrays():
            array = present.pop(0)  # not held once written
            yield name, np.asarray(array).reshape(shape).view(dtype)
            del array


def _block_shape(plan: _Plan, per_block: int) -> tuple[int, ...]:
    """The shape a block of `per_block` values is encoded in: whole rows, whole scale
    groups, or flat."""
    out = plan.out
    if plan.mode in ("rows", "columns", "introws", "intcols"):
        return (per_block // math.prod(out.shape[1:]), *out.shape[1:])
    if isinstance(out.scaling, dtypes.PerBlock):
        size = int(out.scaling.size)
        return (per_block // size, size)
    return (per_block,)


def _keep_extras(
    extras: dict[str, list[np.ndarray]],
    arrays: tuple[Any, ...],
    n: int,
    per_block: int,
    shared: bool,
) -> None:
    """Keep one block's scales, tensor scale and zero points (`arrays`, each None where the
    encoding has none) of its `n` values in `extras`: appended per block, or one copy
    when every block shares it (a tensor scale, or any array when `shared`)."""
    for role, array in zip(("scale", "tensor_scale", "zero_point"), arrays, strict=True):
        if array is None:
            continue
        kept = extras[role]
        if role == "tensor_scale" or shared:
            kept[:] = [array.reshape(-1)]  # the same in every block
        else:
            kept.append(array.reshape(-1)[: array.size * n // per_block])


def _block_multiple(plan: _Plan) -> int:
    """Values a block holds a multiple of (packing, block groups, rows)."""
    out = plan.out
    fmt = out.format
    assert fmt is not None
    g = 8 if fmt.packed else 1
    if isinstance(out.scaling, dtypes.PerBlock):
        g = math.lcm(g, int(out.scaling.size))
    if plan.mode in ("rows", "columns", "introws", "intcols"):
        g = math.prod(out.shape[1:])
        if isinstance(out.scaling, dtypes.PerBlock):  # blocks down the rows: whole blocks
            g *= int(out.scaling.size)
    return g


def _block_values(total: int, g: int) -> int:
    """Values per block for a tensor of `total` values: one of a few fixed sizes.

    Few sizes mean few compiled programs (compiling costs more than encoding
    a small tensor padded to 4096 values); each is a multiple of `g`.
    """
    for size in (_modes._BLOCK >> 8, _modes._BLOCK >> 4, _modes._BLOCK):
        size = max(g, size // g * g)
        if size >= total:
            return size
    return max(g, _modes._BLOCK // g * g)


def _no_specials(plan: _Plan) -> bool:
    """Whether the output format has neither inf nor NaN (e2m1, e3m2, e2m3) and does not
    saturate: NaN and inf would be written as ±max or 0, so they are refused."""
    fmt = plan.out.format
    return (
        isinstance(fmt, dtypes.FloatFormat)
        and fmt.finite
        and not fmt.nan
        and not fmt.saturate
        and plan.out.scaling is None
    )
