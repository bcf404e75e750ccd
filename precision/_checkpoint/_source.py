"""A checkpoint on disk: one safetensors file, or the shards an index file lists.

A sharded checkpoint is what model hubs publish: `model-00001-of-00003.safetensors`
... plus `model.safetensors.index.json`, whose `weight_map` names the shard of
every tensor. `Source` opens either kind (a directory holding one index file or
one `.safetensors` file, an index file, or a file) and lists its leaves in
order; `load` and the command line read through it.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from .._errors import CheckpointError
from ._reader import Reader

__all__ = ["INDEX_SUFFIX", "Source"]

INDEX_SUFFIX = ".safetensors.index.json"


def _regular_file(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(2, f"No such file or directory: {path}") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise CheckpointError(f"{path} is {kind}; give a .safetensors file or a sharded directory")


class Source:
    """An open checkpoint: one safetensors file or the shards an index file lists.

    Attributes:
        path: what was given.
        sharded: whether it is a directory of shards (with an index file).
        index_name: the index file's name (sharded only).
        index_metadata: the index file's "metadata" object (sharded only).
        items: (reader, leaf) of every leaf, shard by shard, in file order.
        metadata: the source's own `__metadata__` entries (the first shard's),
            without the keys `precision` writes itself.
    """

    def __init__(self, path: str):
        self.path = path
        self.readers: list[Reader] = []
        self.sharded = False
        self.index_name: str | None = None
        self.index_metadata: dict[str, Any] = {}
        try:
            self._open(path)
        except BaseException:
            self.close()
            raise
        self.items = [(r, leaf) for r in self.readers for leaf in r.leaves]
        first = self.readers[0].metadata if self.readers else {}
        self.metadata = {
            k: v for k, v in first.items() if not k.startswith("precision") and k != "converted_by"
        }

    def _open(self, path: str) -> None:
        index = None
        if os.path.isdir(path):
            indexes = sorted(n for n in os.listdir(path) if n.endswith(INDEX_SUFFIX))
            files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
            if len(indexes) > 1:
                raise CheckpointError(
                    f"{path} holds {len(indexes)} index files ({', '.join(indexes)}); give the "
                    "one to convert"
                )
            if indexes:
                index = os.path.join(path, indexes[0])
            elif len(files) == 1:
                path = os.path.join(path, files[0])
            else:
                raise CheckpointError(
                    f"{path} is a directory without a *{INDEX_SUFFIX} file and "
                    f"{len(files)} .safetensors files; give a file or a sharded directory"
                )
        elif path.endswith(".index.json"):
            index = path
        if index is None:
            _regular_file(path)
            self.readers.append(Reader(path))
            return
        self._open_index(index)

    def _open_index(self, index: str) -> None:
        _regular_file(index)
        directory = os.path.dirname(os.path.abspath(index))
        try:
            with open(index, encoding="utf-8") as f:
                doc = json.load(f)
            weight_map = doc["weight_map"]
            if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
            ):
                raise ValueError("weight_map must map tensor names to file names")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{index}: not a safetensors index file ({exc})") from None
        meta = doc.get("metadata", {})
        self.index_metadata = dict(meta) if isinstance(meta, dict) else {}
        self.sharded = True
        self.index_name = os.path.basename(index)
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if os.path.basename(shard) != shard:
                raise CheckpointError(f"{index}: shard {shard!r} is not a file name in {directory}")
            path = os.path.join(directory, shard)
            _regular_file(path)
            self.readers.append(Reader(path))
        listed = {}
        for reader in self.readers:
            for name in reader.entries:
                listed[name] = os.path.basename(reader.path)
        missing = sorted(n for n, f in weight_map.items() if listed.get(n) != f)
        if missing:
            raise CheckpointError(
                f"{index}: {len(missing)} tensor(s) of the weight_map are not in the shard it "
                f"names (first: {missing[0]!r})"
            )

    @property
    def prefix(self) -> str:
        """The shard name prefix: "model" for model.safetensors.index.json."""
        if self.index_name:
            return self.index_name[: -len(INDEX_SUFFIX)] or "model"
        base = os.path.basename(self.path.rstrip("/"))
        return base[: -len(".safetensors")] if base.endswith(".safetensors") else "model"

    @property
    def nbytes(self) -> int:
        return sum(r.size for r in self.readers)

    def files(self) -> list[str]:
        return [r.path for r in self.readers]

    def close(self) -> None:
        for r in self.readers:
            r.close()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
