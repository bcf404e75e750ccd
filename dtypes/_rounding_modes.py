"""The rounding modes by name, and the check of a mode and its key (no JAX).

The modes themselves are computed in `_bit_rounding` (bit-level, for float grids
and integers); this module only names them, so that `dtypes.ROUNDING_MODES`
and `dtypes.check_rounding` work without importing JAX.
"""

from __future__ import annotations

from typing import Any

from ._errors import RoundingError

__all__ = ["CODEBOOK_ROUNDINGS", "NEAREST_MODES", "ROUNDING_MODES", "check_rounding"]

ROUNDING_MODES: tuple[str, ...] = (
    "nearest_even",
    "nearest_away",
    "toward_zero",
    "up",
    "down",
    "stochastic",
)
"""The rounding modes every format accepts; `nearest_even` is the default."""

NEAREST_MODES: tuple[str, ...] = ("nearest_even", "nearest_away")
"""The modes that round every value below half a step to zero: a product XLA:CPU
flushes to zero rounds as the exact one does (the CPU forms of the integer codes)."""

CODEBOOK_ROUNDINGS: tuple[str, ...] = ("nearest_even", "stochastic")
"""The modes of a code book (NF4): its values are not ordered like a float grid's, so
only the nearest code, or one of the two around a value at random, has a meaning."""


def check_rounding(rounding: str, key: Any) -> None:
    """Validate a rounding mode name and its key; raise `RoundingError` (a `ValueError`).

    `stochastic` needs a key; any mode takes one (unused but for `stochastic`), and a
    key given must be a JAX random key: a typed `jax.random.key` or raw uint32 words.

    Examples:
        >>> check_rounding("up", None)
        >>> check_rounding("stochastic", None)
        Traceback (most recent call last):
        ...
        dtypes._errors.RoundingError: rounding='stochastic' needs a random key: ...
    """
    if not isinstance(rounding, str) or rounding not in ROUNDING_MODES:
        raise RoundingError(
            f"unknown rounding mode {rounding!r}; expected one of {', '.join(ROUNDING_MODES)}"
        )
    if rounding == "stochastic" and key is None:
        raise RoundingError(
            "rounding='stochastic' needs a random key: pass key=jax.random.key(0) "
            "(split it between calls so each rounding draws fresh bits)"
        )
    # A key given is checked whatever the mode: one that only stochastic rounding reads
    # would otherwise pass until the mode changes, and fail deep inside the rounding.
    if key is not None and not _is_key(key):
        needs = "needs a JAX random key" if rounding == "stochastic" else "takes a JAX random key"
        raise RoundingError(
            f"rounding={rounding!r} {needs}, got {type(key).__name__} {key!r:.60}: pass "
            "key=jax.random.key(0) (or jax.random.PRNGKey(0)), not a seed"
            + ("" if rounding == "stochastic" else ", or no key at all")
        )


def _is_key(key: Any) -> bool:
    """A typed JAX key, or raw key data (uint32 words, as `jax.random.PRNGKey` gives)."""
    dtype = getattr(key, "dtype", None)
    if dtype is None or not hasattr(key, "shape"):
        return False
    if str(dtype).startswith("key<"):
        return True
    return str(dtype) == "uint32" and len(key.shape) >= 1
