"""A thread's variables, saved before its kernel stops and loaded into the next one.

The bot asks for both with a silent user expression (``save_for_bot`` / ``restore_for_bot``):
serialising and deserialising happen here, inside the thread's sandboxed kernel, never in
the bot; a snapshot is as untrusted as the code that made it, and only this thread's kernel
ever loads it.

The user namespace is saved **variable by variable** (one file each), so an object that
cannot be saved costs only itself and is named with the reason:

* modules (``import pandas as pd``) are saved by name and imported again;
* functions and classes defined in the thread are saved by value with dill, their globals
  bound to the new kernel's namespace (so they see later changes to it);
* everything else goes through the standard C pickler (fast: a million-row DataFrame takes
  tenths of a second) and falls back to dill for what it refuses (lambdas, closures);
* two names for one object are saved once (an alias);
* open files and sockets are never saved: a restored handle would point at a different
  file position or a dead connection. They are reported lost, by name.

The snapshot lives in the workspace under ``.threadbook/snapshot/`` (the bot hides
``.threadbook`` from file listings and diffs): a manifest and one file per variable. It is
written beside the current one and swapped in with two renames, so a kernel killed mid-save
leaves the previous snapshot whole.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pickle
import shutil
import socket
import stat
import time
import types
from typing import IO, Any

from threadbook_kernel import workspace_fd
from threadbook_kernel.answer import Answer, first_line, human_size

__all__ = ["STATE_DIR", "restore", "restore_for_bot", "save", "save_for_bot"]

#: The workspace folder Threadbook keeps its own state in (hidden from file listings).
STATE_DIR = ".threadbook"
_CURRENT = "snapshot"
_STAGING = "snapshot.new"
_PREVIOUS = "snapshot.old"
_MANIFEST = "manifest.json"
_FORMAT = 1
_MAX_MANIFEST_BYTES = 4 * 2**20
_PROTOCOL = 5
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: At most this many names are reported back to the bot (the manifest keeps them all).
_MAX_REPORTED = 200
_SHORT_TYPES = (int, float, complex, bool, str, bytes, type(None))


class _Refused(Exception):
    """An object that must not be saved (it holds an OS resource); the message is the reason."""


class _TooLarge(Exception):
    """The variable outgrew what is left of the snapshot's size limit."""


def save_for_bot(max_bytes: int) -> Answer:
    """:func:`save`, wrapped for the bot's user expression."""
    return Answer(save(max_bytes))


def restore_for_bot() -> Answer:
    """:func:`restore`, wrapped for the bot's user expression."""
    return Answer(restore())


def holds_state() -> bool:
    """Whether a save would write anything: the user namespace holds a name a save keeps, or
    the thread has a snapshot (a save replaces it). No value is looked at: the bot asks this
    after every cell, and a turn that left nothing to keep is not followed by a save."""
    if _user_names(_shell()):
        return True
    state = _open_state_dir(create=False)
    if state is None:
        return False
    try:
        return _existing(state, _CURRENT) is not None or _existing(state, _PREVIOUS) is not None
    finally:
        os.close(state)


def save(max_bytes: int) -> dict[str, Any]:
    """Save the user namespace into the workspace's snapshot, at most ``max_bytes`` in all.

    Returns ``{"saved": count, "bytes": total, "lost": [[name, reason], ...], "seconds": s}``.
    """
    started = time.monotonic()
    shell = _shell()
    namespace = shell.user_ns
    entries: list[dict[str, Any]] = []
    lost: list[list[str]] = []
    used = 0
    state = _open_state_dir(create=True)
    assert state is not None
    try:
        _remove(state, _STAGING)
        os.mkdir(_STAGING, 0o700, dir_fd=state)
        staging = os.open(_STAGING, _DIR_FLAGS, dir_fd=state)
        try:
            first_name: dict[int, str] = {}
            for index, name in enumerate(_saved_order(_user_names(shell), namespace)):
                value = namespace[name]
                if (earlier := first_name.get(id(value))) is not None:
                    entries.append({"name": name, "kind": "alias", "of": earlier})
                    continue
                if isinstance(value, types.ModuleType):
                    entries.append({"name": name, "kind": "module", "module": value.__name__})
                    first_name[id(value)] = name
                    continue
                room = max_bytes - used
                try:
                    kind, size = _write(staging, f"{index}.pkl", value, room)
                except _TooLarge:
                    lost.append([name, _too_large(room, max_bytes)])
                    continue
                except _Refused as exc:
                    lost.append([name, str(exc)])
                    continue
                except Exception as exc:
                    lost.append([name, f"it cannot be saved ({first_line(exc)})"])
                    continue
                used += size
                first_name[id(value)] = name
                entries.append({"name": name, "kind": kind, "file": f"{index}.pkl", "type": _describe(value)})
            manifest = {"format": _FORMAT, "saved_at": time.time(), "entries": entries, "lost": lost}
            with _open_in(staging, _MANIFEST, "w") as file:
                json.dump(manifest, file)
        except BaseException:
            os.close(staging)
            _remove(state, _STAGING)
            raise
        os.close(staging)
        _swap_in(state)
    finally:
        os.close(state)
    saved = sum(1 for entry in entries if entry["kind"] != "alias")
    return {"saved": saved, "bytes": used, "lost": lost[:_MAX_REPORTED], "seconds": time.monotonic() - started}


def restore() -> dict[str, Any]:
    """Load the workspace's snapshot into the user namespace.

    Returns ``{"found": False}`` when there is none, else ``{"found": True, "saved_at":
    epoch, "restored": [[name, type], ...], "lost": [[name, reason], ...], "seconds": s}``:
    ``lost`` holds what the save left out and what failed to load now. A snapshot whose
    manifest cannot be read gives ``{"found": True, "error": why}``.
    """
    started = time.monotonic()
    namespace = _shell().user_ns
    state = _open_state_dir(create=False)
    if state is None:
        return {"found": False}
    try:
        folder = _existing(state, _CURRENT) or _existing(state, _PREVIOUS)
        if folder is None:
            return {"found": False}
        snapshot = os.open(folder, _DIR_FLAGS, dir_fd=state)
    finally:
        os.close(state)
    try:
        try:
            manifest = _read_manifest(snapshot)
        except Exception as exc:
            return {"found": True, "error": first_line(exc)}
        restored: list[list[str]] = []
        lost: list[list[str]] = [[str(name), str(reason)] for name, reason in manifest.get("lost", [])]
        for entry in manifest["entries"]:
            name = str(entry["name"])
            try:
                value = _load(snapshot, entry, namespace)
            except Exception as exc:
                lost.append([name, f"it could not be loaded ({first_line(exc)})"])
                continue
            # Set at once: a later variable's pickle may name a class restored before it.
            namespace[name] = value
            restored.append([name, str(entry.get("type") or _describe(value))])
    finally:
        os.close(snapshot)
    return {
        "found": True,
        "saved_at": float(manifest.get("saved_at", 0.0)),
        "restored": restored[:_MAX_REPORTED],
        "lost": lost[:_MAX_REPORTED],
        "seconds": time.monotonic() - started,
    }


# --- what is saved -----------------------------------------------------------------------------


def _shell() -> Any:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("snapshots work inside an IPython kernel only")
    return shell


def _user_names(shell: Any) -> list[str]:
    """The names user code made, as ``%who`` lists them: not IPython's own, not ``_``-prefixed."""
    hidden = shell.user_ns_hidden
    missing = object()
    return [
        name
        for name, value in shell.user_ns.items()
        if isinstance(name, str) and not name.startswith("_") and value is not hidden.get(name, missing)
    ]


def _saved_order(names: list[str], namespace: dict[str, Any]) -> list[str]:
    """Modules, then the thread's own functions and classes, then the rest: a value's pickle
    may refer to a class by its name in ``__main__``, which must exist when it is loaded."""

    def rank(name: str) -> int:
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            return 0
        return 1 if _defined_here(value) else 2

    return sorted(names, key=rank)


def _defined_here(value: Any) -> bool:
    """A function or class defined in this thread's cells (not importable from anywhere)."""
    return isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == "__main__"


def _resource(value: Any) -> str | None:
    """Why ``value`` must not be saved (it holds an OS resource), else None."""
    if isinstance(value, io.IOBase) and not isinstance(value, (io.BytesIO, io.StringIO)):
        name = getattr(value, "name", None)
        where = f" ({name})" if isinstance(name, str) else ""
        return f"it is an open file handle{where}; open the file again"
    if isinstance(value, socket.socket):
        return "it is an open network connection"
    return None


def _describe(value: Any) -> str:
    """A short type description for the model: ``DataFrame 1,000,000×6``, ``function``, ``int``."""
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, types.FunctionType):
        return "function"
    if isinstance(value, type):
        return "class"
    kind = type(value).__name__
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
        return f"{kind} {'×'.join(f'{n:,}' for n in shape)}"
    if isinstance(value, (list, dict, set, tuple)):
        return f"{kind} of {len(value):,}"
    return kind


def _too_large(room: int, limit: int) -> str:
    if room < limit:
        return f"it did not fit in the {human_size(room)} left of the snapshot's {human_size(limit)} limit"
    return f"it is larger than the snapshot's {human_size(limit)} limit"


def _estimate(value: Any) -> int | None:
    """The size of a NumPy or pandas object's data without serialising it, else None."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int) and type(value).__module__.startswith("numpy"):
        return nbytes
    usage = getattr(value, "memory_usage", None)
    if callable(usage) and type(value).__module__.startswith("pandas"):
        with contextlib.suppress(Exception):
            total = usage(deep=False)
            return int(total.sum() if hasattr(total, "sum") else total)
    return None


# --- writing -----------------------------------------------------------------------------------


class _Capped(io.RawIOBase):
    """Counts what a pickler writes into ``file`` and stops it past ``limit`` bytes."""

    def __init__(self, file: IO[bytes], limit: int) -> None:
        super().__init__()
        self._file = file
        self._limit = limit
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        self.written += size
        if self.written > self._limit:
            raise _TooLarge
        self._file.write(data)
        return size

    def rewind(self) -> None:
        self._file.seek(0)
        self._file.truncate()
        self.written = 0


class _Pickler(pickle.Pickler):
    """The standard (C) pickler, refusing objects that hold OS resources wherever they sit."""

    def reducer_override(self, obj: Any) -> Any:
        if (reason := _resource(obj)) is not None:
            raise _Refused(f"it holds an open resource: {reason}")
        return NotImplemented


def _write(folder: int, name: str, value: Any, room: int) -> tuple[str, int]:
    """Serialise ``value`` into ``folder/name``; (the serializer used, bytes written)."""
    if (reason := _resource(value)) is not None:
        raise _Refused(reason)
    estimate = _estimate(value)
    if estimate is not None and estimate > room:
        raise _TooLarge
    with _open_in(folder, name, "wb") as file:
        try:
            out = _Capped(file, room)
            if _defined_here(value):
                _dill_dump(value, out)
                return "dill", out.written
            try:
                _Pickler(out, protocol=_PROTOCOL).dump(value)
                return "pickle", out.written
            except (_Refused, _TooLarge):
                raise
            except Exception:
                out.rewind()
                _dill_dump(value, out)
                return "dill", out.written
        except BaseException:
            file.close()
            os.unlink(name, dir_fd=folder)
            raise


def _dill_dump(value: Any, out: _Capped) -> None:
    import dill

    class Pickler(dill.Pickler):  # type: ignore[misc]
        def save(self, obj: Any, save_persistent_id: bool = True) -> None:
            if (reason := _resource(obj)) is not None:
                raise _Refused(f"it holds an open resource: {reason}")
            super().save(obj, save_persistent_id)

    # byref=False: the thread's classes travel by value; recurse=False: a function's globals
    # are the namespace it lives in (``__main__``), so the restored one sees the new kernel's.
    Pickler(out, protocol=_PROTOCOL, byref=False, recurse=False).dump(value)


def _swap_in(state: int) -> None:
    """Make the staged snapshot the current one; the previous one stays until that is done."""
    _remove(state, _PREVIOUS)
    if _existing(state, _CURRENT):
        os.rename(_CURRENT, _PREVIOUS, src_dir_fd=state, dst_dir_fd=state)
    os.rename(_STAGING, _CURRENT, src_dir_fd=state, dst_dir_fd=state)
    _remove(state, _PREVIOUS)


# --- reading -----------------------------------------------------------------------------------


def _read_manifest(folder: int) -> dict[str, Any]:
    with _open_in(folder, _MANIFEST, "rb") as file:
        data = file.read(_MAX_MANIFEST_BYTES + 1)
    if len(data) > _MAX_MANIFEST_BYTES:
        raise ValueError("the snapshot's manifest is too large")
    manifest = json.loads(data)
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != _FORMAT
        or not isinstance(manifest.get("entries"), list)
    ):
        raise ValueError("the snapshot's manifest is not one this kernel understands")
    return manifest


def _load(folder: int, entry: dict[str, Any], namespace: dict[str, Any]) -> Any:
    kind = entry["kind"]
    if kind == "module":
        return importlib.import_module(str(entry["module"]))
    if kind == "alias":
        original = str(entry["of"])
        if original not in namespace:
            raise LookupError(f"{original} was not restored")
        return namespace[original]
    if kind not in ("pickle", "dill"):
        raise ValueError(f"unknown kind {kind!r}")
    with _open_in(folder, str(entry["file"]), "rb") as file:
        if kind == "pickle":
            return pickle.load(file)
        import dill

        return dill.load(file)


# --- the state folder --------------------------------------------------------------------------


def _open_state_dir(*, create: bool) -> int | None:
    """A descriptor of ``.threadbook`` in the workspace (no link followed); None when it
    does not exist and ``create`` is false."""
    workspace = workspace_fd()
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(STATE_DIR, 0o700, dir_fd=workspace)
    try:
        return os.open(STATE_DIR, _DIR_FLAGS, dir_fd=workspace)
    except FileNotFoundError:
        if create:
            raise
        return None


def _open_in(folder: int, name: str, mode: str) -> IO[Any]:
    flags = os.O_NOFOLLOW | os.O_CLOEXEC

    def opener(path: str, base: int) -> int:
        return os.open(path, base | flags, 0o600, dir_fd=folder)

    return open(name, mode, opener=opener)


def _existing(state: int, name: str) -> str | None:
    try:
        info = os.stat(name, dir_fd=state, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return name if stat.S_ISDIR(info.st_mode) else None


def _remove(state: int, name: str) -> None:
    """Delete the folder ``name`` in the state folder, if there is one (links are not followed)."""
    try:
        info = os.stat(name, dir_fd=state, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=state)
    else:
        os.unlink(name, dir_fd=state)
