"""The one way the bot touches places a kernel can write: no links followed, no path reopened.

A kernel may change anything in its workspace and run dir at any moment: swap a file for a
symlink to ``/proc/self/environ`` between the bot's check and its read, plant a FIFO that
blocks an ``open``, or a link to ``/dev/zero`` that never ends. So the bot never reads or
writes such a place by path. Every access here:

* starts from a directory file descriptor the bot opened itself (:func:`open_dir`);
* resolves the relative name with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
  RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`` where the kernel has it, else component by
  component with ``O_NOFOLLOW`` (a symlink anywhere in the name is refused, not followed);
* opens with ``O_NONBLOCK | O_NOCTTY`` (a FIFO or device cannot block or take the bot's
  terminal) and checks with ``fstat`` that it holds a regular file;
* reads a bounded amount, with ``pread`` from the descriptor it checked: what is read is the
  file that was checked, whatever the kernel renames afterwards.

:class:`PinnedFile` is what the rest of the bot passes around: an open, checked regular
file with its size. Adapters get readers over it (:meth:`PinnedFile.reader`), never a path.
"""

from __future__ import annotations

import ctypes
import errno
import io
import itertools
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kernels.seam.result import UnsafePathError

_SYS_OPENAT2 = 437  # the same number on every architecture (added after the syscall table unification)
_RESOLVE_NO_XDEV = 0x01
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_XDEV
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Upper bound on entries looked at by one walk (listing, usage, diff).
MAX_WALK_ENTRIES = 20_000
_COPY_CHUNK = 1 << 20


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _openat2(dir_fd: int, relative: str, flags: int) -> int:
    how = _OpenHow(flags=flags, mode=0, resolve=_RESOLVE)
    fd = _libc.syscall(_SYS_OPENAT2, dir_fd, os.fsencode(relative), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), relative)
    return int(fd)


def _has_openat2() -> bool:
    """Whether this kernel (and seccomp profile) lets us call ``openat2``."""
    try:
        os.close(_openat2(-100, ".", _DIR_FLAGS))  # -100: AT_FDCWD
    except OSError as exc:
        return exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL)
    return True


#: ``openat2`` is used where it exists; else the per-component ``O_NOFOLLOW`` walk.
HAS_OPENAT2 = _has_openat2()


def _components(relative: str) -> list[str]:
    if not relative or "\x00" in relative or relative.startswith("/"):
        raise UnsafePathError(f"not a relative path: {relative!r}")
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise UnsafePathError(f"not a path beneath its folder: {relative!r}")
    return parts


def _open_beneath(dir_fd: int, relative: str, flags: int) -> int:
    """An fd for ``relative`` beneath ``dir_fd``; raises :class:`UnsafePathError` for a link or an escape."""
    parts = _components(relative)
    try:
        if HAS_OPENAT2:
            return _openat2(dir_fd, "/".join(parts), flags)
        return _walk_open(dir_fd, parts, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR, errno.EMLINK):
            raise UnsafePathError(f"{relative!r} is or passes through a link") from None
        raise


def _walk_open(dir_fd: int, parts: list[str], flags: int) -> int:
    current = dir_fd
    try:
        for part in parts[:-1]:
            step = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            if current != dir_fd:
                os.close(current)
            current = step
        return os.open(parts[-1], flags, dir_fd=current)
    finally:
        if current != dir_fd:
            os.close(current)


def open_dir(path: Path | str) -> int:
    """A read-only fd of the folder ``path`` (its last component must not be a link).

    ``path`` itself is the bot's (a workspace or run dir it made); only what lies beneath it
    is the kernel's.
    """
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(f"{path} is not a plain folder") from None
        raise


def open_subdir(dir_fd: int, relative: str) -> int:
    """A read-only fd of the folder ``relative`` beneath ``dir_fd`` (no link anywhere)."""
    return _open_beneath(dir_fd, relative, _DIR_FLAGS)


class _PreadRaw(io.RawIOBase):
    """A raw reader over a shared fd with its own position: ``pread`` only, at most ``size`` bytes."""

    def __init__(self, fd: int, size: int) -> None:
        super().__init__()
        self._fd = fd
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self._size - self._pos)
        if want <= 0:
            return 0
        data = os.pread(self._fd, want, self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        # The fd belongs to the PinnedFile; closing a reader never closes it.
        super().close()


class PinnedFile:
    """An open regular file found beneath a folder without following links.

    ``size`` is the size seen when it was opened; every read stops there, so a file the
    kernel keeps growing cannot make a read unbounded. Close it (or use ``with``) when done.
    """

    def __init__(self, fd: int, name: str, size: int) -> None:
        self.fd = fd
        self.name = name
        self.size = size

    def read(self, limit: int | None = None) -> bytes:
        """(Blocking) the first ``min(size, limit)`` bytes."""
        want = self.size if limit is None else min(self.size, limit)
        chunks: list[bytes] = []
        offset = 0
        while offset < want:
            chunk = os.pread(self.fd, min(want - offset, _COPY_CHUNK), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def tail(self, max_bytes: int) -> bytes:
        """(Blocking) the last ``max_bytes`` bytes (of the first ``size``)."""
        start = max(0, self.size - max_bytes)
        return os.pread(self.fd, self.size - start, start)

    def reader(self) -> BinaryIO:
        """A fresh buffered reader from the start (its own position; closing it keeps the file open)."""
        return io.BufferedReader(_PreadRaw(self.fd, self.size))

    def copy_into(self, target_fd: int) -> int:
        """(Blocking) copy the file's first ``size`` bytes to ``target_fd``; returns bytes copied."""
        offset = 0
        while offset < self.size:
            chunk = os.pread(self.fd, min(self.size - offset, _COPY_CHUNK), offset)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(target_fd, view) :]
            offset += len(chunk)
        return offset

    def close(self) -> None:
        """Release the descriptor (idempotent)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> PinnedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            self.close()


def pin(fd: int, name: str) -> PinnedFile:
    """Wrap an fd the bot opened itself after checking that it is a regular file (closes it otherwise)."""
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePathError(f"{name!r} is not a regular file")
    return PinnedFile(fd, name, st.st_size)


def open_file_at(dir_fd: int, relative: str) -> PinnedFile:
    """(Blocking) open the regular file ``relative`` beneath ``dir_fd`` for reading.

    Raises :class:`UnsafePathError` for a link anywhere in the name, an escape, or anything
    but a regular file (FIFO, socket, device, folder); ``FileNotFoundError`` when it is gone.
    """
    return pin(_open_beneath(dir_fd, relative, _READ_FLAGS), relative)


def open_file(root: Path | str, relative: str) -> PinnedFile:
    """(Blocking) :func:`open_file_at` starting from the folder ``root``."""
    dir_fd = open_dir(root)
    try:
        return open_file_at(dir_fd, relative)
    finally:
        os.close(dir_fd)


def tail_file(root: Path | str, relative: str, max_bytes: int) -> bytes:
    """(Blocking) at most the last ``max_bytes`` of a regular file beneath ``root``; ``b""``
    when it is missing or not a regular file (a FIFO, a link)."""
    try:
        with open_file(root, relative) as pinned:
            return pinned.tail(max_bytes)
    except (OSError, UnsafePathError):
        return b""


def create_file_at(dir_fd: int, name: str, mode: int = 0o644) -> int:
    """(Blocking) create the new file ``name`` in ``dir_fd`` for reading and writing; never
    follows or replaces anything there (``FileExistsError`` when the name is taken, by a link too)."""
    if not name or "/" in name or name in (".", ".."):
        raise UnsafePathError(f"not a file name: {name!r}")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    return os.open(name, flags, mode, dir_fd=dir_fd)


def walk(root: Path | str, *, limit: int = MAX_WALK_ENTRIES) -> Iterator[tuple[str, os.stat_result]]:
    """(Blocking) regular files beneath ``root`` as (relative posix path, lstat), depth first.

    Folders are entered through descriptors with ``O_NOFOLLOW``: a folder swapped for a link
    while walking is skipped, never followed. At most ``limit`` entries are looked at.
    """
    try:
        top = open_dir(root)
    except (OSError, UnsafePathError):
        return
    for rel, _dir_fd, _name, st in _entries(top, limit):
        if stat.S_ISREG(st.st_mode):
            yield rel, st


def _entries(top: int, limit: int) -> Iterator[tuple[str, int, str, os.stat_result]]:
    """Every entry beneath the folder fd ``top`` (which this closes) as (rel, parent fd, name, lstat)."""
    seen = 0
    stack: list[tuple[str, int]] = [("", top)]
    try:
        while stack:
            rel_dir, dir_fd = stack.pop()
            try:
                with os.scandir(dir_fd) as it:  # never more names in memory than the walk may look at
                    names = [entry.name for entry in itertools.islice(it, max(limit - seen, 0) + 1)]
            except OSError:
                os.close(dir_fd)
                continue
            try:
                for name in names:
                    seen += 1
                    if seen > limit:
                        return
                    try:
                        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    except OSError:
                        continue
                    rel = f"{rel_dir}/{name}" if rel_dir else name
                    yield rel, dir_fd, name, st
                    if stat.S_ISDIR(st.st_mode):
                        try:
                            stack.append((rel, os.open(name, _DIR_FLAGS, dir_fd=dir_fd)))
                        except OSError:
                            continue  # replaced by a link or removed meanwhile
            finally:
                os.close(dir_fd)
    finally:
        for _, dir_fd in stack:
            os.close(dir_fd)


@dataclass(frozen=True)
class Scan:
    """One walk of a folder: its regular files (relative posix path → lstat), their bytes, and
    how many entries the walk looked at (``limit + 1`` at most: above ``limit`` means more)."""

    files: dict[str, os.stat_result]
    bytes: int
    entries: int


def scan(root: Path | str, *, limit: int = MAX_WALK_ENTRIES) -> Scan:
    """(Blocking) walk ``root`` once (as :func:`walk`) for its files, their size and the entry count."""
    files: dict[str, os.stat_result] = {}
    entries = 0
    try:
        top = open_dir(root)
    except (OSError, UnsafePathError):
        return Scan(files, 0, 0)
    for rel, _, _, st in _entries(top, limit + 1):
        entries += 1
        if stat.S_ISREG(st.st_mode):
            files[rel] = st
    return Scan(files, sum(st.st_size for st in files.values()), entries)


def chown_tree(root: Path | str, uid: int, gid: int, *, limit: int = 1_000_000) -> None:
    """(Blocking) give ``root`` and everything beneath it to ``uid``/``gid`` without following a link."""
    top = open_dir(root)
    os.fchown(top, uid, gid)
    for _, dir_fd, name, _ in _entries(top, limit):
        try:
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
