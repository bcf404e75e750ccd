"""The hidden directory a sharded conversion is written to, and how it takes its place.

It is named `.OUT.precision-dir.HOST.PID.RANDOM.tmp` beside `OUT`. Committing
over an existing `OUT` swaps the two atomically (`renameat2(RENAME_EXCHANGE)`),
so `OUT` always exists: the old one is then under the temporary name and is
removed. Where the swap is not available, `OUT` is first renamed aside to
`.OUT.precision-dir.HOST.PID.RANDOM.old`, then the new one into place; a kill
between those two renames leaves `OUT` missing and the input only under the
`.old` name. Either way `recover_leftovers`, run by the next conversion to
`OUT`, finds what a dead process of this host left: an `.old` whose `OUT` is
missing is renamed back (the interrupted conversion never finished), every
other leftover is removed, and it says what it did.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile

from .._checkpoint._atomic_file import (
    fsync_directory,
    host_tag,
    pid_alive,
    rename_exchange,
    rename_noreplace,
    umask,
)
from ._interrupts import deferred_interrupts, recorded_only

__all__ = ["TempDirectory", "recover_leftovers"]

_MARK = ".precision-dir."
_LEFTOVER = re.compile(
    r"\.(?P<base>.+)" + re.escape(_MARK) + r"(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\."
    r"[A-Za-z0-9_]+\.(?P<role>tmp|old)"
)


def _prefix(path: str) -> str:
    return f".{os.path.basename(path)}{_MARK}{host_tag()}.{os.getpid()}."


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def recover_leftovers(path: str) -> list[str]:
    """Put back or remove what interrupted conversions to `path` left; one line each."""
    path = os.path.abspath(path)
    parent, base = os.path.dirname(path), os.path.basename(path)
    try:
        entries = sorted(os.scandir(parent), key=lambda e: e.name)
    except OSError:
        return []
    found = []
    for entry in entries:
        match = _LEFTOVER.fullmatch(entry.name)
        if match is None or match["base"] != base or match["host"] != host_tag():
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or pid_alive(pid):
            continue  # a conversion still running
        found.append((match["role"] != "old", entry.path, pid))
    said = []
    for is_tmp, leftover, pid in sorted(found):  # every .old before any .tmp
        if not is_tmp and not os.path.lexists(path):
            os.rename(leftover, path)
            said.append(
                f"restored {path} from {os.path.basename(leftover)}: conversion {pid} was "
                "interrupted before the converted checkpoint took its place"
            )
        else:
            _remove(leftover)
            what = "the replaced input" if not is_tmp else "an unfinished or replaced output"
            said.append(f"removed {os.path.basename(leftover)} ({what} of conversion {pid})")
    return said


class TempDirectory:
    """A hidden directory beside `path`, put in its place by `commit`, removed by `discard`."""

    def __init__(self, path: str, *, overwrite: bool = True, mode: int | None = None):
        self.path = os.path.abspath(path)
        self.overwrite = overwrite
        parent = os.path.dirname(self.path)
        # A SIGINT while the directory is made is held for the caller's next check, inside
        # the `try` that discards it: raised here, it left the directory behind.
        with recorded_only():
            try:
                self.name = tempfile.mkdtemp(prefix=_prefix(self.path), suffix=".tmp", dir=parent)
            except OSError as exc:
                raise type(exc)(
                    exc.errno, f"cannot write {path}: no directory can be created in {parent}"
                ) from None
            os.chmod(self.name, 0o777 & ~umask() if mode is None else mode)

    def commit(self) -> None:
        """Put the directory in place of `path`: replacing what is there under
        `overwrite`, else only if nothing has that name now (FileExistsError)."""
        with deferred_interrupts():
            if not self.overwrite:
                self._create_exclusive()
            elif os.path.lexists(self.path) and rename_exchange(self.name, self.path):
                fsync_directory(os.path.dirname(self.path))  # `name` now holds the old one
            elif os.path.lexists(self.path):
                old = self.name[: -len(".tmp")] + ".old"
                os.rename(self.path, old)
                os.rename(self.name, self.path)
                fsync_directory(os.path.dirname(self.path))
                self.name = old
            else:
                os.rename(self.name, self.path)
                fsync_directory(os.path.dirname(self.path))
                self.name = ""
        if self.name:
            _remove(self.name)

    def _create_exclusive(self) -> None:
        exists = FileExistsError(
            errno.EEXIST,
            f"{self.path} appeared while converting and was kept; pass --overwrite to replace it",
            self.path,
        )
        try:
            done = rename_noreplace(self.name, self.path)
        except FileExistsError:
            raise exists from None
        if not done:  # pragma: no cover - no renameat2: the best that can be done
            if os.path.lexists(self.path):
                raise exists
            os.rename(self.name, self.path)
        fsync_directory(os.path.dirname(self.path))
        self.name = ""

    def discard(self) -> None:
        if self.name:
            shutil.rmtree(self.name, ignore_errors=True)
