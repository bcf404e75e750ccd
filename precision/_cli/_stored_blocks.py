"""One stored array of a checkpoint read in blocks of values, into one reused buffer."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np

from .._checkpoint._reader import Reader, aligned_empty
from . import _convert_modes as _modes

__all__ = ["_Blocks"]


class _Blocks:
    """The raw values of one stored array, read in blocks into one reused buffer.

    The reader's CRC-32 (files written by `save`) is checked after the last
    block, so a caller writing what it computed must discard it then (the
    writer does, by raising through).
    """

    def __init__(self, reader: Reader, name: str):
        self.reader, self.name = reader, name
        self.entry = reader.entries[name]

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.blocks(_modes._BLOCK)

    def blocks(self, values: int, pad: bool = False) -> Iterator[np.ndarray]:
        """Flat blocks of `values` values; the last one zero-padded to full size when `pad`."""
        entry, reader = self.entry, self.reader
        dtype = entry.dtype
        total = int(np.prod(entry.shape, dtype=np.int64))
        buf = aligned_empty((min(values, max(total, 1)) if not pad else values,), dtype)
        crc = 0
        with open(reader.path, "rb", buffering=0) as f:
            for start in range(0, total, values):
                n = min(values, total - start)
                view = buf[:n].view(np.uint8).data
                reader.fill(f, entry.begin + start * dtype.itemsize, view, self.name)
                if reader.crc is not None:
                    crc = zlib.crc32(view, crc)
                del view
                if pad and n < len(buf):
                    buf[n:] = 0
                    yield buf
                else:
                    yield buf[:n]
        reader.check_crc(self.name, crc)
