"""Where Tensors live: device checks, placement of storage, shardings of codes and scales.

A Tensor is placed as its logical values would be: its codes take the
sharding, its scales (and zero points) follow the data dimensions they belong
to, a tensor scale is replicated. Operations never move data implicitly;
`check_devices` refuses Tensors on different devices.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

import dtypes

from ._codes_layout import held_placement
from ._errors import DeviceMismatchError
from ._jax_compat import is_tracer
from ._storage import check_placement, is_placement, replicated, scale_sharding
from ._tensor import Tensor

__all__ = ["check_devices", "device_put", "storage_shardings"]


def _describe_devices(devs: frozenset[Any]) -> str:
    names = sorted(str(d) for d in devs)
    return names[0] if len(names) == 1 else "{" + ", ".join(names) + "}"


def check_devices(leaves: Any) -> None:
    """Raise `DeviceMismatchError` if concrete Tensors sit on different devices.

    Runs on every eager call, so the common cases stay cheap: the same
    sharding object, or equal shardings, before any device sets are built.
    """
    first = None
    for leaf in leaves:
        if not isinstance(leaf, Tensor):
            continue
        data = leaf.encoded.data
        if is_tracer(data) or not isinstance(data, jax.Array):
            continue
        sharding = data.sharding
        if first is None:
            first = sharding
            continue
        if sharding is first or sharding == first:
            continue
        a, b = frozenset(first.device_set), frozenset(sharding.device_set)
        if a != b:
            raise DeviceMismatchError(
                f"tensors on different devices: {_describe_devices(a)} and "
                f"{_describe_devices(b)}; nothing is moved implicitly, move one first, "
                f"e.g. b.to_device(a.device)"
            )


def _storage_sharding(t: Tensor, target: Any, where: str) -> tuple[Any, Any]:
    """(data sharding, scale sharding) for Tensor `t` placed like its logical values."""
    if t.layout is not None:
        target = held_placement(target, t.shape)
    if not isinstance(target, jax.sharding.NamedSharding):
        return target, target
    spec = list(target.spec) + [None] * (t.ndim - len(target.spec))
    if t.format.packed and t.ndim and spec[-1] is not None:
        names = spec[-1] if isinstance(spec[-1], tuple) else (spec[-1],)
        n = int(np.prod([target.mesh.shape[a] for a in names]))
        packed = t.encoded.data.shape[-1]
        if packed % n:
            raise DeviceMismatchError(
                f"{where}: the last axis of this {t.format.name} Tensor of shape {t.shape} is "
                f"packed into {packed} bytes, which {n} devices cannot split evenly (logical "
                f"length {t.shape[-1]}); shard another axis, or pad the last axis to a "
                f"multiple of {n * 8 // t.format.code_bits} values"
            )
    enc = t.encoded
    if enc.scale is None:
        return target, None
    return target, scale_sharding(target, enc.data, enc.scale)


def storage_shardings(tree: Any, shardings: Any) -> Any:
    """Shardings for the storage of `tree`, from shardings of its logical values.

    `shardings` has the structure of `tree` with one sharding per leaf, as for
    a tree of plain arrays (a Tensor leaf gets the sharding of its logical
    values). The result mirrors `tree` itself, Tensors included, so it can be
    given to `jax.jit(..., in_shardings=...)` or `jax.device_put`: each
    Tensor's codes take the sharding, its scales follow the data dimensions
    they belong to (replicated where a scale dimension is 1 or does not
    divide), and a packed last axis that the devices cannot split evenly is
    refused with the logical and packed sizes named.

    Raises:
        DeviceMismatchError: a packed last axis cannot be split as asked.

    Examples:
        >>> import jax
        >>> import numpy as np
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        >>> import precision
        >>> mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
        >>> tree = {"w": precision.Tensor(np.ones((4, 8))).to_reduced_precision("int4")}
        >>> out = precision.storage_shardings(tree, {"w": NamedSharding(mesh, P("x", None))})
        >>> type(out["w"]).__name__
        'Tensor'
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: isinstance(x, Tensor)
    )
    try:
        targets = treedef.flatten_up_to(shardings)  # type: ignore[attr-defined]  # no jaxlib stub
    except (ValueError, TypeError) as err:
        raise DeviceMismatchError(
            f"shardings must have the structure of the tree, one sharding per leaf; got {err}"
        ) from None
    out = []
    for (path, leaf), target in zip(flat, targets, strict=True):
        if isinstance(leaf, Tensor):
            where = jax.tree_util.keystr(path) or "<root>"
            data_s, scale_s = _storage_sharding(leaf, target, where)
            enc = leaf.encoded
            placed = dtypes.Encoded(
                data_s,
                scale_s,
                enc.format,
                enc.scaling,
                enc.packed_last,
                tensor_scale=None if enc.tensor_scale is None else replicated(target),
                zero_point=None if enc.zero_point is None else scale_s,
            )
            out.append(Tensor._make(placed, leaf.dtype, None, leaf.layout))
        else:
            out.append(target)
    return jax.tree_util.tree_unflatten(treedef, out)


def device_put(tree: Any, device_or_sharding: Any) -> Any:
    """Move every Tensor, array and numpy scalar leaf of `tree` to a device or sharding.

    `device_or_sharding` is one device or sharding for the whole tree, or a
    tree of them with the structure of `tree` (one per leaf, as for plain
    arrays); a Tensor's scales follow its data (see `storage_shardings`).

    Examples:
        >>> import jax
        >>> from precision import Tensor, device_put
        >>> tree = {"w": Tensor([1.0, 2.0]).to_reduced_precision(), "n": 3}
        >>> device_put(tree, jax.devices()[0])["w"].device == jax.devices()[0]
        True
        >>> cpu = jax.devices()[0]
        >>> device_put(tree, {"w": cpu, "n": None})["w"].device == cpu
        True
    """
    if is_placement(device_or_sharding) or device_or_sharding is None:
        targets = jax.tree_util.tree_map(
            lambda _: device_or_sharding, tree, is_leaf=lambda x: isinstance(x, Tensor)
        )
    else:
        targets = device_or_sharding
    flat, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: isinstance(x, Tensor))
    try:
        placements = treedef.flatten_up_to(targets)  # type: ignore[attr-defined]  # no jaxlib stub
    except (ValueError, TypeError) as err:
        raise DeviceMismatchError(
            "device_put: the placement must be one device or sharding, or a tree of them with "
            f"the structure of the tree; got {err}"
        ) from None
    out = []
    for leaf, target in zip(flat, placements, strict=True):
        if target is not None:
            check_placement(target, "device_put")
        if target is None:
            out.append(leaf)
        elif isinstance(leaf, Tensor):
            out.append(leaf.to_device(target))
        elif isinstance(leaf, jax.Array | np.ndarray | np.generic):
            # numpy scalars too (a step counter `np.int64(1200)`): as jax.device_put
            # places them, so that a tree placed for Orbax has a sharding on every leaf
            out.append(jax.device_put(leaf, target))
        else:
            out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out)
