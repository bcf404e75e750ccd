"""Sharded outputs of the command line: sizes, shard names and the index file.

A sharded checkpoint is what model hubs publish: `model-00001-of-00003.safetensors`
... plus `model.safetensors.index.json`, whose `weight_map` names the shard
of every tensor. `plan_shards` cuts an output into shards under a size limit
and `write_index` writes the index; reading either kind is `Source`
(`precision/_checkpoint/_source.py`), the commit `TempDirectory`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .._checkpoint._layout import Leaf

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
