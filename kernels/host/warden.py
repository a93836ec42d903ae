"""The kernel warden: when the bot dies, it kills the bot's kernels, frozen or not.

A frozen kernel (:mod:`kernels.host.freezing`) acts on no signal until it is thawed: the
death signal of a dead parent (``bwrap --die-with-parent``, ``PR_SET_PDEATHSIG``), the fork
server's lifeline and a SIGKILL of the cgroup v1 freezer's tasks all wait for a thaw that a
dead bot never gives. So something that is never frozen must do it: this program, started by
the bot (:class:`kernels.host.lifeline.Lifeline`) as ``python -I -S warden.py`` in a session
of its own, outside every kernel cgroup, as the bot's uid (the uid that kills kernels today).
It imports nothing but the standard library.

Its stdin is the read end of the bot's *lifeline*, a pipe whose write end only the bot holds
(close-on-exec: no kernel, zygote or one-shot inherits it). Over it the bot tells it, as JSON
lines, what to kill::

    {"id": K, "cgroup": FOLDER}          a folder (one per hierarchy) of kernel K's cgroup
    {"id": K, "pid": P, "start": T}      a process tree of kernel K: its root P, whose start
                                         time (clock ticks since boot) is T (a kernel may
                                         have several: a jailed forked kernel's supervisor)
    {"id": K, "drop": true}              kernel K is gone: forget it

On end of file - the bot exited, was killed (``kill -9``, the OOM killer) or closed its
kernel layer - it sweeps what it was told of, then exits:

* every cgroup: SIGKILL to each member of ``cgroup.procs``, then thaw (v1 ``freezer.state``
  ``THAWED``, v2 ``cgroup.freeze`` 0; v2 ``cgroup.kill`` where the host has it, which kills
  frozen tasks too), again until the cgroup is empty; then its folders are removed;
* every process tree (kernels without a cgroup, frozen by ``SIGSTOP``, and the fork server):
  the root, if it is still the same process (its start time), and its descendants now, and
  later whatever is left in their sessions; a stopped process takes a SIGKILL.

Every signal goes through a pidfd opened before the process is checked once more (a member of
the cgroup, the process of that start time), so a recycled pid is never signalled. SIGINT,
SIGTERM and SIGHUP are ignored: it lives exactly as long as the lifeline.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

#: What the warden writes on stdout once it listens (then stdout is closed).
READY = b"ready\n"
#: How long a sweep keeps killing and waiting for cgroups to empty.
SWEEP_S = 10.0


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot, ``/proc/PID/stat`` field 22), None when gone."""
    stat = _stat(pid)
    return None if stat is None else stat[2]


def _stat(pid: int) -> tuple[int, int, int, str] | None:
    """(ppid, session, start time, state) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), int(fields[3]), int(fields[19]), fields[0]


def _processes() -> dict[int, tuple[int, int, int, str]]:
    """Every process now: pid → (ppid, session, start time, state)."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            found[int(name)] = stat
    return found


def _kill(targets: dict[int, int]) -> set[int]:
    """SIGKILL each pid of ``targets`` whose start time is still the one given; those signalled."""
    killed: set[int] = set()
    for pid, start in targets.items():
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if process_start(pid) != start:
                continue  # the pid was recycled since it was seen
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            killed.add(pid)
        except OSError:
            pass
        finally:
            os.close(fd)
    return killed


def _members(folders: list[Path]) -> set[int]:
    pids: set[int] = set()
    for folder in folders:
        try:
            pids.update(int(line) for line in (folder / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            continue
    return pids


def _write(path: Path, value: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return
    try:
        os.write(fd, value.encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def _kill_cgroup(folders: list[Path]) -> set[int]:
    """One round on a kernel's cgroup: kill its members, then thaw it; those signalled."""
    for folder in folders:
        if (folder / "cgroup.kill").exists():  # v2, Linux 5.14+: frozen tasks die too
            _write(folder / "cgroup.kill", "1")
    members = _members(folders)
    handles: dict[int, int] = {}
    killed: set[int] = set()
    try:
        for pid in members:
            try:
                handles[pid] = os.pidfd_open(pid)
            except OSError:
                continue
        still = _members(folders)  # pinned, then checked: each pid is still this cgroup's
        for pid, fd in handles.items():
            if pid in still:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    killed.add(pid)
                except OSError:
                    pass
    finally:
        for fd in handles.values():
            os.close(fd)
    for folder in folders:  # a frozen task takes the SIGKILL once thawed
        if (folder / "freezer.state").exists():
            _write(folder / "freezer.state", "THAWED")
        elif (folder / "cgroup.freeze").exists():
            _write(folder / "cgroup.freeze", "0")
    return killed


def _trees(roots: list[tuple[int, int]]) -> tuple[dict[int, int], set[int]]:
    """The processes of the trees whose roots (pid, start time) still run, and the sessions
    they lead."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, int] = {}
    for root, start in roots:
        if root not in table or table[root][2] != start:
            continue  # gone, or its pid now names another process
        todo = [root]
        while todo:
            pid = todo.pop()
            if pid not in found:
                found[pid] = table[pid][2]
                todo.extend(children.get(pid, ()))
    # Only sessions a member of the trees leads: never the bot's own (or its shell's).
    sessions = {session for pid in found if (session := table[pid][1]) in found}
    return found, sessions


def _in_sessions(sessions: set[int]) -> dict[int, int]:
    """Live processes of ``sessions`` (what a tree left behind while it was killed)."""
    return {
        pid: start for pid, (_, session, start, state) in _processes().items() if session in sessions and state != "Z"
    }


def sweep(kernels: dict[str, dict[str, Any]], deadline: float) -> int:
    """Kill every process of ``kernels`` and remove their cgroups; how many processes were signalled."""
    cgroups = [[Path(folder) for folder in kernel.get("cgroups", [])] for kernel in kernels.values()]
    cgroups = [folders for folders in cgroups if folders]
    roots = [tuple(root) for kernel in kernels.values() for root in kernel.get("roots", [])]
    # The trees are read before anything is killed: a killed parent's children move to init.
    tree, sessions = _trees(roots)
    killed = _kill(tree)
    while True:
        for folders in cgroups:
            killed |= _kill_cgroup(folders)
        if sessions:
            killed |= _kill(_in_sessions(sessions))
        cgroups = [folders for folders in cgroups if _members(folders)]
        if (not cgroups and not (sessions and _in_sessions(sessions))) or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    for kernel in kernels.values():
        _remove(list(kernel.get("cgroups", [])), deadline)
    return len(killed)


def _remove(folders: list[str], deadline: float) -> None:
    """Remove a kernel's cgroup folders, retrying while its killed processes leave."""
    left = [Path(folder) for folder in folders]
    while left:
        for folder in list(left):
            try:
                folder.rmdir()
                left.remove(folder)
            except FileNotFoundError:
                left.remove(folder)
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    left.remove(folder)  # the next bot's start-up sweep removes it
        if left:
            time.sleep(0.005)


def _apply(kernels: dict[str, dict[str, Any]], message: dict[str, Any]) -> None:
    key = str(message["id"])
    if message.get("drop"):
        kernels.pop(key, None)
        return
    kernel = kernels.setdefault(key, {})
    if "cgroup" in message and (folder := str(message["cgroup"])) not in (folders := kernel.setdefault("cgroups", [])):
        folders.append(folder)
    if "pid" in message and (root := [int(message["pid"]), int(message["start"])]) not in (
        roots := kernel.setdefault("roots", [])
    ):
        roots.append(root)


def _say(text: str) -> None:
    try:
        os.write(2, f"threadbook kernel warden (pid {os.getpid()}): {text}\n".encode())
    except OSError:
        pass  # the bot's stderr may be gone with it


def main() -> None:
    """Listen on stdin until it ends, then sweep what it named."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    os.write(1, READY)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    kernels: dict[str, dict[str, Any]] = {}
    buffer = b""
    while True:
        try:
            chunk = os.read(0, 65536)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                _apply(kernels, json.loads(line))
            except (ValueError, KeyError, TypeError):
                _say(f"ignored an unreadable line: {line[:200]!r}")
    if kernels:
        started = time.monotonic()
        killed = sweep(kernels, started + SWEEP_S)
        if killed:
            _say(
                f"the bot's lifeline closed: killed {killed} process(es) of {len(kernels)} kernel(s) "
                f"in {time.monotonic() - started:.2f} s"
            )


if __name__ == "__main__":
    main()
    sys.exit(0)
