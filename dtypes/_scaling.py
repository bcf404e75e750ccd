"""Scaling schemes: how a tensor is cut into groups that share one float32 scale.

A scaling is a frozen, hashable value object; it never holds data. The group
arithmetic (absmax per group, broadcasting a scale back over its group) lives
here too so that encode and decode share one definition of a "group".
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from jax import lax

__all__ = ["PerAxis", "PerBlock", "PerTensor", "Scaling"]


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Base class of the scaling schemes (not instantiated directly)."""

    power_of_two: bool = dataclasses.field(default=False, kw_only=True)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the scale array kept for a tensor of logical `shape`."""
        raise NotImplementedError

    def group_reduce(self, x: jnp.ndarray, reduce) -> jnp.ndarray:
        """Apply `reduce(array, axes)` (keeping dims) over every group.

        The result has `scale_shape(x.shape)`.
        """
        raise NotImplementedError

    def broadcast(self, scale: jnp.ndarray, shape: tuple[int, ...]) -> jnp.ndarray:
        """Expand a per-group array back to the logical `shape`."""
        return jnp.broadcast_to(scale, shape)

    def validate(self, shape: tuple[int, ...]) -> None:
        """Raise `ValueError` if this scaling cannot apply to `shape`."""

    def __str__(self) -> str:
        return self.describe()

    def describe(self) -> str:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class PerTensor(Scaling):
    """One scale for the whole tensor.

    Examples:
        >>> PerTensor().scale_shape((3, 4))
        (1, 1)
    """

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (1,) * len(shape)

    def group_reduce(self, x, reduce):
        return reduce(x, tuple(range(x.ndim)))

    def describe(self) -> str:
        return "per-tensor" + (", power of two" if self.power_of_two else "")


@dataclasses.dataclass(frozen=True)
class PerAxis(Scaling):
    """One scale per index along `axis` (per channel / per row).

    Examples:
        >>> PerAxis(0).scale_shape((3, 4))
        (3, 1)
    """

    axis: int = 0

    def _axis(self, ndim: int) -> int:
        return self.axis % ndim

    def validate(self, shape):
        if not shape or not -len(shape) <= self.axis < len(shape):
            raise ValueError(
                f"PerAxis(axis={self.axis}) does not fit a tensor of shape {tuple(shape)}; "
                f"choose an axis in [-{len(shape)}, {len(shape) - 1}] or use PerTensor()"
            )

    def scale_shape(self, shape):
        self.validate(shape)
        a = self._axis(len(shape))
        return tuple(n if i == a else 1 for i, n in enumerate(shape))

    def group_reduce(self, x, reduce):
        self.validate(x.shape)
        a = self._axis(x.ndim)
        return reduce(x, tuple(i for i in range(x.ndim) if i != a))

    def describe(self) -> str:
        return f"per-axis {self.axis}" + (", power of two" if self.power_of_two else "")


@dataclasses.dataclass(frozen=True)
class PerBlock(Scaling):
    """One scale per block of `size` consecutive elements along `axis`.

    A last, partial block is allowed: it is scaled by its own absmax. With
    `power_of_two=True` and `size=32` this is the OCP microscaling layout.

    Examples:
        >>> PerBlock(32).scale_shape((4, 100))
        (4, 4)
    """

    size: int = 32
    axis: int = -1

    def __post_init__(self):
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"PerBlock size must be a positive int, got {self.size!r}")

    def validate(self, shape):
        if not shape or not -len(shape) <= self.axis < len(shape):
            raise ValueError(
                f"PerBlock(axis={self.axis}) does not fit a tensor of shape {tuple(shape)}; "
                f"choose an axis in [-{len(shape)}, {len(shape) - 1}] or use PerTensor()"
            )

    def _axis(self, ndim: int) -> int:
        return self.axis % ndim

    def scale_shape(self, shape):
        self.validate(shape)
        a = self._axis(len(shape))
        return tuple(math.ceil(n / self.size) if i == a else n for i, n in enumerate(shape))

    def group_reduce(self, x, reduce):
        self.validate(x.shape)
        a = self._axis(x.ndim)
        n = x.shape[a]
        nblocks = math.ceil(n / self.size)
        pad = nblocks * self.size - n
        if pad:
            # Zero padding never changes an absmax or a mean of |x| over the real
            # elements' sum; callers that need a count use `block_counts`.
            widths = [(0, 0)] * x.ndim
            widths[a] = (0, pad)
            x = jnp.pad(x, widths)
        blocked = x.reshape((*x.shape[:a], nblocks, self.size, *x.shape[a + 1 :]))
        return reduce(blocked, (a + 1,)).reshape(
            self.scale_shape((*x.shape[:a], n, *x.shape[a + 1 :]))
        )

    def broadcast(self, scale, shape):
        # A reshape of a broadcast, not jnp.repeat: XLA fuses it into the
        # elementwise kernel as index arithmetic (repeat becomes a gather).
        a = self._axis(len(shape))
        nblocks = scale.shape[a]
        full = jnp.broadcast_to(
            jnp.expand_dims(scale, a + 1), (*shape[:a], nblocks, self.size, *shape[a + 1 :])
        ).reshape((*shape[:a], nblocks * self.size, *shape[a + 1 :]))
        if nblocks * self.size != shape[a]:  # a last, partial block
            full = lax.slice_in_dim(full, 0, shape[a], axis=a)
        return full

    def describe(self) -> str:
        return f"per-block {self.size} on axis {self.axis}" + (
            ", power of two" if self.power_of_two else ""
        )


def group_sizes(scaling: Scaling, shape: tuple[int, ...]) -> jnp.ndarray:
    """Number of real (unpadded) elements in each group, shaped like the scale."""
    ones = jnp.ones(shape, jnp.float32)
    return scaling.group_reduce(ones, lambda a, axes: jnp.sum(a, axis=axes, keepdims=True)).reshape(
        scaling.scale_shape(shape)
    )
