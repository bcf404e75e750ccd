"""GPTQ written out plainly from the published algorithm, and convolution patches built
by hand: the independent references of the calibration tests."""

from __future__ import annotations

import numpy as np

QMAX = 7  # int4


CLIP = 20  # calibrate's default number of clipping ratios (and act_order, its default)


def reference_gptq(w, h, group, damp, act_order=True, zero_points=False, clip=CLIP):
    """GPTQ written out plainly from the paper, one column at a time, no blocks:
    returns the dequantized weights (rows = outputs, columns = inputs). With
    `zero_points`, uint4 codes: each group's scale and zero point follow the
    documented min-max rule of dtypes' asymmetric formats. With `clip` > 0, each
    row of a group takes the scale of its weights times r, for the r among 1,
    1 - 0.5 / clip, ... (clip of them) whose rounding of the group's weights has
    the least sum of h[j, j] * error**2 (the first such r)."""
    w = w.astype(np.float64).copy()
    h = h.astype(np.float64).copy()
    n = w.shape[1]
    for j in range(n):
        if h[j, j] == 0:
            h[j, j] = 1.0
            w[:, j] = 0.0

    def scale(block):
        block = block.astype(np.float32)
        if zero_points:
            lo = np.minimum(block.min(axis=1), 0)
            hi = np.maximum(block.max(axis=1), 0)
            s = ((hi - lo) / np.float32(15)).astype(np.float32)
            s = np.where(hi == lo, np.float32(1), s)
            inv = np.float32(1) / s
            zp = np.clip(np.rint(-lo * inv), 0, 15)
            return s.astype(np.float64), zp.astype(np.float64)
        absmax = np.max(np.abs(block), axis=1)
        s = (absmax / np.float32(QMAX)).astype(np.float32)
        return np.where(absmax == 0, np.float32(1), s).astype(np.float64), 0.0

    lo, hi = (0, 15) if zero_points else (-QMAX, QMAX)
    energy = np.diag(h).copy()

    def searched(block, first):
        if not clip:
            return scale(block)
        weights = energy[first : first + block.shape[1]]
        best = None
        for i in range(clip):
            s, z = scale(block * (1 - 0.5 * i / clip))
            s, z = s[:, None], np.broadcast_to(z, s.shape)[:, None]
            q = (np.clip(np.rint(block / s) + z, lo, hi) - z) * s
            err = np.sum(weights * (block - q) ** 2, axis=1)
            now = [err, s[:, 0], z[:, 0]]
            if best is None:
                best = now
            else:  # a row keeps the first ratio of least error
                best = [np.where(err < best[0], a, b) for a, b in zip(now, best, strict=True)]
        return best[1], best[2]

    scales = {}
    if act_order:
        for g in range(0, n, group):
            scales[g // group] = searched(w[:, g : g + group], g)
        order = sorted(range(n), key=lambda j: (-h[j, j], j))
    else:
        order = list(range(n))
    w = w[:, order]
    h = h[np.ix_(order, order)]
    h = h + damp * np.mean(np.diag(h)) * np.eye(n)
    hinv = np.linalg.inv(h)
    u = np.linalg.cholesky(hinv).T  # hinv = u.T @ u, u upper triangular
    q = np.zeros_like(w)
    for k in range(n):
        j = order[k]
        if not act_order and j % group == 0:
            scales[j // group] = searched(w[:, k : k + group], j)
        s, z = scales[j // group]
        q[:, k] = (np.clip(np.rint(w[:, k] / s) + z, lo, hi) - z) * s
        e = (w[:, k] - q[:, k]) / u[k, k]
        w[:, k + 1 :] -= np.outer(e, u[k, k + 1 :])
    out = np.zeros_like(q)
    out[:, order] = q
    return out


def patches(x, k):
    """3x3 'SAME' input patches of NHWC `x`, as rows of (dy, dx, channel) features."""
    n, hgt, wid, _ = x.shape
    pad = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    rows = [
        pad[b, i : i + k, j : j + k, :].reshape(-1)
        for b in range(n)
        for i in range(hgt)
        for j in range(wid)
    ]
    return np.array(rows, np.float64)
