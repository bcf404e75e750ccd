"""The temporary file a checkpoint is written to, then moved into place atomically.

`_TempFile` is flushed, fsynced and moved over the destination, and the
directory is fsynced; an error (or, on Linux, a killed process) leaves no
partial file behind and an existing destination untouched. What it promises:

* **mode**: a replaced file keeps its permission bits; a new one gets
  `0o666 & ~umask`, like any file the process creates;
* **exclusive create**: with `overwrite=False` the file is given its final
  name by a hard link (or `renameat2(RENAME_NOREPLACE)`), which fails if the
  name exists at that instant, so of two concurrent savers exactly one
  creates the file and the other gets `FileExistsError`;
* **no leftovers**: where the filesystem has no unnamed files (`O_TMPFILE`),
  the temporary file is named `.<name>.precision-tmp.<host>.<pid>.<random>`;
  a process killed while writing leaves it behind, and the next save into
  the same directory removes every such file whose process, on this host,
  is gone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat

from .._errors import SaveTypeError


def fsync_directory(directory: str) -> None:
    """fsync `directory`, so that a rename or link in it is on disk (where the
    platform and filesystem allow it: nothing is raised where they do not)."""
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
_MARK = ".precision-tmp."


def _node_name() -> str:
    """This machine's network name (`socket.gethostname`, without importing `socket`)."""
    if hasattr(os, "uname"):
        return os.uname().nodename
    import socket  # pragma: no cover - Windows

    return socket.gethostname()  # pragma: no cover


def host_tag() -> str:
    # Only characters that are safe in a file name and in the pattern below.
    return re.sub(r"[^A-Za-z0-9-]", "-", _node_name())[:64] or "host"


def _temp_name(directory: str, path: str) -> str:
    """A fresh hidden name beside `path` that says which process owns it."""
    token = os.urandom(6).hex()  # (`secrets.token_hex`, without importing hashlib)
    return os.path.join(
        directory, f".{os.path.basename(path)}{_MARK}{host_tag()}.{os.getpid()}.{token}"
    )


_STALE = re.compile(
    r"\..*" + re.escape(_MARK) + r"(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[0-9a-f]+"
)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def remove_stale(directory: str) -> list[str]:
    """Remove the temporary files of saves on this host whose process has died.

    Returns the paths removed. A file whose process is alive, or that was
    written on another host (a shared filesystem), is left alone.
    """
    removed: list[str] = []
    host = host_tag()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        match = _STALE.fullmatch(entry.name)
        if match is None or match["host"] != host:
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or pid_alive(pid):
            continue
        with contextlib.suppress(OSError):
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(entry.path)
    return removed


def umask() -> int:
    """The process umask, read without changing it where the kernel says it.

    Reading it with `os.umask` means setting it: a file another thread creates
    meanwhile (the command line's workers) would get the wrong permissions. Linux
    says it in /proc; elsewhere it is set and restored at once.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (not thread-safe, but brief)
    os.umask(mask)
    return mask


def _link_fd(fd: int, name: str) -> None:
    """Give the unnamed file open as `fd` the name `name` (EEXIST if it is taken)."""
    try:
        os.link(f"/proc/self/fd/{fd}", name, follow_symlinks=True)
        return
    except FileExistsError:
        raise
    except OSError as exc:
        first = exc
    # Some kernels refuse the /proc route (EXDEV); linkat(AT_EMPTY_PATH) needs
    # CAP_DAC_READ_SEARCH but works there.
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, at_empty_path = -100, 0x1000
    if libc.linkat(fd, b"", at_fdcwd, os.fsencode(name), at_empty_path) != 0:
        if ctypes.get_errno() == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), name)
        raise first


def rename_noreplace(src: str, dst: str) -> bool:
    """Rename `src` to `dst` unless `dst` exists (EEXIST); False where unsupported."""
    return _renameat2(src, dst, 1)  # RENAME_NOREPLACE


def rename_exchange(src: str, dst: str) -> bool:
    """Swap `src` and `dst` atomically (both must exist); False where unsupported."""
    return _renameat2(src, dst, 2)  # RENAME_EXCHANGE


def _renameat2(src: str, dst: str, flags: int) -> bool:
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), dst)


def _can_link(directory: str, device: int) -> bool:
    """Whether unnamed files on `device` can be given a name (probed once)."""
    if device not in _LINKABLE:
        ok = False
        probe = _temp_name(directory, "probe")
        try:
            fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o600)
            try:
                _link_fd(fd, probe)
                os.unlink(probe)
                ok = True
            except BaseException:  # an interrupt between the link and its removal too
                with contextlib.suppress(OSError):
                    os.unlink(probe)
                raise
            finally:
                os.close(fd)
        except OSError:
            pass
        _LINKABLE[device] = ok
    return _LINKABLE[device]


def refuse_special(path: str) -> None:
    """Refuse to replace what is not a regular file (a FIFO, a device such as
    /dev/null, a socket): a checkpoint written over it would replace it with a file."""
    try:
        st = os.stat(path)
    except OSError:
        return  # nothing there (or unreadable: the write says so)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise OSError(
            errno.EINVAL,
            f"cannot write {path}: it is not a regular file ({_kind(st.st_mode)}); name a file "
            "or a directory",
        )


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


# what to do when the data does not fit where it goes
_WRITE_FIXES = {
    errno.ENOSPC: "the disk is full; free space on it or write to another disk",
    errno.EDQUOT: "the disk quota is used up; free space or write elsewhere",
    errno.EFBIG: (
        "the file would pass a size limit (the shell's 'ulimit -f', or the largest file the "
        "file system holds, 4 GiB on FAT32); raise the limit, or write smaller files (the "
        "command line's --max-shard-size SIZE)"
    ),
}


def write_error(path: str, exc: OSError) -> OSError:
    """`exc`, met while writing `path`'s data, as an error naming the path and the fix.

    Raised by `write` itself, such an error names no file: a full disk, a quota,
    a size limit. Nothing has been left behind when it is raised.
    """
    fix = _WRITE_FIXES.get(exc.errno or 0, "")
    said = "; ".join(w for w in (exc.strerror, "nothing was written") if w)
    text = f"{fix} ({said})" if fix else said
    return type(exc)(exc.errno, f"cannot write {path}: {text}")


def _exists_error(path: str) -> FileExistsError:
    return FileExistsError(
        errno.EEXIST,
        f"{path} already exists; pass overwrite=True (--overwrite on the command line) to "
        "replace it",
        path,
    )


class _TempFile:
    """The file a checkpoint is written to before it is moved into place.

    On Linux it is an unnamed `O_TMPFILE` inode in the destination directory:
    if the process dies (even by SIGKILL) the kernel discards it, so no
    partial file is ever left behind. It gets a name only once its bytes are
    on disk. Elsewhere it is a hidden named file (see the module docstring
    for how a later save removes one that a killed process left).

    Args:
        path: the destination.
        overwrite: replace `path` if it exists (True), or create it only if
            no file has that name when the bytes are committed (False).

    Raises:
        SaveTypeError: `overwrite` is not a bool (`overwrite="no"` is truthy).
        OSError: no file can be created in the destination directory.
    """

    def __init__(self, path: str, *, overwrite: bool = True, mode: int | None = None):
        if not isinstance(overwrite, bool):
            raise SaveTypeError(
                f"overwrite must be True or False, got {type(overwrite).__name__} "
                f"{overwrite!r}; pass overwrite=True to replace an existing file"
            )
        self.path = path
        self.overwrite = overwrite
        self.new_mode = mode
        self.directory = os.path.dirname(os.path.abspath(path))
        self.name: str | None = None
        remove_stale(self.directory)
        try:
            fd = self._open_unnamed()
            if fd is None:
                self.name = _temp_name(self.directory, path)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                fd = os.open(self.name, flags, 0o600)
            self.fd: int = fd
        except OSError as exc:
            raise type(exc)(
                exc.errno,
                f"cannot write {path}: no file can be created in {self.directory} ({exc.strerror})",
            ) from None

    def _open_unnamed(self) -> int | None:
        if not hasattr(os, "O_TMPFILE"):
            return None
        try:
            fd = os.open(self.directory, os.O_TMPFILE | os.O_WRONLY, 0o600)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                return None  # the filesystem has no unnamed files: use a named one
            raise
        if _can_link(self.directory, os.fstat(fd).st_dev):
            return fd
        os.close(fd)
        return None

    def _mode(self) -> int:
        """The replaced file's permission bits, or those asked for a new file, or 0o666
        under the umask."""
        if self.overwrite:
            try:
                return os.stat(self.path).st_mode & 0o7777
            except OSError:
                pass
        if self.new_mode is not None:
            return self.new_mode & 0o7777
        return 0o666 & ~umask()

    def commit(self) -> None:
        """fsync the bytes, move the file to `path`, fsync the directory.

        Raises:
            FileExistsError: `overwrite` is False and `path` exists now.
        """
        os.fchmod(self.fd, self._mode())
        os.fsync(self.fd)
        if not self.overwrite:
            self._create_exclusive()
        else:
            if self.name is None:
                name = _temp_name(self.directory, self.path)
                _link_fd(self.fd, name)
                self.name = name
            os.replace(self.name, self.path)
            self.name = None
        fsync_directory(self.directory)

    def _create_exclusive(self) -> None:
        if self.name is None:  # unnamed: linking it is the exclusive create
            try:
                _link_fd(self.fd, self.path)
            except FileExistsError:
                raise _exists_error(self.path) from None
            return
        try:
            os.link(self.name, self.path)
        except FileExistsError:
            raise _exists_error(self.path) from None
        except OSError:  # no hard links here: an atomic no-replace rename, if the OS has one
            try:
                done = rename_noreplace(self.name, self.path)
            except FileExistsError:
                raise _exists_error(self.path) from None
            if not done:  # pragma: no cover - neither exists: the best that can be done
                if os.path.lexists(self.path):
                    raise _exists_error(self.path) from None
                os.rename(self.name, self.path)
            self.name = None
            return
        os.unlink(self.name)
        self.name = None

    def discard(self) -> None:
        """Remove whatever was written (an unnamed file vanishes on close)."""
        if self.name is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.name)
            self.name = None
