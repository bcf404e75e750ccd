"""AWQ and SmoothQuant: per-input-channel scales, folded so the function is unchanged.

Both divide the input channels `j` of an activation by `s_j` and multiply the
matching rows of every weight reading it by `s_j` (`x W = (x / s)(s W)`); the
division is folded into the normalization that produced `x` (`_affine`), so
the converted model computes the same function before quantization.

- SmoothQuant (Xiao et al., 2022) moves activation outliers into the weights
  for W8A8: `s_j = max|x_j|^alpha / max|W_j|^(1 - alpha)`.
- AWQ (Lin et al., 2023) protects the weights that meet large activations:
  `s_j = mean|x_j|^alpha`, normalized to geometric mean 1, with `alpha` searched
  on a grid for the least output error `sum_i ||x (W_i - Q(s W_i) / s)||^2`,
  computed from the recorded Hessian as `trace(D^T H D)`.

Channels never active (`max|x_j| = 0`) or with all-zero weights keep `s_j = 1`.

AWQ then searches, for every weight (scaled or not), a clipping range per group
and output (`awq_clip`), against the same recorded inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["Weight", "awq_clip", "awq_scales", "clip_ratios", "fold_rows", "smoothquant_scales"]

Weight = tuple[np.ndarray, int]
"""A weight and the axis it contracts (its input channels)."""

_FLOOR = 1e-4


def clip_ratios(count: int) -> list[float]:
    """The clipping ratios searched (AWQ's and GPTQ's `clip`): 1, 1 - 0.5 / count, ...,
    `count` of them down to just above 0.5, the whole range first."""
    return [1.0 - 0.5 * step / count for step in range(count)]


def _rows(w: np.ndarray, axis: int) -> np.ndarray:
    """`w` as (inputs, everything else), float64."""
    return np.moveaxis(np.asarray(w, np.float64), axis, 0).reshape(w.shape[axis], -1)


def fold_rows(w: np.ndarray, axis: int, s: np.ndarray) -> np.ndarray:
    """`w` with its input channels (along `axis`) multiplied by `s`, in `w`'s dtype."""
    shape = [1] * w.ndim
    shape[axis] = -1
    return (np.asarray(w, np.float64) * s.reshape(shape)).astype(w.dtype)


def smoothquant_scales(x_absmax: np.ndarray, weights: Sequence[Weight], alpha: float) -> np.ndarray:
    """SmoothQuant's migration scales for the weights reading one activation."""
    w_absmax = np.max(np.stack([np.max(np.abs(_rows(w, a)), axis=1) for w, a in weights]), axis=0)
    x = np.asarray(x_absmax, np.float64)
    ok = (x > 0) & (w_absmax > 0)
    s = np.ones_like(x)
    s[ok] = x[ok] ** alpha / w_absmax[ok] ** (1 - alpha)
    return np.clip(s, _FLOOR, 1 / _FLOOR)


def awq_scales(
    h: np.ndarray,
    x_mean_abs: np.ndarray,
    weights: Sequence[Weight],
    quantize: Callable[[np.ndarray, int, np.ndarray], np.ndarray],
    grid: int,
) -> tuple[np.ndarray, float]:
    """(AWQ's scales, the alpha chosen) for the weights reading one activation.

    `quantize(w, axis, s)` rounds a weight scaled by `s` as the final conversion
    will (its dequantized values, same layout): to nearest for AWQ, by GPTQ
    against the inputs `x / s` for AWQ+GPTQ.
    """
    mean = np.asarray(x_mean_abs, np.float64)
    live = mean > 0
    floor = float(np.min(mean[live])) if live.any() else 1.0
    mean = np.where(live, mean, floor)
    h = np.asarray(h, np.float64)
    best: tuple[float, np.ndarray, float] | None = None
    for k in range(grid):
        alpha = k / grid
        s = np.maximum(mean**alpha, _FLOOR)
        s = s / np.sqrt(s.max() * s.min())
        loss = 0.0
        for w, axis in weights:
            q = quantize(fold_rows(w, axis, s), axis, s)
            d = _rows(w, axis) - _rows(q, axis) / s[:, None]
            loss += float(np.sum((h @ d) * d))
        if best is None or loss < best[0]:
            best = (loss, s, alpha)
    assert best is not None  # grid >= 1
    return best[1], best[2]


def awq_clip(
    w: np.ndarray,
    axis: int,
    h: np.ndarray,
    group: int,
    quantize: Callable[[np.ndarray, int], np.ndarray],
    ratios: int,
) -> np.ndarray:
    """`w` clipped per group and output where that lowers the output error (AWQ's clip search).

    For each ratio `r` in 1, 1 - 0.5/ratios, ... (down to just above 0.5) the
    weights of every group of `group` inputs and every output are clipped to
    `r` times their absmax and rounded; each (group, output) keeps the ratio
    with the least error `d^T H_gg d` on the recorded inputs (`h` restricted
    to the group). A smaller range gives a finer step to the many weights
    inside it at the cost of the few outside, as the inputs weigh them.
    """
    rows = _rows(w, axis)
    k, m = rows.shape
    starts = list(range(0, k, group))
    amax = np.stack([np.max(np.abs(rows[g : g + group]), axis=0) for g in starts])
    best = np.full((len(starts), m), np.inf)
    keep = np.ones((len(starts), m))
    h = np.asarray(h, np.float64)
    moved_shape = np.moveaxis(w, axis, 0).shape
    for r in clip_ratios(ratios):
        limit = np.repeat(amax * r, group, axis=0)[:k]
        clipped = np.clip(rows, -limit, limit)
        as_w = np.moveaxis(clipped.reshape(moved_shape), 0, axis).astype(w.dtype)
        d = rows - _rows(quantize(as_w, axis), axis)
        for i, g in enumerate(starts):
            dg = d[g : g + group]
            loss = np.sum((h[g : g + group, g : g + group] @ dg) * dg, axis=0)
            better = loss < best[i]
            best[i] = np.where(better, loss, best[i])
            keep[i] = np.where(better, r, keep[i])
    limit = np.repeat(amax * keep, group, axis=0)[:k]
    clipped = np.clip(rows, -limit, limit)
    return np.moveaxis(clipped.reshape(moved_shape), 0, axis).astype(w.dtype)
