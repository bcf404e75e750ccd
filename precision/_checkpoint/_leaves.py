"""A tree's leaves as a checkpoint stores them, and back.

`flatten` walks a pytree of Tensors, `dtypes.Encoded` values and arrays into
(`Leaf` description, arrays) pairs, refusing what the file layout cannot hold
(PRNG keys, odd dict keys, encodings that break their invariants);
`unflatten` rebuilds nested dicts and lists from key paths.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import dtypes

from .._codes_layout import swapped
from .._errors import CheckpointError, SaveError, SaveTypeError
from ._invariants import violation
from ._layout import (
    _DTYPE_NAMES,
    _LOGICAL,
    ROLE_WORDS,
    ROLES,
    Leaf,
    file_dtype,
)
from ._names import check_limits, check_names, path_name

# --------------------------------------------------------------------------
# trees <-> leaves


_TENSOR: list[type[Any]] = []  # the Tensor class, once imported


def _tensor_type() -> type[Any]:
    if _TENSOR:
        return _TENSOR[0]
    from .. import _applied_operators  # noqa: F401  (Tensors `load` hands out need operators)
    from .._tensor import Tensor

    _TENSOR.append(Tensor)
    return Tensor


def _path_entry(entry: Any, tree_util: Any) -> tuple[str, Any]:
    if isinstance(entry, tree_util.DictKey):
        key = entry.key
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise SaveTypeError(
                f"cannot save a dict key {key!r} of type {type(key).__name__}: checkpoint keys "
                "must be strings or integers"
            )
        return ("key", key)
    if isinstance(entry, tree_util.SequenceKey):
        return ("index", entry.idx)
    if isinstance(entry, tree_util.GetAttrKey):
        return ("attr", entry.name)
    if isinstance(entry, tree_util.FlattenedIndexKey):
        return ("index", entry.key)
    raise SaveTypeError(f"cannot save a tree whose key path holds {entry!r}")


def _describe(
    path: tuple[tuple[str, Any], ...], leaf: Any, tensor_type: type[Any]
) -> tuple[Leaf, list[np.ndarray]]:
    """A leaf's storage description and its arrays (data first)."""
    name = path_name(path)
    if isinstance(leaf, tensor_type):
        leaf.check_holds_arrays(f"cannot save leaf {name!r}")
        enc, dtype = leaf.encoded, np.dtype(leaf.dtype)
        if leaf.layout is not None:  # held transposed: saved as the logical values lie
            enc = swapped(enc)
    elif isinstance(leaf, dtypes.Encoded):
        enc, dtype = leaf, np.dtype(np.float32)
    else:
        return _array_leaf(name, path, leaf)
    if dtype.name not in _LOGICAL:
        raise SaveTypeError(
            f"cannot save Tensor {name!r} of logical dtype {dtype}: a checkpoint holds "
            f"{' and '.join(_LOGICAL)} Tensors; convert it with .astype('float32') first"
        )
    fmt = enc.format
    ts_shape = () if enc.tensor_scale is None else tuple(enc.tensor_scale.shape)
    spec = Leaf.tensor(name, path, dtype, tuple(enc.shape), fmt, enc.scaling, ts_shape)
    arrays = []
    for role, array in zip(
        ROLES, (enc.data, enc.scale, enc.tensor_scale, enc.zero_point), strict=True
    ):
        if (array is None) != (role != "data" and getattr(spec, role) is None):
            raise SaveError(  # pragma: no cover - an Encoded no encoder builds
                f"cannot save {name!r}: its {fmt.name} encoding "
                f"{'lacks' if array is None else 'holds'} {ROLE_WORDS[role]}, which "
                f"{fmt.name} under {enc.scaling} does not have"
            )
        if array is not None:
            a = np.asarray(array)
            arrays.append(a.view(file_dtype(a.dtype)) if a.dtype not in _DTYPE_NAMES else a)
    check_limits([spec])
    for (aname, adtype, ashape), arr in zip(spec.arrays(), arrays, strict=True):
        if arr.dtype != adtype or tuple(arr.shape) != ashape:  # pragma: no cover - Encoded bug
            raise SaveError(
                f"leaf {name!r}: array {aname!r} is {arr.dtype}{list(arr.shape)}, expected "
                f"{adtype}{list(ashape)} for {fmt.name}"
            )
    for role, arr in zip(spec.roles(), arrays, strict=True):
        problem = violation(spec, role, arr)
        if problem is not None:
            raise SaveError(
                f"cannot save {name!r}: its {fmt.name} {ROLE_WORDS[role]}: the encoding "
                f"{problem}, which no encoder produces (load would refuse the file); re-encode "
                f"it from finite values with to_reduced_precision({fmt.name!r})"
            )
    return spec, arrays


def _array_leaf(
    name: str, path: tuple[tuple[str, Any], ...], leaf: Any
) -> tuple[Leaf, list[np.ndarray]]:
    """A plain array leaf's storage description and its one array; refused when it holds
    PRNG keys or a dtype a checkpoint does not store."""
    import jax

    dt = getattr(leaf, "dtype", None)
    if (
        dt is not None
        and not isinstance(leaf, np.ndarray)  # numpy holds no PRNG keys (and asks 1 us)
        and jax.dtypes.issubdtype(dt, jax.dtypes.prng_key)
    ):
        raise SaveTypeError(
            f"cannot save leaf {name!r}: it is a PRNG key ({dt}), not numbers; store its "
            "key data instead (jax.random.key_data(key), restored with "
            "jax.random.wrap_key_data), or leave the key out of the saved tree"
        )
    arr = np.asarray(leaf)
    if arr.dtype not in _DTYPE_NAMES:
        raise SaveTypeError(
            f"cannot save leaf {name!r} of type {type(leaf).__name__} and dtype {arr.dtype}: "
            f"a checkpoint holds Tensors and arrays of dtypes {sorted(map(str, _DTYPE_NAMES))}"
        )
    return Leaf(name, path, "array", arr.dtype, arr.shape), [arr]


def flatten(tree: Any) -> list[tuple[Leaf, list[np.ndarray]]]:
    """Every leaf of `tree` (Tensors, Encoded values and arrays) with its arrays."""
    tensor_type = _tensor_type()
    from jax import tree_util

    encoded = dtypes.Encoded
    leaf_types = (encoded, tensor_type)
    pairs = tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, leaf_types))[0]
    out = [
        _describe(tuple(_path_entry(e, tree_util) for e in path), leaf, tensor_type)
        for path, leaf in pairs
    ]
    check_names([spec for spec, _ in out])
    return out


def unflatten(items: list[tuple[tuple[tuple[str, Any], ...], Any]]) -> Any:
    """Rebuild nested dicts and lists from (key path, value) pairs."""
    if not items:
        return {}
    if any(not path for path, _ in items):
        if len(items) == 1:
            return items[0][1]
        raise CheckpointError("a leaf at the root cannot have siblings")
    kinds = {path[0][0] for path, _ in items}
    if len(kinds) > 1:
        raise CheckpointError(f"one level of the tree mixes key kinds {sorted(kinds)}")
    groups: dict[Any, list[tuple[Any, Any]]] = {}
    for path, value in items:
        groups.setdefault(path[0][1], []).append((path[1:], value))
    children = {
        # (a lone leaf is its own subtree: no call for each of 65,536 leaves)
        key: group[0][1] if len(group) == 1 and not group[0][0] else unflatten(group)
        for key, group in groups.items()
    }
    if kinds == {"index"}:
        if sorted(children) != list(range(len(children))):
            raise CheckpointError(
                f"list indices {sorted(children)!s:.200} are not 0..{len(children) - 1}"
            )
        return [children[i] for i in range(len(children))]
    return children
