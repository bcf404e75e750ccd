"""Sharded outputs of the command line: sizes, shard names and the index file.

A sharded checkpoint is what model hubs publish: `model-00001-of-00003.safetensors`
... plus `model.safetensors.index.json`, whose `weight_map` names the shard
of every tensor. `plan_shards` cuts an output into shards under a size limit,
`write_index` writes the index and `write_shards` both; reading either kind is `Source`
(`precision/_checkpoint/_source.py`), the commit `TempDirectory`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from .._checkpoint._io import write
from .._checkpoint._layout import Leaf
from .._checkpoint._source import INDEX_SUFFIX

DEFAULT_SHARD_BYTES = 5 * 10**9  # the shard size model hubs use by default


def leaf_nbytes(leaf: Leaf) -> int:
    return sum(int(dt.itemsize) * _prod(shape) for _, dt, shape in leaf.arrays())


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def plan_shards(leaves: list[Leaf], limit: int) -> list[list[int]]:
    """Indices of `leaves` per shard: in order, each shard under `limit` bytes of data.

    A leaf larger than the limit gets a shard of its own (a tensor is never
    split, as in the published checkpoints).
    """
    shards: list[list[int]] = [[]]
    size = 0
    for i, leaf in enumerate(leaves):
        n = leaf_nbytes(leaf)
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += n
    return shards


def shard_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_index(
    path: str, weight_map: dict[str, str], total_size: int, metadata: dict[str, Any]
) -> None:
    """The index file of a sharded checkpoint (fsynced: it is part of the commit)."""
    doc = {
        "metadata": {**metadata, "total_size": total_size},
        "weight_map": dict(sorted(weight_map.items())),
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def write_shards(
    directory: str,
    prefix: str,
    leaves: list[Leaf],
    arrays: Iterator[Any],
    limit: int,
    *,
    metadata: dict[str, str],
    index_metadata: dict[str, Any],
    mode: int | None = None,
    plain: bool = False,
) -> int:
    """Write `leaves` into `directory` as shards of at most `limit` bytes each, and their
    index; `arrays` yields every leaf's arrays in order. The bytes of the shards."""
    groups = plan_shards(leaves, limit)
    names = shard_names(prefix, len(groups))
    weight_map: dict[str, str] = {}
    size = total = 0
    for name, group in zip(names, groups, strict=True):
        members = [leaves[i] for i in group]
        count = sum(len(leaf.arrays()) for leaf in members)
        pieces = (next(arrays) for _ in range(count))
        size += write(
            os.path.join(directory, name),
            members,
            pieces,
            overwrite=False,
            metadata=metadata,
            mode=mode,
            plain=plain,
        )
        for leaf in members:
            for array, _, _ in leaf.arrays():
                weight_map[array] = name
            total += leaf_nbytes(leaf)
    write_index(
        os.path.join(directory, f"{prefix}{INDEX_SUFFIX}"), weight_map, total, index_metadata
    )
    return size
