"""Per-thread workspace folders: safe uploads with quotas, listing, reading, diffing.

A workspace is the kernel's working directory. Its folder name is a hash of the thread
key, never user text. The kernel may change anything beneath it at any moment, so every
read, write, listing and diff goes through :mod:`kernels.host.safefs`: directory descriptors,
no link followed anywhere in a name, regular files only, bounded reads.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import shutil
import stat
import time
import unicodedata
from collections.abc import AsyncIterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from kernels.host import safefs
from kernels.host.safefs import MAX_WALK_ENTRIES, PinnedFile
from kernels.seam.result import QuotaError, UnsafePathError

log = logging.getLogger(__name__)

__all__ = [
    "MAX_WALK_ENTRIES",
    "STATE_DIR",
    "FileInfo",
    "FileStamps",
    "SavedFile",
    "SavedState",
    "Workspace",
    "WorkspaceManager",
    "sanitize_name",
]
_MAX_NAME_BYTES = 180
_MAX_SUFFIX_CHARS = 16
_UNSAFE_CHARS = re.compile(r'[<>:"/\\|?*]')
_RESERVED = re.compile(r"^(con|prn|aux|nul|com[0-9]|lpt[0-9])(\..*)?$", re.IGNORECASE)

#: relative posix path → (mtime_ns, size) of every regular file.
FileStamps = dict[str, tuple[int, int]]
#: Threadbook's own folder in a workspace (the thread's variable snapshot): counted in the
#: quota, left out of file listings and of the files a turn sends back.
STATE_DIR = ".threadbook"
_STATE_PREFIX = f"{STATE_DIR}/"
#: The snapshot folders the kernel writes (:mod:`threadbook_kernel.snapshot`): the current
#: one, and the previous one while a new one is swapped in.
_SNAPSHOT_DIRS = ("snapshot", "snapshot.old")


def sanitize_name(name: str) -> str:
    """Turn an untrusted file name into a safe single path component.

    Keeps only the last path segment (``/`` and ``\\`` both count), applies Unicode NFC,
    drops control characters, replaces characters that are unsafe on common file
    systems, strips leading dots/spaces (no hidden files, no ``..``), prefixes reserved
    device names (``CON``, ``NUL``, ...) and shortens overlong names while keeping the
    extension. Never returns an empty string.
    """
    name = unicodedata.normalize("NFC", name).replace("\\", "/")
    name = name.rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if not unicodedata.category(ch).startswith("C"))
    name = _UNSAFE_CHARS.sub("_", name)
    name = name.strip().lstrip(". ").rstrip(". ")
    if not name:
        return "file"
    if _RESERVED.match(name):
        name = f"_{name}"
    return _shorten(name, _MAX_NAME_BYTES)


def _shorten(name: str, max_bytes: int) -> str:
    if len(name.encode()) <= max_bytes:
        return name
    stem, dot, suffix = name.rpartition(".")
    if not dot or not stem or len(suffix) > _MAX_SUFFIX_CHARS:
        stem, suffix = name, ""
    ext = f".{suffix}" if suffix else ""
    budget = max_bytes - len(ext.encode())
    stem = stem.encode()[:budget].decode(errors="ignore")
    return f"{stem}{ext}"


def _with_counter(name: str, counter: int) -> str:
    stem, dot, suffix = name.rpartition(".")
    if not dot or not stem:
        stem, suffix = name, ""
    ext = f".{suffix}" if suffix else ""
    return _shorten(f"{stem}-{counter}{ext}", _MAX_NAME_BYTES + 8)


@dataclass(frozen=True)
class SavedFile:
    """An upload as stored: its final (sanitised, unique) name and size, and the file itself,
    still open (read it through ``file``, never by name: the kernel may swap the name for a
    link at any time). The caller closes ``file``."""

    name: str
    size: int
    file: PinnedFile


@dataclass(frozen=True)
class SavedState:
    """The thread's variable snapshot as files on disk: its size and when it was written."""

    bytes: int
    saved_at: float


@dataclass(frozen=True)
class FileInfo:
    """A regular file in a workspace; ``name`` is the workspace-relative posix path."""

    name: str
    size: int
    mtime: float


class Workspace:
    """One thread's folder. Quotas apply to uploads; user code is bounded by RLIMIT_FSIZE."""

    def __init__(self, path: Path, *, max_file_bytes: int, quota_bytes: int) -> None:
        self.path = path
        self.max_file_bytes = max_file_bytes
        self.quota_bytes = quota_bytes

    async def save_upload(
        self, name: str, chunks: AsyncIterator[bytes], *, declared_size: int | None = None
    ) -> SavedFile:
        """Stream an upload into the workspace under a safe, unique name.

        Refuses before writing when ``declared_size`` breaks a quota; enforces both quotas
        while streaming and removes the partial file on any failure.
        """
        if declared_size is not None and declared_size > self.max_file_bytes:
            raise QuotaError(f"{name!r} is {declared_size} bytes; the limit per file is {self.max_file_bytes}")
        used = await self.usage_bytes()
        room = self.quota_bytes - used
        if declared_size is not None and declared_size > room:
            raise QuotaError(f"{name!r} ({declared_size} bytes) does not fit: {max(room, 0)} bytes left of the quota")
        limit = min(self.max_file_bytes, room)
        dir_fd, fd, final = await asyncio.to_thread(self._create_unique, sanitize_name(name))
        written = 0
        try:
            async for chunk in chunks:
                written += len(chunk)
                if written > limit:
                    which = "per-file limit" if limit == self.max_file_bytes else "workspace quota"
                    raise QuotaError(f"{final!r} is larger than the {which} ({limit} bytes)")
                await asyncio.to_thread(_write_all, fd, chunk)
        except BaseException:
            await asyncio.to_thread(_close_and_unlink, fd, dir_fd, final)
            raise
        os.close(dir_fd)
        # The descriptor we wrote is the file we read back: whatever the kernel renames over
        # the name meanwhile, a preview never reads anything else.
        return SavedFile(name=final, size=written, file=PinnedFile(fd, final, written))

    def _create_unique(self, name: str) -> tuple[int, int, str]:
        dir_fd = safefs.open_dir(self.path)
        try:
            for counter in range(1, 10_000):
                candidate = name if counter == 1 else _with_counter(name, counter)
                try:
                    fd = safefs.create_file_at(dir_fd, candidate)
                except FileExistsError:
                    continue  # taken, or a symlink planted there: never follow it
                return dir_fd, fd, candidate
        except BaseException:
            os.close(dir_fd)
            raise
        os.close(dir_fd)
        raise UnsafePathError(f"no free name for {name!r}")

    async def list_files(self) -> list[FileInfo]:
        """Regular files in the workspace (symlinks skipped), sorted by name."""
        return await asyncio.to_thread(self._list_files)

    def _list_files(self) -> list[FileInfo]:
        return sorted(
            (FileInfo(rel, st.st_size, st.st_mtime) for rel, st in safefs.walk(self.path) if _is_users(rel)),
            key=lambda f: f.name,
        )

    def open_file(self, relative: str) -> PinnedFile:
        """(Blocking) open a regular file of the workspace for reading (see :func:`kernels.host.safefs.open_file`).

        Raises :class:`UnsafePathError` for a link anywhere in ``relative``, ``..``, an
        absolute path, or anything but a regular file; ``FileNotFoundError`` when it is gone.
        """
        return safefs.open_file(self.path, relative)

    async def usage_bytes(self) -> int:
        """Total size of the regular files in the workspace."""
        return (await asyncio.to_thread(self.scan)).bytes

    def scan(self) -> safefs.Scan:
        """(Blocking) one walk of the workspace: its files, their bytes, the entry count."""
        return safefs.scan(self.path)

    def stamps(self, scan: safefs.Scan | None = None) -> FileStamps:
        """(Blocking without ``scan``) mtime and size of every file of the user's (not
        Threadbook's own state), to diff before/after an execution."""
        files = (scan or self.scan()).files
        return {rel: (st.st_mtime_ns, st.st_size) for rel, st in files.items() if _is_users(rel)}

    def saved_state(self, scan: safefs.Scan | None = None) -> SavedState | None:
        """(Blocking without ``scan``) the size and age of the thread's variable snapshot,
        from file sizes only (the bot never reads a snapshot); None when there is none."""
        files = [st for rel, st in (scan or self.scan()).files.items() if _in_snapshot(rel)]
        if not files:
            return None
        return SavedState(bytes=sum(st.st_size for st in files), saved_at=max(st.st_mtime for st in files))

    def may_hold_state(self) -> bool:
        """(Blocking) False only when the workspace has no state folder at all, so a new
        kernel has no snapshot to load (a new thread's kernel skips that round trip)."""
        try:
            workspace = safefs.open_dir(self.path)
        except FileNotFoundError:
            return False
        try:
            os.stat(STATE_DIR, dir_fd=workspace, follow_symlinks=False)
        except FileNotFoundError:
            return False
        finally:
            os.close(workspace)
        return True  # whatever it is (a link the kernel planted included): the kernel's restore judges it

    def forget_state(self) -> None:
        """(Blocking) delete the thread's variable snapshot (``reset``): from its folder's
        descriptor, no link followed (``shutil.rmtree`` refuses to enter one)."""
        try:
            workspace = safefs.open_dir(self.path)
        except FileNotFoundError:
            return
        try:
            state = safefs.open_subdir(workspace, STATE_DIR)
        except (FileNotFoundError, UnsafePathError):
            return  # none, or a link the kernel planted: nothing of ours to delete
        finally:
            os.close(workspace)
        try:
            for name in os.listdir(state):
                try:
                    if stat.S_ISDIR(os.stat(name, dir_fd=state, follow_symlinks=False).st_mode):
                        shutil.rmtree(name, dir_fd=state)
                    else:
                        os.unlink(name, dir_fd=state)
                except FileNotFoundError:
                    continue
                except OSError as exc:  # swapped for a link meanwhile: rmtree refuses it, and we go on
                    log.warning("could not delete %s/%s in %s: %s", STATE_DIR, name, self.path, exc)
        finally:
            os.close(state)

    def open_state_dir(self) -> int:
        """(Blocking) a descriptor of the workspace's :data:`STATE_DIR` (no link followed), made
        when missing (mode 0700, given to the workspace folder's owner, so a sandboxed kernel's
        uid can use it as its own). Raises :class:`UnsafePathError` when the name is a link or
        not a folder. The caller closes it."""
        workspace = safefs.open_dir(self.path)
        try:
            try:
                os.mkdir(STATE_DIR, 0o700, dir_fd=workspace)
                made = True
            except FileExistsError:
                made = False  # the kernel's, or a link it planted (refused just below)
            state = safefs.open_subdir(workspace, STATE_DIR)
            if made and os.geteuid() == 0:
                owner = os.fstat(workspace)
                try:
                    os.fchown(state, owner.st_uid, owner.st_gid)
                except BaseException:
                    os.close(state)
                    raise
            return state
        finally:
            os.close(workspace)

    def touch(self) -> None:
        """(Blocking) mark the workspace as used now (retention counts from here)."""
        try:
            os.utime(self.path)
        except FileNotFoundError:
            pass

    def last_used(self) -> float:
        """(Blocking) the newest mtime of the folder and the files in it."""
        try:
            newest = self.path.stat().st_mtime
        except FileNotFoundError:
            return 0.0
        return max([newest, *(st.st_mtime for _, st in safefs.walk(self.path))])


def _is_users(rel: str) -> bool:
    return not rel.startswith(_STATE_PREFIX)


def _in_snapshot(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) > 2 and parts[0] == STATE_DIR and parts[1] in _SNAPSHOT_DIRS


def changed_files(before: FileStamps, after: FileStamps) -> list[str]:
    """Files created or modified between two stamps of a workspace, sorted."""
    return sorted(rel for rel, sig in after.items() if before.get(rel) != sig)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def _close_and_unlink(fd: int, dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    _close_fds(fd, dir_fd)


class WorkspaceManager:
    """Maps thread keys to workspace folders under ``root`` and deletes stale ones."""

    def __init__(self, root: Path, *, max_file_bytes: int, quota_bytes: int) -> None:
        self.root = Path(root).absolute()
        self.max_file_bytes = max_file_bytes
        self.quota_bytes = quota_bytes
        self._cache: dict[str, Workspace] = {}

    @staticmethod
    def folder_name(key: str) -> str:
        """The folder name for a thread key (a hash; never user text)."""
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def for_key(self, key: str) -> Workspace:
        """The workspace of ``key``, its folder created on demand (one mkdir)."""
        workspace = self._cache.get(key)
        if workspace is None:
            workspace = Workspace(
                self.root / self.folder_name(key), max_file_bytes=self.max_file_bytes, quota_bytes=self.quota_bytes
            )
            self._cache[key] = workspace
        workspace.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return workspace

    async def delete_stale(self, retention_s: float, *, keep: AbstractSet[str] = frozenset()) -> list[Path]:
        """Delete workspace folders unused for ``retention_s``; ``keep`` holds thread keys to spare."""
        spared = {self.folder_name(key) for key in keep}
        deleted = await asyncio.to_thread(self._delete_stale, time.time() - retention_s, spared)
        for key in [k for k, ws in self._cache.items() if ws.path in deleted]:
            del self._cache[key]
        return deleted

    def _delete_stale(self, cutoff: float, spared: set[str]) -> list[Path]:
        deleted: list[Path] = []
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return deleted
        for entry in entries:
            if entry.name in spared or not entry.is_dir(follow_symlinks=False):
                continue
            path = Path(entry.path)
            probe = Workspace(path, max_file_bytes=0, quota_bytes=0)
            if probe.last_used() < cutoff:
                shutil.rmtree(path, ignore_errors=True)
                deleted.append(path)
        return deleted
