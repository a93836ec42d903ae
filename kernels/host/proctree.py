"""A process and its descendants, read from ``/proc/<pid>/task/<tid>/children``.

psutil's ``Process.children(recursive=True)`` reads the parent of every process on the
machine to find a few: with a hundred kernels running (several processes and many threads
each) that was ~4 ms a walk, and a forked kernel's start walked twice, a one-shot's too. The
kernel lists each thread's children itself; a walk reads only the tree's own threads. Where
those files are missing (a kernel built without ``CONFIG_PROC_CHILDREN``) psutil does it.

A jailed forked kernel is not its supervisor's child (the fork server forks it into the
supervisor's pid namespace), yet its orphans are re-parented to that supervisor, pid 1 of the
namespace: :func:`adopt` makes the supervisor and its descendants part of the kernel's tree.
"""

from __future__ import annotations

import os

import psutil

_HAS_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
#: The process that adopts each kernel's orphans without being its ancestor, by kernel pid.
_adopters: dict[int, int] = {}


def adopt(pid: int, adopter: int) -> None:
    """Count ``adopter`` and its descendants in ``pid``'s tree (until :func:`forget`)."""
    _adopters[pid] = adopter


def forget(pid: int) -> None:
    """``pid``'s tree is its descendants only again (call once it has ended)."""
    _adopters.pop(pid, None)


def pids(pid: int) -> list[int]:
    """(Blocking) ``pid`` and its descendants now, ``pid`` first (then its adopter's tree,
    see :func:`adopt`); empty when it is gone. A process that starts or ends during the walk
    may be missed (callers that must not miss one walk again until nothing new shows up)."""
    found = _descendants(pid)
    adopter = _adopters.get(pid)
    if found and adopter is not None:
        seen = set(found)
        found += [member for member in _descendants(adopter) if member not in seen]
    return found


def _descendants(pid: int) -> list[int]:
    if not _HAS_CHILDREN:
        return _psutil_pids(pid)
    if not os.path.exists(f"/proc/{pid}"):
        return []
    found = [pid]
    index = 0
    while index < len(found):
        current = found[index]
        index += 1
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:  # it ended meanwhile
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{current}/task/{tid}/children") as handle:
                    found.extend(int(child) for child in handle.read().split())
            except OSError:
                continue
    return found


def _psutil_pids(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return []
