"""Apply optimizer updates to parameters that live in a reduced format.

With parameters stored in bfloat16 (8 significant bits), an SGD update
smaller than half the spacing between neighbouring bfloat16 values rounds
straight back to the old value: rounded to nearest, small updates are lost
for good and training stalls. Stochastic rounding goes up with probability
equal to the fraction of the spacing covered, so each update survives *in
expectation*, and the sum of many small updates is kept.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import dtypes
from dtypes import RoundingError

from ._errors import UpdateError
from ._tensor import Tensor, logical_values
from ._tree import is_tensor

__all__ = ["apply_updates"]


def _native_format(dtype: np.dtype) -> dtypes.Format | None:
    """The registered format of a narrow native float dtype (bfloat16, float16, fp8)."""
    for fmt in dtypes.FORMATS.values():
        if getattr(fmt, "native_dtype", None) == dtype and not fmt.is_full_precision:
            return fmt
    return None


def apply_updates(
    params: Any,
    updates: Any,
    *,
    rounding: str = "nearest_even",
    key: jax.Array | None = None,
) -> Any:
    """`params + updates`, leaf by leaf, each result kept in its parameter's format.

    - A Tensor parameter in a reduced format F becomes
      `F.encode(decoded param + update)` under `rounding` (its scaling kept,
      the scale recomputed from the new values).
    - A plain array in a narrow float dtype (a bfloat16, float16 or float8
      jax array) is rounded the same way and kept in its dtype.
    - A float32/float64 array or full-precision Tensor is added to exactly
      as in any optimizer library.
    - A Python float parameter becomes a JAX scalar array of the sum.
    - A `None` update or a non-floating parameter leaves the leaf unchanged.

    `updates` has the structure of `params` (what any Optax optimizer's
    `update` returns); its leaves may be arrays or Tensors.

    Args:
        params: the parameter tree.
        updates: the update tree (already scaled by the learning rate).
        rounding: `"nearest_even"` (default), `"stochastic"` or any mode of
            `dtypes.ROUNDING_MODES`.
        key: `jax.random` key for stochastic rounding; split per leaf, so pass
            a fresh key every step.

    Returns:
        The new parameter tree.

    Raises:
        ValueError: unknown rounding mode, missing key or a batch of keys
            (`RoundingError`), or trees whose structures do not match.
        UpdateError: an update whose shape differs from its parameter's, or
            that is not real floating or not an array at all (a `ValueError`).

    Examples:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> import precision
        >>> w = precision.to_reduced_precision({"w": jnp.ones(4)}, "bfloat16")
        >>> tiny = {"w": jnp.full(4, 1e-3)}  # below half a bfloat16 ulp at 1.0
        >>> precision.apply_updates(w, tiny)["w"].numpy().tolist()
        [1.0, 1.0, 1.0, 1.0]
        >>> sr = precision.apply_updates(w, tiny, rounding="stochastic", key=jax.random.key(1))
        >>> sorted(set(sr["w"].numpy().tolist())) <= [1.0, 1.0078125]
        True
    """
    dtypes.check_rounding(rounding, key)
    if key is not None and rounding == "stochastic" and _key_count(key) != 1:
        raise RoundingError(
            f"apply_updates needs one random key, got a batch of shape {tuple(key.shape)}; pass "
            "a single key such as jax.random.key(0) (it is split per leaf), e.g. key=keys[0]"
        )
    flat, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_tensor)
    try:
        ups = treedef.flatten_up_to(updates)  # type: ignore[attr-defined]  # no jaxlib stub
    except (ValueError, TypeError) as err:
        raise UpdateError(
            f"updates must have the structure of params; params is {treedef}, updates is "
            f"{jax.tree_util.tree_structure(updates, is_leaf=is_tensor)} ({err})"
        ) from None

    rounded = [i for i, (_, p) in enumerate(flat) if _rounds(p)]
    keys = dict(
        zip(rounded, jax.random.split(key, len(rounded)), strict=True)
        if key is not None and rounded
        else {}
    )
    out = []
    for i, ((path, p), u) in enumerate(zip(flat, ups, strict=True)):
        if isinstance(p, float) and u is not None:  # a Python float: a float32 (or 64) scalar
            p = jnp.asarray(p)
        if u is None or not _is_float_leaf(p):
            out.append(p)
            continue
        where = jax.tree_util.keystr(path) or "<root>"
        if isinstance(u, Tensor):
            u = logical_values(u)
        try:
            u = jnp.asarray(u)
        except (TypeError, ValueError):  # text, objects, a subtree where a leaf belongs
            raise UpdateError(
                f"{where}: an update that is {type(u).__name__} {u!r:.60}, not an array, for a "
                "floating parameter; pass real floating updates (what the optimizer's update "
                "returns)"
            ) from None
        if tuple(u.shape) != tuple(p.shape):
            raise UpdateError(
                f"{where}: an update of shape {tuple(u.shape)} for a parameter of shape "
                f"{tuple(p.shape)}; updates must match their parameters exactly (broadcasting "
                "would change the parameter's shape): check the optimizer's output"
            )
        if not jax.dtypes.issubdtype(u.dtype, jnp.floating):
            raise UpdateError(
                f"{where}: an update of dtype {u.dtype} for a floating parameter; pass real "
                "floating updates (a complex update's imaginary part would be dropped)"
            )
        k = keys.get(i)
        try:
            out.append(_update_leaf(p, u, rounding, k))
        except (TypeError, ValueError) as err:
            raise type(err)(f"{where}: {err}") from err
    return jax.tree_util.tree_unflatten(treedef, out)


def _key_count(key: Any) -> int:
    """How many keys `key` holds: typed keys by their shape, raw uint32 data by its rows."""
    shape = tuple(key.shape)
    if str(key.dtype).startswith("key<"):
        return math.prod(shape)
    return math.prod(shape[:-1])


def _is_float_leaf(p: Any) -> bool:
    if isinstance(p, Tensor):
        return True
    dtype = getattr(p, "dtype", None)
    # jax.dtypes also reads extended dtypes (PRNG keys), which are not floating
    return dtype is not None and bool(jax.dtypes.issubdtype(dtype, jnp.floating))


def _rounds(p: Any) -> bool:
    """Whether updating `p` rounds into a narrower format (and so uses a key)."""
    if isinstance(p, Tensor):
        return p.is_reduced_precision
    return _is_float_leaf(p) and _native_format(np.dtype(p.dtype)) is not None


def _update_leaf(p: Any, u: jax.Array, rounding: str, key: jax.Array | None) -> Any:
    if isinstance(p, Tensor):
        total = logical_values(p) + u.astype(p.dtype)
        if not p.is_reduced_precision:
            return Tensor(total, dtype=p.dtype)
        return Tensor(total, dtype=p.dtype).to_reduced_precision(
            p.format, scaling=p.scaling, rounding=rounding, key=key
        )
    dtype = np.dtype(p.dtype)
    fmt = _native_format(dtype)
    if fmt is None:
        return (p + u.astype(dtype)).astype(dtype)
    # Add in float32, then round once into the parameter's own format: a
    # float32 sum of a narrow-format value and an update loses far less than
    # the final rounding, so the rounding mode decides what survives.
    total = p.astype(jnp.float32) + u.astype(jnp.float32)
    return fmt.round(total, rounding=rounding, key=key).astype(dtype)
