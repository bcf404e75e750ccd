"""One weight converted from its recorded statistics: GPTQ, AWQ's clipped
round-to-nearest, or round-to-nearest, into a Tensor in its own layout.

`Site` holds what `calibrate` knows of a weight (its contracted axes, stacking
axes and statistics); `convert` turns it into a Tensor. GPTQ runs on the host
in float64 (`_gptq`), with each group's scale computed by the format's own
encoder, so the codes are the same on every backend.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax.numpy as jnp
import numpy as np

import dtypes

from .._checkpoint import _q4_0
from .._errors import CalibrationError
from .._tensor import Tensor
from ._gptq import ScaleRule, gptq
from ._smooth import awq_clip

__all__ = ["Site", "aimed_scaling", "convert", "rtn_values"]


@dataclasses.dataclass
class Site:
    """One weight to convert: its leaf, contracted axes (the recorded features' order:
    a matrix's input axis; a kernel's spatial axes, then its input channels), stacking
    axes, statistics."""

    path: str
    axes: tuple[int, ...]
    stacked: tuple[int, ...]
    stats: dict[str, np.ndarray]
    size: int  # bytes of its statistics


def aimed_scaling(
    scaling: dtypes.Scaling, shape: tuple[int, ...], axes: tuple[int, ...], path: str
) -> Any:
    """`scaling` placed on a weight contracted over `axes`: blocks along its inputs
    (the input channels of a kernel), one scale per output channel, or one per tensor."""
    if isinstance(scaling, dtypes.PerBlock):
        # blocks along the last summed axis; one shorter than a block is one block, and
        # the scaling says so (PerBlock(128) on a head_dim of 64 is PerBlock(64))
        size = min(scaling.size, shape[axes[-1]]) if shape else scaling.size
        return dataclasses.replace(scaling, axis=axes[-1], size=size)
    if isinstance(scaling, dtypes.PerTensor):
        return scaling
    outputs = tuple(i for i in range(len(shape)) if i not in axes)
    if not outputs:
        raise CalibrationError(
            f"calibrate: {path} has shape {shape} and every axis is summed: it has no output "
            "channel to scale; use scaling=dtypes.PerTensor() or dtypes.PerBlock(128)"
        )
    # one scale per output channel; a kernel with several output axes (an attention
    # projection's (embed, heads, head_dim)) has one per index of all of them
    return dtypes.PerAxis(
        outputs[0] if len(outputs) == 1 else outputs,
        power_of_two=scaling.power_of_two,
        scale_format=scaling.scale_format,
    )


def _rule(fmt: dtypes.Format, scaling: dtypes.Scaling, per_tensor: bool) -> ScaleRule:
    """The format's own scale (and zero point) for each row of a group, or one for all."""
    two, fmt_name = scaling.power_of_two, scaling.scale_format
    rows = dtypes.PerAxis(0, power_of_two=two, scale_format=fmt_name)
    encoding = dtypes.PerTensor(power_of_two=two, scale_format=fmt_name) if per_tensor else rows
    qmax = int(getattr(fmt, "qmax", 0))

    def rule(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        enc = fmt.encode(jnp.asarray(cols, jnp.float32), scaling=encoding)
        assert enc.scale is not None  # an integer encoding is scaled
        n = cols.shape[0]
        stored = jnp.broadcast_to(enc.scale.reshape(-1, 1), (n, 1))
        if enc.zero_point is None:
            one = dtypes.from_codes(np.ones((n, 1), np.int8), stored, fmt, rows)
            zero = np.zeros(n)
        else:
            zp = np.broadcast_to(np.asarray(enc.zero_point).reshape(-1, 1), (n, 1))
            step = np.where(zp < qmax, zp + 1, zp - 1).astype(np.int16)  # one code off zero
            one = dtypes.from_codes(step, stored, fmt, rows, zero_point=zp.astype(np.int16))
            zero = zp[:, 0].astype(np.float64)
        unit = np.abs(np.asarray(one.decode(), np.float64))[:, 0]
        return np.asarray(stored)[:, 0], unit, zero

    return rule


def _same_for_all(values: tuple[np.ndarray, np.ndarray, np.ndarray]) -> ScaleRule:
    """A rule giving every row the (stored, unit, zero) of a per-tensor scale."""
    stored, unit, zero = values

    def rule(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = cols.shape[0]
        return stored[:1].repeat(n), unit[:1].repeat(n), zero[:1].repeat(n)

    return rule


def _gptq_matrix(
    w: np.ndarray,
    axes: tuple[int, ...],
    h: np.ndarray,
    fmt: dtypes.Format,
    scaling: Any,
    opts: dict[str, Any],
    clip: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, stored scales, zero points) of one layer's weight `w`, in its own layout."""
    tail = tuple(range(w.ndim - len(axes), w.ndim))
    moved = np.moveaxis(w, axes, tail)  # (outputs..., contracted axes in K order)
    kshape = moved.shape[w.ndim - len(axes) :]
    k = int(np.prod(kshape))
    mat = moved.reshape(-1, k)
    per_tensor = isinstance(scaling, dtypes.PerTensor)
    if isinstance(scaling, dtypes.PerBlock):
        # blocks along the last contracted axis (input channels), for each position
        # of the others (a kernel's window): contiguous runs of columns
        c = kshape[-1]
        size = max(1, min(scaling.size, c))
        groups = [
            (base + b, base + min(b + size, c))
            for base in range(0, k, c)
            for b in range(0, c, size)
        ]
    else:
        groups = [(0, k)]
    qmax = int(getattr(fmt, "qmax", 0))
    rule = _q4_0.rule if _q4_0.is_q4_0(fmt) else _rule(fmt, scaling, per_tensor)
    # a grouped convolution's Hessians come one per group (G in front): each group's
    # outputs, consecutive rows of `mat`, read only their own inputs
    hessians = h if h.ndim == 3 else h[None]
    if per_tensor and len(hessians) > 1:
        rule = _same_for_all(rule(mat))  # one scale for the tensor, not one per group
    parts = [
        gptq(
            rows,
            hg,
            levels=(0, qmax) if fmt.kind == "uint" else (-qmax, qmax),
            groups=groups,
            rule=rule,
            static=not isinstance(scaling, dtypes.PerBlock),
            clip=0 if per_tensor else clip,  # one scale for the tensor: its whole range
            **opts,
        )
        for rows, hg in zip(np.split(mat, len(hessians)), hessians, strict=True)
    ]
    codes, stored, zeros = (np.concatenate(p, axis=0) for p in zip(*parts, strict=True))
    codes = np.moveaxis(codes.reshape(moved.shape), tail, axes)
    if per_tensor:
        return codes, stored[:1, :1].reshape((1,) * w.ndim), zeros[:1, :1].reshape((1,) * w.ndim)
    blocks = (*kshape[:-1], -1) if isinstance(scaling, dtypes.PerBlock) else (1,) * len(axes)

    def back(per_group: np.ndarray) -> np.ndarray:
        shaped = per_group.reshape((*moved.shape[: w.ndim - len(axes)], *blocks))
        return np.moveaxis(shaped, tail, axes)

    return codes, back(stored), back(zeros)


def _convert_gptq(
    leaf: Any,
    site: Site,
    fmt: dtypes.Format,
    scaling: dtypes.Scaling,
    opts: dict[str, Any],
    clip: int,
) -> Tensor:
    w = np.asarray(leaf, np.float32)
    if len(site.stacked) > 1:
        raise CalibrationError(
            f"calibrate: {site.path} is indexed by {len(site.stacked)} nested scans; "
            "calibrate weights stacked along one axis at most"
        )
    aimed = aimed_scaling(scaling, w.shape, site.axes, site.path)
    h = site.stats["h"]
    if not site.stacked:
        codes, scales, zeros = _gptq_matrix(w, site.axes, h, fmt, aimed, opts, clip)
    else:
        if not isinstance(aimed, dtypes.PerBlock):
            raise CalibrationError(
                f"calibrate: {site.path} holds one layer per scan step; its scales must vary "
                "per layer: use scaling=dtypes.PerBlock(128)"
            )
        s = site.stacked[0]
        inner_axes = tuple(a - (a > s) for a in site.axes)
        inner = dataclasses.replace(aimed, axis=inner_axes[-1])
        parts = [
            _gptq_matrix(np.take(w, i, axis=s), inner_axes, h[i], fmt, inner, opts, clip)
            for i in range(w.shape[s])
        ]
        codes = np.stack([c for c, _, _ in parts], axis=s)
        scales = np.stack([sc for _, sc, _ in parts], axis=s)
        zeros = np.stack([z for _, _, z in parts], axis=s)
    zero_point = zeros if fmt.kind == "uint" else None
    stored = dtypes.get("uint4") if _q4_0.is_q4_0(fmt) else fmt  # Q4_0's grid: a uint4
    enc = dtypes.from_codes(codes, scales, stored, aimed, zero_point=zero_point)
    return Tensor.from_encoded(enc, _logical(leaf))


def _convert_rtn(leaf: Any, site: Site, fmt: dtypes.Format, scaling: dtypes.Scaling) -> Tensor:
    aimed = aimed_scaling(scaling, tuple(np.shape(leaf)), site.axes, site.path)
    if _q4_0.is_q4_0(fmt):
        return Tensor.from_encoded(
            _q4_0.encode(np.asarray(leaf, np.float32), aimed.axis), _logical(leaf)
        )
    return Tensor(leaf).to_reduced_precision(fmt, scaling=aimed)


def _logical(leaf: Any) -> np.dtype[Any]:
    """A converted weight's logical dtype: float64 stays, narrower floats (bfloat16 and
    float16 parameters, every value exact in float32) read as float32."""
    dtype = np.asarray(leaf).dtype
    return dtype if dtype == np.float64 else np.dtype(np.float32)


def convert(
    method: str,
    leaf: Any,
    site: Site,
    fmt: dtypes.Format,
    scaling: dtypes.Scaling,
    opts: dict[str, Any],
    scale: np.ndarray | None,
    clip: int,
) -> Tensor:
    """One weight converted by `method`, from its (folded) values and recorded statistics;
    a weight whose input rows were scaled by `scale` (AWQ's fold) meets `x / scale`."""
    if scale is not None:  # the Hessian of the inputs it meets
        h = np.asarray(site.stats["h"], np.float64) / np.outer(scale, scale)
        site = dataclasses.replace(site, stats={**site.stats, "h": h})
    if method == "gptq":
        return _convert_gptq(leaf, site, fmt, scaling, opts, clip)
    if method == "awq" and clip:
        clipped = _clip_for_awq(leaf, site, fmt, scaling, clip)
        return _convert_rtn(clipped, site, fmt, scaling)
    return _convert_rtn(leaf, site, fmt, scaling)


def rtn_values(w: np.ndarray, axis: int, fmt: dtypes.Format, scaling: dtypes.Scaling) -> Any:
    """`w` rounded to nearest as the conversion will round it (decoded values)."""
    aimed = aimed_scaling(scaling, w.shape, (axis,), "")
    if _q4_0.is_q4_0(fmt):
        return _q4_0.decoded(w, aimed.axis)
    return np.asarray(Tensor(w).to_reduced_precision(fmt, scaling=aimed).numpy())


def _clip_for_awq(w: Any, site: Site, fmt: dtypes.Format, scaling: Any, ratios: int) -> Any:
    """AWQ's clip search over `ratios` ratios on one weight, against the inputs it meets."""
    if len(site.axes) != 1 or isinstance(scaling, dtypes.PerTensor):
        return w  # one range per group and output: not for kernels or a tensor scale
    w = np.asarray(w)
    (axis,) = site.axes
    h = site.stats["h"]
    group = scaling.size if isinstance(scaling, dtypes.PerBlock) else w.shape[axis]
    rtn = functools.partial(rtn_values, fmt=fmt, scaling=scaling)
    return awq_clip(w, axis, h, max(1, min(group, w.shape[axis])), rtn, ratios)
