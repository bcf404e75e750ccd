"""GPTQ: integer codes chosen column by column, each rounding error compensated.

The published algorithm (Frantar et al., 2022, "GPTQ: Accurate Post-Training
Quantization for Generative Pre-trained Transformers"), in float64 numpy on
the host, so a calibration gives the same codes on every backend. For a weight
matrix `w` (rows = outputs, columns = the contracted inputs) and the Hessian
`h = sum_r x_r x_r^T` of its recorded inputs:

1. Inputs never seen (`h[j, j] == 0`) get `h[j, j] = 1` and their weights 0.
2. With `act_order`, columns are visited by decreasing `h[j, j]`; every group's
   scale is then taken from the original weights first ("static groups"), so
   the groups stay the contiguous blocks that storage holds.
3. `h += damp * mean(diag(h)) * I`; `u` is the upper Cholesky factor of `h^-1`.
4. Columns are visited in blocks of `block`. Column `j` is rounded to its
   nearest code under its group's scale, `e = (w_j - q_j) / u[j, j]`, and the
   columns not yet rounded absorb it: `w_k -= e * u[j, k]` (within the block
   at once, beyond it when the block ends: the same arithmetic, batched).

Without `act_order` a group's scale is computed when the group's first column
is reached, from the group's weights as they are then (every compensation so
far applied), as the format's own encoder would scale them.

With `clip`, each row of a group takes, instead of the scale of its whole
range, the scale of the range clipped to `r` times it, for the `r` of
`clip_ratios(clip)` whose rounding of the group's weights loses least, each
weight's squared error weighed by its input's energy `h[j, j]`: a finer step
for the many weights inside at the cost of the few beyond it (the published
implementation's `mse` option searches the same way, unweighted).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._smooth import clip_ratios

__all__ = ["ScaleRule", "gptq"]

ScaleRule = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""`rule(cols) -> (stored, unit, zero)`: for the weights `cols` of one group,
shaped (rows, n), the scale each row stores (its scale format's dtype), its
value as float64 (what one step of the codes decodes to) and the row's zero
point (0 for a symmetric format)."""


def _upper_inverse_factor(h: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor `u` of `h^-1` (`h^-1 = u^T u`)."""
    lower = np.linalg.cholesky(h)
    eye = np.eye(h.shape[0])
    inv_lower = np.linalg.solve(lower, eye)
    hinv = inv_lower.T @ inv_lower
    return np.linalg.cholesky(hinv).T


def _clipped(
    rule: ScaleRule, levels: tuple[int, int], cols: np.ndarray, energy: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`rule`'s (stored, unit, zero) for each row of `cols` from its range clipped to the
    ratio whose rounding loses least (`sum_j energy_j * err_j**2`), the whole range first.

    The rule scales rows alone, so the clipped copies go to it stacked, as many ratios
    at once as keep the stack within `_STACK` values."""
    x = np.asarray(cols, np.float64)
    n, (low, high) = len(x), levels
    ratios = clip_ratios(count)
    at_once = max(1, _STACK // max(x.size, 1))
    best: list[np.ndarray] = []
    for first in range(0, len(ratios), at_once):
        some = ratios[first : first + at_once]
        found = rule(np.concatenate([x * r for r in some]))
        for i in range(len(some)):
            stored, unit, zero = (np.asarray(a)[i * n : (i + 1) * n] for a in found)
            s, z = unit[:, None], zero.astype(np.float64)[:, None]
            err = x - (np.clip(np.rint(x / s) + z, low, high) - z) * s
            now = [(err * err) @ energy, stored, unit, zero]
            better = now[0] < best[0] if best else np.ones(n, bool)
            best = [np.where(better, a, b) for a, b in zip(now, best or now, strict=True)]
    return best[1], best[2], best[3]


_STACK = 1 << 22  # values of clipped weights given to a scale rule at once


def gptq(
    w: np.ndarray,
    h: np.ndarray,
    *,
    levels: tuple[int, int],
    groups: list[tuple[int, int]],
    rule: ScaleRule,
    static: bool = False,
    damp: float = 0.01,
    block: int = 128,
    act_order: bool = False,
    clip: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes (rows, cols), stored scales and zero points (rows, groups)) for `w` under `h`.

    Codes lie within `levels` (`(-qmax, qmax)`, or `(0, qmax)` with zero points).
    `groups` are the `(start, end)` column ranges sharing a scale, in order and
    covering every column (`[(0, cols)]` for one scale per row); `static` takes
    every scale from the original weights (as `act_order` does); `clip` > 0
    searches that many clipping ratios for each group's scale.
    """
    w = np.array(w, np.float64)
    h = np.array(h, np.float64)
    rows, cols = w.shape
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    energy = np.diag(h).copy()

    def scale_of(g: int, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(stored, unit, zero) of group `g` from its weights `cols`."""
        if not clip:
            return rule(cols)
        start, end = groups[g]
        return _clipped(rule, levels, cols, energy[start:end], clip)

    group_of = np.zeros(cols, np.int64)
    for g, (start, end) in enumerate(groups):
        group_of[start:end] = g
    units = np.zeros((rows, len(groups)))
    zeros = np.zeros((rows, len(groups)))
    stored: list[np.ndarray | None] = [None] * len(groups)
    static = static or act_order
    if static:
        for g, (start, end) in enumerate(groups):
            stored[g], units[:, g], zeros[:, g] = scale_of(g, w[:, start:end])
    perm = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(cols)
    w, h = w[:, perm], h[np.ix_(perm, perm)]
    h[np.diag_indices(cols)] += damp * float(np.mean(np.diag(h)))
    u = _upper_inverse_factor(h)
    codes = np.zeros((rows, cols), np.int16)
    low, high = levels
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        w1 = w[:, i1:i2].copy()
        err = np.zeros((rows, i2 - i1))
        for i in range(i2 - i1):
            col = int(perm[i1 + i])
            g = int(group_of[col])
            if not static and col == groups[g][0]:
                end = groups[g][1]
                # this block's columns as updated so far; the columns past it with
                # this block's compensations (applied to `w` when the block ends)
                beyond = w[:, i2:end] - err[:, :i] @ u[i1 : i1 + i, i2:end]
                current = np.concatenate([w1[:, i:], beyond], axis=1)[:, : end - col]
                stored[g], units[:, g], zeros[:, g] = scale_of(g, current)
            x, s, z = w1[:, i], units[:, g], zeros[:, g]
            q = np.clip(np.rint(x / s) + z, low, high)
            codes[:, col] = q.astype(np.int16)
            e = (x - (q - z) * s) / u[i1 + i, i1 + i]
            w1[:, i:] -= np.outer(e, u[i1 + i, i1 + i : i2])
            err[:, i] = e
        w[:, i2:] -= err @ u[i1:i2, i2:]
    scales = np.stack([s for s in stored if s is not None], axis=1)
    return codes, scales, zeros.astype(np.int16)
