"""The demo's images: scikit-learn's handwritten digits, or an MNIST-layout `.npz`."""

from __future__ import annotations

import os
import zipfile
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Dataset", "load_data"]


class Dataset(NamedTuple):
    """Images as float32 in [0, 1], shaped (N, H, W, 1); labels as int32."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str


_NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def load_data(path: str | None = None, *, split_seed: int = 0) -> Dataset:
    """The handwritten digits shipped with scikit-learn, or an MNIST-layout `.npz`.

    Digits: 1797 8x8 images with pixel values 0..16, split 80/20 (1437 train,
    360 test) by a permutation drawn from `split_seed`, scaled to [0, 1].

    `.npz`: arrays `x_train`, `y_train`, `x_test`, `y_test` as in the
    MNIST/Fashion-MNIST files: images (N, H, W) uint8 (0..255), labels (N,)
    integers in 0..9.

    Raises:
        ValueError: the file lacks a key, or an array has the wrong shape or
            dtype; the message names the key, what it holds and what is needed.
    """
    if path is None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = (digits.images / 16.0).astype(np.float32)[..., None]
        y = digits.target.astype(np.int32)
        order = np.random.default_rng(split_seed).permutation(len(x))
        n_train = int(0.8 * len(x))
        tr, te = order[:n_train], order[n_train:]
        return Dataset(x[tr], y[tr], x[te], y[te], "digits (scikit-learn, 8x8)")
    with open(path, "rb") as file:  # (closed even where numpy's reader fails)
        arrays = _npz_arrays(file, path)
    for split in ("train", "test"):
        xs, ys = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if xs.ndim != 3 or xs.shape[0] == 0:
            raise ValueError(
                f"{path}: x_{split} has shape {xs.shape}; expected (N, height, width) images"
            )
        if xs.dtype != np.uint8:
            raise ValueError(
                f"{path}: x_{split} has dtype {xs.dtype}; expected uint8 pixels in 0..255"
            )
        if ys.shape != (xs.shape[0],):
            raise ValueError(
                f"{path}: y_{split} has shape {ys.shape}; expected ({xs.shape[0]},), one label "
                f"per image of x_{split}"
            )
        if ys.dtype.kind not in "iu" or ys.min() < 0 or ys.max() > 9:
            raise ValueError(f"{path}: y_{split} must hold integer labels 0..9")
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        raise ValueError(
            f"{path}: train images are {arrays['x_train'].shape[1:]} but test images are "
            f"{arrays['x_test'].shape[1:]}; they must match"
        )

    def images(a: np.ndarray) -> np.ndarray:
        return (a.astype(np.float32) / 255.0)[..., None]

    h, w = arrays["x_train"].shape[1:]
    return Dataset(
        images(arrays["x_train"]),
        arrays["y_train"].astype(np.int32),
        images(arrays["x_test"]),
        arrays["y_test"].astype(np.int32),
        f"{os.path.basename(path)} ({h}x{w})",
    )


def _npz_arrays(file: Any, path: str) -> dict[str, np.ndarray]:
    """The MNIST-layout arrays of an open `.npz` archive, or a ValueError naming `path`."""
    try:
        archive = np.load(file, allow_pickle=False)
    except (ValueError, EOFError, zipfile.BadZipFile):  # numpy's message speaks of pickles
        raise ValueError(
            f"{path}: not an .npz archive (an MNIST-layout .npz is expected)"
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(
            f"{path}: a single .npy array, not an .npz archive of {', '.join(_NPZ_KEYS)}"
        )
    with archive as f:
        missing = [k for k in _NPZ_KEYS if k not in f.files]
        if missing:
            raise ValueError(
                f"{path}: missing array(s) {', '.join(missing)}; an MNIST-layout .npz holds "
                f"{', '.join(_NPZ_KEYS)} (found: {', '.join(f.files) or 'nothing'})"
            )
        return {k: f[k] for k in _NPZ_KEYS}
