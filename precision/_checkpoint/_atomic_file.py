"""The temporary file a checkpoint is written to, then renamed into place atomically.

`_TempFile` is flushed, fsynced and renamed over the destination, and the
directory is fsynced; an error (or, on Linux, a killed process) leaves no
partial file behind and an existing destination untouched.
"""

from __future__ import annotations

import errno
import os
import tempfile


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


_LINKABLE: dict[int, bool] = {}


def _link_fd(fd: int, name: str) -> None:
    """Give the unnamed file open as `fd` the name `name`."""
    try:
        os.link(f"/proc/self/fd/{fd}", name, follow_symlinks=True)
        return
    except OSError as exc:
        first = exc
    # Some kernels refuse the /proc route (EXDEV); linkat(AT_EMPTY_PATH) needs
    # CAP_DAC_READ_SEARCH but works there.
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, at_empty_path = -100, 0x1000
    if libc.linkat(fd, b"", at_fdcwd, os.fsencode(name), at_empty_path) != 0:
        raise first


def _can_link(directory: str, device: int) -> bool:
    """Whether unnamed files on `device` can be given a name (probed once)."""
    if device not in _LINKABLE:
        ok = False
        probe = os.path.join(directory, f".precision-probe.{os.getpid()}.tmp")
        try:
            fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o600)
            try:
                _link_fd(fd, probe)
                os.unlink(probe)
                ok = True
            finally:
                os.close(fd)
        except OSError:
            pass
        _LINKABLE[device] = ok
    return _LINKABLE[device]


class _TempFile:
    """The file a checkpoint is written to before it is renamed into place.

    On Linux it is an unnamed `O_TMPFILE` inode in the destination directory:
    if the process dies (even by SIGKILL) the kernel discards it, so no
    partial file is ever left behind. It gets a name only once its bytes are
    on disk, for the atomic rename. Elsewhere it is a hidden `mkstemp` file
    that an error removes.
    """

    def __init__(self, path: str):
        self.path = path
        self.directory = os.path.dirname(os.path.abspath(path))
        self.name: str | None = None
        try:
            self.fd = self._open_unnamed()
            if self.fd is None:
                self.fd, self.name = tempfile.mkstemp(
                    prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=self.directory
                )
                os.fchmod(self.fd, 0o644)
        except OSError as exc:
            raise type(exc)(
                exc.errno,
                f"cannot write {path}: no file can be created in {self.directory} ({exc.strerror})",
            ) from None

    def _open_unnamed(self) -> int | None:
        if not hasattr(os, "O_TMPFILE"):
            return None
        try:
            fd = os.open(self.directory, os.O_TMPFILE | os.O_WRONLY, 0o644)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                return None  # the filesystem has no unnamed files: use a named one
            raise
        if _can_link(self.directory, os.fstat(fd).st_dev):
            return fd
        os.close(fd)
        return None

    def commit(self) -> None:
        """fsync the bytes, rename the file over `path`, fsync the directory."""
        os.fsync(self.fd)
        if self.name is None:
            name = os.path.join(
                self.directory, f".{os.path.basename(self.path)}.{os.getpid()}.{id(self):x}.tmp"
            )
            _link_fd(self.fd, name)
            self.name = name
        os.replace(self.name, self.path)
        self.name = None
        _fsync_dir(self.directory)

    def discard(self) -> None:
        """Remove whatever was written (an unnamed file vanishes on close)."""
        if self.name is not None:
            try:
                os.unlink(self.name)
            except FileNotFoundError:
                pass
            self.name = None
