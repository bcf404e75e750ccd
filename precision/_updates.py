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
from ._narrowing import X64_FIX, narrowing
from ._tensor import Tensor, logical_values
from ._tree import is_tensor

__all__ = ["apply_updates"]


def _native_format(dtype: np.dtype) -> dtypes.Format | None:
    """The registered format of a narrow native float dtype (bfloat16, float16, fp8)."""
    for fmt in dtypes.FORMATS.values():
        native = getattr(fmt, "native_dtype", None)
        # `np.dtype("float64") == None` is True (numpy reads None as float64): without
        # the `is not None`, float64 parameters were rounded into tf32 (no native dtype).
        if native is not None and native == dtype and not fmt.is_full_precision:
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
    - A float32/float64 (or complex) array or full-precision Tensor is added
      to exactly as in any optimizer library.
    - A Python float parameter becomes a JAX scalar array of the sum.
    - A `None` update leaves the leaf unchanged.
    - A non-floating parameter (an integer counter or index, a bool, a PRNG
      key) is left unchanged by a float0 update (what
      `jax.grad(..., allow_int=True)` gives it) or an integer one. A floating
      update for it is refused (`UpdateError`): added and cast back, as
      `optax.apply_updates` does, a step below 1 truncates to nothing; skipped,
      it would be lost without a word.

    `updates` has the structure of `params` (what any Optax optimizer's
    `update` returns); its leaves may be arrays or Tensors. With
    `jax_enable_x64` off, numpy float64 leaves are added in float32 (as JAX
    does everywhere); a concrete value that float32 cannot hold (finite past
    ±3.4e38, which would become inf) is refused, naming the leaf.

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
            (`RoundingError`).
        UpdateError: (a `ValueError`) trees whose structures do not match (a
            subtree of updates where params hold one leaf included); an
            update whose shape differs from its parameter's, or that is not
            real floating or not an array at all; a floating update for a
            non-floating parameter; a parameter with an update that is not a
            number; a concrete value 32-bit JAX cannot hold.

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
        name = jax.tree_util.keystr(path)
        where = name or "<root>"
        if u is not None and not _is_leaf(u):  # a subtree where params hold one leaf
            raise UpdateError(
                f"updates must have the structure of params; params is {treedef}, updates is "
                f"{jax.tree_util.tree_structure(updates, is_leaf=is_tensor)}: updates{name} is "
                f"{type(u).__name__} {u!r:.60} where params{name} is one leaf"
            )
        if u is None or not _takes_update(name, p, u):
            out.append(p)
            continue
        p, u = _param_and_update(name, p, u)
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


def _param_and_update(name: str, p: Any, u: Any) -> tuple[Any, jax.Array]:
    """A parameter and its update (at key path `name`) as `_update_leaf` takes them: a
    Python number as a JAX scalar, the update as an array of its logical values; refused
    unless the update is real floating (complex for a complex parameter), both hold
    values 32-bit JAX keeps, and the shapes match."""
    where = name or "<root>"
    kind = _kind(u)
    if kind is None or kind not in ("fc" if _kind(p) == "c" else "f"):
        shown = (
            f"that is {type(u).__name__} {u!r:.60}, not an array,"
            if kind in (None, "O", "S", "U")
            else _described(u)
        )
        raise UpdateError(
            f"{where}: an update {shown} for a parameter {_described(p)}; pass real "
            "floating updates (what the optimizer's update returns; a complex update's "
            "imaginary part would be dropped)"
        )
    for tree, leaf in (("params", p), ("updates", u)):
        problem = narrowing(leaf)
        if problem is not None:
            raise UpdateError(f"{tree}{name} {problem}; {X64_FIX}")
    if isinstance(p, float | complex):  # a Python number: a JAX scalar of the sum
        p = jnp.asarray(p)
    u = jnp.asarray(logical_values(u) if isinstance(u, Tensor) else u)
    if tuple(u.shape) != tuple(p.shape):
        raise UpdateError(
            f"{where}: an update of shape {tuple(u.shape)} for a parameter of shape "
            f"{tuple(p.shape)}; updates must match their parameters exactly (broadcasting "
            "would change the parameter's shape): check the optimizer's output"
        )
    return p, u


def _is_float_leaf(p: Any) -> bool:
    """A parameter that takes updates: a Tensor, a real floating or complex array or number."""
    if isinstance(p, Tensor | float | complex):
        return True
    dtype = getattr(p, "dtype", None)
    # jax.dtypes also reads extended dtypes (PRNG keys), which are not floating
    return dtype is not None and bool(jax.dtypes.issubdtype(dtype, jnp.inexact))


def _is_leaf(u: Any) -> bool:
    """One update leaf (an array, a number, a Tensor), not a container of them."""
    leaves = jax.tree_util.tree_leaves(u, is_leaf=is_tensor)
    return len(leaves) == 1 and leaves[0] is u


def _kind(x: Any) -> str | None:
    """numpy's dtype kind of a leaf ("f" for a Tensor or a narrow float); None if it has none."""
    if isinstance(x, Tensor):
        return "f"
    for python, kind in ((bool, "b"), (int, "i"), (float, "f"), (complex, "c")):
        if isinstance(x, python):
            return kind
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return None
    if jax.dtypes.issubdtype(dtype, jnp.inexact):
        return "c" if jax.dtypes.issubdtype(dtype, jnp.complexfloating) else "f"
    return str(getattr(dtype, "kind", "V"))


def _takes_update(name: str, p: Any, u: Any) -> bool:
    """Whether parameter `p` is updated by `u` (not None); refuses what cannot be either.

    A non-floating parameter (an integer counter or index, a bool, a PRNG key)
    keeps its value under a float0 update (what `jax.grad(..., allow_int=True)`
    gives it) or an integer one. A floating update is refused: adding it would
    truncate the step to an integer (what `optax.apply_updates` does, so 0.5
    steps never move it), and skipping it would drop it without a word.
    """
    if _is_float_leaf(p):
        return True
    where = name or "<root>"
    p_kind, u_kind = _kind(p), _kind(u)
    if p_kind is None or p_kind in "OSU":
        raise UpdateError(
            f"params{name} is {type(p).__name__} {p!r:.60}, not a number, yet has an update; "
            "parameters are arrays: give this leaf the update None, or keep it out of params"
        )
    if u_kind is None or u_kind in "OSU":
        raise UpdateError(
            f"{where}: an update that is {type(u).__name__} {u!r:.60}, not an array, for a "
            f"parameter {_described(p)}; pass None (it keeps its value) or an array"
        )
    if u_kind in "fc":
        raise UpdateError(
            f"{where}: a floating update {_described(u)} for a parameter {_described(p)}, "
            "which cannot take it: truncated to an integer, a step below 1 would never move "
            "it. Give the leaf no update (None, or the float0 gradient that "
            "jax.grad(..., allow_int=True) gives it), or hold the parameter in a float dtype "
            "(p.astype(jnp.float32))"
        )
    return False


def _described(x: Any) -> str:
    """`that is the Python int 3`, `of dtype int32`: an update or a parameter, for messages."""
    if isinstance(x, bool | int | float | complex):
        return f"that is the Python {type(x).__name__} {x!r:.40}"
    return f"of dtype {getattr(x, 'dtype', type(x).__name__)}"


def _rounds(p: Any) -> bool:
    """Whether updating `p` rounds into a narrower format (and so uses a key)."""
    if isinstance(p, Tensor):
        return p.is_reduced_precision
    if isinstance(p, float | complex):
        return False
    return _is_float_leaf(p) and _native_format(np.dtype(p.dtype)) is not None


def _update_leaf(p: Any, u: jax.Array, rounding: str, key: jax.Array | None) -> Any:
    if isinstance(p, Tensor):
        total = logical_values(p) + u.astype(p.dtype)
        if not p.is_reduced_precision:
            return Tensor(total, dtype=p.dtype)
        return Tensor(total, dtype=p.dtype).to_reduced_precision(
            p.format, scaling=p.scaling, rounding=rounding, key=key, layout=p.layout
        )
    p = jnp.asarray(p)  # a numpy float64 becomes float32 without x64, as JAX does anywhere
    dtype = np.dtype(p.dtype)
    fmt = _native_format(dtype)
    if fmt is None:
        return (p + u.astype(dtype)).astype(dtype)
    # Add in float32, then round once into the parameter's own format: a
    # float32 sum of a narrow-format value and an update loses far less than
    # the final rounding, so the rounding mode decides what survives.
    total = p.astype(jnp.float32) + u.astype(jnp.float32)
    return fmt.round(total, rounding=rounding, key=key).astype(dtype)
