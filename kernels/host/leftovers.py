"""Nothing runs between turns: processes a cell leaves behind are killed when it ends.

Decision: leftovers are **killed** (SIGKILL), not frozen. A frozen process keeps holding its
memory and pids against the kernel's limits, a chat user can neither see nor resume it, and
Jupyter's model has no place for it; a channel that wants background work (a server polled
by later cells) sets ``background_processes: true`` in its policy instead.

A kernel's own processes (bwrap and its init, then the ipykernel process; or the fork
server's supervisor and the kernel) are recorded when it becomes ready, before any user
code (:func:`infrastructure`). After each execution everything else is killed
(:func:`stop`): every other member of the kernel's cgroup where it has one, which also
catches processes that called ``setsid`` or double-forked away; else every other
descendant of the kernel's root process (:mod:`kernels.host.proctree`), which inside the sandbox also holds
orphans (they are re-parented to the sandbox's own init), but not without it.
"""

from __future__ import annotations

import time

import psutil

from kernels.host import proctree
from kernels.host.cgroups import KILL_TIMEOUT_S, KernelCgroup


def infrastructure(cgroup: KernelCgroup | None, pid: int | None) -> frozenset[int]:
    """(Blocking) the kernel's own processes now: its cgroup's members, else its process tree."""
    if cgroup is not None:
        return frozenset(cgroup.pids())
    return frozenset(proc.pid for proc in process_tree(pid))


def stop(cgroup: KernelCgroup | None, pid: int | None, keep: frozenset[int]) -> int:
    """(Blocking) SIGKILL every process of the kernel not in ``keep``; how many there were."""
    if cgroup is not None:
        return cgroup.kill(keep)
    killed: set[int] = set()
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while time.monotonic() < deadline:
        targets = [proc for proc in process_tree(pid) if proc.pid not in keep and _alive(proc)]
        if not targets:
            break
        for proc in targets:
            try:
                proc.kill()  # psutil checks it is still the same process (no recycled pid)
                killed.add(proc.pid)
            except psutil.Error:
                pass
        time.sleep(0.002)
    return len(killed)


def process_tree(pid: int | None) -> list[psutil.Process]:
    """(Blocking) ``pid`` and all its descendants now (none when it is gone)."""
    if pid is None:
        return []
    found = []
    for member in proctree.pids(pid):
        try:
            found.append(psutil.Process(member))
        except psutil.Error:  # it ended meanwhile
            continue
    return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
