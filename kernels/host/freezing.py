"""Nothing of a thread runs between its turns: its kernel is frozen whenever it has no work.

A kernel is thawed only for an execution, a snapshot save or restore, or its shutdown
(:class:`kernels.session.session.KernelSession` does both around each of these), so a thread that a
cell started, a process it left, or a spinning loop gets no CPU and writes nothing while the
thread waits for its next message, and whatever it does while thawed is measured by the
quota check and the CPU accounting of the execution running then.

Where the kernel has a cgroup with a freezer (v1 ``freezer.state``, v2 ``cgroup.freeze``) the
whole cgroup is frozen, processes that left the process tree included. Elsewhere every
process of its tree gets ``SIGSTOP`` (``SIGCONT`` to thaw): what double-forked out of the
tree is not reached, but the leftover sweep after each execution has killed it already
(unless the channel allows background processes).

A frozen process acts on no signal until it is thawed, the death signal of a dead bot
(``bwrap --die-with-parent``, the fork server's lifeline) included: the kernel warden
(:mod:`kernels.host.lifeline`, a process of its own that is never frozen) kills and thaws
every kernel when the bot dies, and no kernel is frozen while no warden runs (the freeze of
:class:`~kernels.spawn.handle.LocalKernelHandle` asks for one first).

CPU time: the cgroup's own counter (ended processes included); without one, the process
tree's times plus what each member reaped (``children_user``/``children_system``).
"""

from __future__ import annotations

import signal
import time

import psutil

from kernels.host.cgroups import FREEZE_TIMEOUT_S, KernelCgroup
from kernels.host.leftovers import process_tree


def freeze(cgroup: KernelCgroup | None, pid: int | None) -> bool:
    """(Blocking) freeze a kernel: its cgroup, else its process tree. True once frozen."""
    if cgroup is not None and cgroup.can_freeze:
        return cgroup.freeze()
    return _signal_members(cgroup, pid, signal.SIGSTOP, until_stopped=True)


def thaw(cgroup: KernelCgroup | None, pid: int | None) -> None:
    """(Blocking) thaw a kernel frozen by :func:`freeze`."""
    if cgroup is not None and cgroup.can_freeze:
        cgroup.thaw()
    else:
        _signal_members(cgroup, pid, signal.SIGCONT, until_stopped=False)


def cpu_seconds(cgroup: KernelCgroup | None, pid: int | None) -> float | None:
    """(Blocking) CPU seconds the kernel has used since it started; None when unknown."""
    if cgroup is not None and (used := cgroup.cpu_seconds()) is not None:
        return used
    members = _members(None, pid)
    if not members:
        return None
    total = 0.0
    for proc in members:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def _members(cgroup: KernelCgroup | None, pid: int | None) -> list[psutil.Process]:
    if cgroup is not None:
        found = []
        for member in cgroup.pids():
            try:
                found.append(psutil.Process(member))
            except psutil.Error:
                continue
        return found
    return process_tree(pid)


def _signal_members(
    cgroup: KernelCgroup | None, pid: int | None, signum: signal.Signals, *, until_stopped: bool
) -> bool:
    """Send ``signum`` to every member; with ``until_stopped``, again to members that are not
    stopped yet (one forked meanwhile), for at most :data:`FREEZE_TIMEOUT_S`."""
    deadline = time.monotonic() + FREEZE_TIMEOUT_S
    while True:
        pending = False
        for proc in _members(cgroup, pid):
            try:
                if until_stopped and proc.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    continue
                proc.send_signal(signum)  # psutil checks the pid was not reused
                pending = True
            except psutil.Error:
                continue
        if not until_stopped or not pending or time.monotonic() > deadline:
            return not pending
        time.sleep(0.001)
