"""What a checkpoint file must be before its header is trusted: a regular file,
strict JSON (no duplicate keys, no NaN constants, a bounded number of values),
and data that fits the memory there is; a file of another format is named by its
first bytes (`other_format`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

from .._errors import CheckpointError


def _strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)  # (built in C: a header of 65,536 entries parses 131,073 objects)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise CheckpointError(f"duplicate key {key!r}")
            seen.add(key)
    return out


def _no_constants(token: str) -> Any:
    raise CheckpointError(f"{token} is not allowed")


def parse_json(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_strict_object, parse_constant=_no_constants)


def json_tokens(raw: bytes | str) -> int:
    """An upper bound on the JSON values in `raw`, without parsing it."""
    if isinstance(raw, str):
        return raw.count(",") + raw.count("[") + raw.count("{")
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{")


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def available_memory() -> int | None:
    """Bytes of memory the kernel says a new allocation can use (MemAvailable), else
    the physical memory, else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return physical_memory()


def open_regular(path: str) -> Any:
    """`open(path, "rb")` of a regular file; anything else is refused before a read
    could block (a FIFO waits for a writer forever) or mean nothing (a device)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(
                errno.EISDIR, f"{path} is a directory: name its checkpoint file", path
            )
        if not stat.S_ISREG(mode):
            raise CheckpointError(
                f"{path} is not a regular file (a FIFO, device or socket): a checkpoint is a "
                "file; copy it to one first"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


#: The first bytes of the files people most often mistake for safetensors, and what to do.
_MAGIC = (
    (
        b"PK\x03\x04",
        "a zip archive: a numpy .npz, or a PyTorch .bin/.pt checkpoint. Save its arrays "
        "as safetensors first: safetensors.numpy.save_file(dict(np.load(path)), "
        "'model.safetensors'), or for PyTorch's "
        "safetensors.torch.save_file(torch.load(path), 'model.safetensors')",
    ),
    (
        b"\x93NUMPY",
        "a numpy .npy array. Save it as safetensors first: "
        "safetensors.numpy.save_file({'name': np.load(path)}, 'model.safetensors')",
    ),
    (
        b"GGUF",
        "a GGUF file (llama.cpp's): precision.load and `precision report` read it, "
        "`precision convert` writes it but takes safetensors",
    ),
    (
        b"\x89HDF",
        "an HDF5 file (Keras .h5). Save its arrays as safetensors first",
    ),
)


def other_format(head: bytes) -> str | None:
    """What a file starting with `head` is, if it is a format mistaken for safetensors."""
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return (
            "a Python pickle (a PyTorch checkpoint of the old format). Save its tensors as "
            "safetensors first: safetensors.torch.save_file(torch.load(path), "
            "'model.safetensors')"
        )
    return next((what for magic, what in _MAGIC if head.startswith(magic)), None)
