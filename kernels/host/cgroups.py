"""Per-kernel cgroups: one memory cap for all of a kernel's processes and shared memory,
a process cap, and a CPU weight below the bot's.

:func:`detect` (once per bot process, cached) finds what this host allows, in this order:

* **cgroup v2** where the bot's own cgroup (the ``0::`` line of ``/proc/self/cgroup``) is
  writable and offers the ``memory``, ``pids`` or ``cpu`` controller (a delegated subtree:
  systemd ``Delegate=yes``, a container with a private, writable cgroup mount). cgroup v2
  enables controllers only for the children of a cgroup without processes of its own, so
  the bot first moves the processes of its own cgroup into the leaf ``<own>/threadbook-bot``.
* **cgroup v1** where the ``memory``, ``pids`` and ``cpu`` hierarchies are mounted and the
  bot may create cgroups beneath its own cgroup of each (root).
* nothing: the rlimits of :meth:`kernels.seam.plan.ResourceLimits.rlimits` are the only limits.

Layout, per hierarchy: ``<own>/threadbook/kernel-<bot pid>-<kernel id>``. Each kernel gets
``memory.max`` (v1 ``memory.limit_in_bytes``, and ``memory.memsw.limit_in_bytes`` where swap
is accounted; v2 ``memory.swap.max = 0``) of ``kernels.memory_mb``, which counts every
process of the kernel, its tmpfs and shared memory, and the kernel memory of its inodes;
``pids.max`` of ``kernels.max_processes``. ``threadbook`` has half the CPU weight of the
bot (v1 ``cpu.shares`` 512 against 1024 for each of the bot's threads; v2 ``cpu.weight`` 50
against the bot leaf's 100), so all kernels together cannot starve the bot, and each kernel
has the default weight within it, so a spinning kernel gets no more than its neighbours.

The cgroups of a bot process that died (a ``kill -9``) are emptied and removed within
milliseconds by its kernel warden (:mod:`kernels.host.warden`); whatever is left (a warden
killed with the bot) is removed by the next bot that starts on the host: its name carries the
dead bot's pid.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import psutil

from kernels.host import proctree
from kernels.host.mounts import MOUNTINFO, Mount, parse

log = logging.getLogger(__name__)

#: The controllers the bot uses, in the order it reports them. ``freezer`` and ``cpuacct`` are
#: v1 hierarchies of their own; cgroup v2 has both in every cgroup (``cgroup.freeze``,
#: ``cpu.stat``), without a controller to enable.
CONTROLLERS = ("memory", "pids", "cpu", "freezer", "cpuacct")
#: Resource controllers: a v1 host with none of these mounted gives kernels no cgroup.
LIMIT_CONTROLLERS = ("memory", "pids", "cpu")
PARENT = "threadbook"
BOT_LEAF = "threadbook-bot"
KERNEL_PREFIX = "kernel-"
#: All kernels together against one bot thread (v1, default 1024) or the bot leaf (v2, default 100).
V1_KERNELS_CPU_SHARES = 512
V2_KERNELS_CPU_WEIGHT = 50
#: How long :meth:`KernelCgroup.remove` waits for killed processes to leave their cgroup.
REMOVE_TIMEOUT_S = 2.0
#: How long :meth:`KernelCgroup.kill` keeps killing (processes that fork while being killed).
KILL_TIMEOUT_S = 1.0
#: How long :meth:`KernelCgroup.freeze` waits for every process to be frozen.
FREEZE_TIMEOUT_S = 1.0
MiB = 1024 * 1024


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy the bot uses."""

    controllers: tuple[str, ...]  # of CONTROLLERS, the ones this hierarchy holds
    parent: Path  # <mount>/<own>/threadbook: the kernels' cgroups go in here
    own: str  # the bot's own cgroup in this hierarchy, as /proc/self/cgroup names it


@dataclass(frozen=True)
class CgroupSupport:
    """What :func:`detect` found: the cgroup version and the hierarchies to use."""

    version: int
    hierarchies: tuple[Hierarchy, ...]
    swap_accounted: bool  # v1 memory.memsw.* / v2 memory.swap.max exist

    @property
    def controllers(self) -> tuple[str, ...]:
        """The controllers in use, in :data:`CONTROLLERS` order."""
        held = {name for hierarchy in self.hierarchies for name in hierarchy.controllers}
        return tuple(name for name in CONTROLLERS if name in held)


def _mounts(mountinfo: str) -> list[Mount]:
    """The cgroup (v1 and v2) mounts of a mount table's text."""
    return [mount for mount in parse(mountinfo) if mount.fstype in ("cgroup", "cgroup2")]


def _own_cgroups(proc_cgroup: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as controller → path; cgroup v2's line is under ``""``."""
    own: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "":
            own[""] = parts[2]
        for name in parts[1].split(","):
            if name:
                own[name] = parts[2]
    return own


def _place(mount: Mount, own: str) -> Path | None:
    """The folder of cgroup ``own`` under ``mount`` (None when the mount does not show it)."""
    root = mount.root.rstrip("/") or "/"
    if root != "/" and own != root and not own.startswith(root + "/"):
        return None
    relative = own[len(root) :] if root != "/" else own
    return mount.point / relative.lstrip("/")


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_pids(path: Path) -> set[int]:
    with open(path) as handle:
        return {int(line) for line in handle.read().split()}


def detect(proc_cgroup: str | None = None, mountinfo: str | None = None) -> tuple[CgroupSupport | None, str]:
    """(Blocking) what per-kernel cgroups this host allows, set up for use: the support (or
    None) and, when there is none, why. The arguments default to ``/proc/self``'s files."""
    if proc_cgroup is None:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    if mountinfo is None:
        mountinfo = MOUNTINFO.read_text()
    own, found = _own_cgroups(proc_cgroup), _mounts(mountinfo)
    reasons = []
    if "" in own:
        support, reason = _detect_v2(own[""], [m for m in found if m.fstype == "cgroup2"])
        if support is not None:
            return support, ""
        reasons.append(reason)
    support, reason = _detect_v1(own, [m for m in found if m.fstype == "cgroup"])
    if support is not None:
        return support, ""
    reasons.append(reason)
    return None, "; ".join(reasons)


@cache
def detected() -> tuple[CgroupSupport | None, str]:
    """:func:`detect` for this process, run once (later calls return the first answer)."""
    try:
        return detect()
    except OSError as exc:
        return None, f"cannot read the bot's cgroups: {exc}"


def _detect_v2(own: str, mounts: list[Mount]) -> tuple[CgroupSupport | None, str]:
    folder = next((place for mount in mounts if (place := _place(mount, own)) is not None), None)
    if folder is None:
        return None, "cgroup v2: not mounted"
    try:
        available = set((folder / "cgroup.controllers").read_text().split())
    except OSError as exc:
        return None, f"cgroup v2: {exc.strerror}: {folder}"
    controllers = tuple(name for name in LIMIT_CONTROLLERS if name in available)
    if not controllers:
        return None, f"cgroup v2: no memory, pids or cpu controller delegated to {own}"
    if not os.access(folder, os.W_OK) or not os.access(folder / "cgroup.subtree_control", os.W_OK):
        return None, f"cgroup v2: {own} is not writable by the bot"
    enable = " ".join(f"+{name}" for name in controllers)
    try:
        _enable_v2(folder, enable)
        parent = folder / PARENT
        parent.mkdir(exist_ok=True)
        _write(parent / "cgroup.subtree_control", enable)
        if "cpu" in controllers:
            _write(parent / "cpu.weight", str(V2_KERNELS_CPU_WEIGHT))
    except OSError as exc:
        return None, f"cgroup v2: cannot set up {folder / PARENT}: {exc.strerror or exc}"
    _remove_stale((parent,))
    hierarchy = Hierarchy(controllers=controllers, parent=parent, own=own)
    return CgroupSupport(version=2, hierarchies=(hierarchy,), swap_accounted=(parent / "memory.swap.max").exists()), ""


def _enable_v2(folder: Path, enable: str) -> None:
    """Enable controllers for ``folder``'s children; first move the processes of ``folder``
    itself into a leaf when cgroup v2's no-internal-processes rule requires it."""
    try:
        _write(folder / "cgroup.subtree_control", enable)
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
    leaf = folder / BOT_LEAF
    leaf.mkdir(exist_ok=True)
    for _ in range(100):  # a process may fork while we move the others
        pids = _read_pids(folder / "cgroup.procs")
        if not pids:
            break
        for pid in pids:
            try:
                _write(leaf / "cgroup.procs", str(pid))
            except ProcessLookupError:
                pass
    log.info("cgroup v2: moved the processes of %s into %s (controllers need an empty parent)", folder, leaf)
    _write(folder / "cgroup.subtree_control", enable)


def _detect_v1(own: dict[str, str], mounts: list[Mount]) -> tuple[CgroupSupport | None, str]:
    hierarchies: list[Hierarchy] = []
    problems: list[str] = []
    swap = False
    for mount in mounts:
        controllers = tuple(name for name in CONTROLLERS if name in mount.options)
        if not controllers or any(name in h.controllers for h in hierarchies for name in controllers):
            continue  # not ours, or a second mount of a hierarchy already found
        path = own.get(controllers[0])
        folder = None if path is None else _place(mount, path)
        if path is None or folder is None:
            problems.append(f"{','.join(controllers)}: the bot's cgroup is not under {mount.point}")
            continue
        parent = folder / PARENT
        try:
            parent.mkdir(exist_ok=True)
            if not os.access(parent, os.W_OK | os.X_OK):  # made earlier by another user (root)
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            if "cpu" in controllers:
                _write(parent / "cpu.shares", str(V1_KERNELS_CPU_SHARES))
        except OSError as exc:
            problems.append(f"{','.join(controllers)}: cannot create {parent} ({exc.strerror or exc})")
            continue
        if "memory" in controllers:
            swap = (parent / "memory.memsw.limit_in_bytes").exists()
        hierarchies.append(Hierarchy(controllers=controllers, parent=parent, own=path))
    if not any(name in h.controllers for h in hierarchies for name in LIMIT_CONTROLLERS):
        return None, "cgroup v1: " + ("; ".join(problems) if problems else "no memory, pids or cpu hierarchy mounted")
    if problems:
        log.warning("cgroup v1: not every controller can be used: %s", "; ".join(problems))
    _remove_stale(tuple(h.parent for h in hierarchies))
    order = {name: index for index, name in enumerate(CONTROLLERS)}
    hierarchies.sort(key=lambda h: order[h.controllers[0]])
    return CgroupSupport(version=1, hierarchies=tuple(hierarchies), swap_accounted=swap), ""


def _remove_stale(parents: tuple[Path, ...]) -> None:
    """Remove kernel cgroups left by a bot process that no longer runs (and their processes).
    A kernel's folders in every hierarchy go together: its processes may be frozen (the bot
    died between turns), and only its freezer folder can thaw them so that they die."""
    stale: dict[str, list[Path]] = {}
    for parent in parents:
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.startswith(KERNEL_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            owner = entry.name[len(KERNEL_PREFIX) :].split("-", 1)[0]
            if owner.isdigit() and not psutil.pid_exists(int(owner)):
                stale.setdefault(entry.name, []).append(Path(entry.path))
    for name, folders in stale.items():
        if KernelCgroup(tuple(folders)).remove():
            log.info("removed the cgroup %s of a bot process that is gone", name)


class KernelCgroup:
    """One kernel's cgroup: a folder per hierarchy (v1) or one folder (v2)."""

    def __init__(self, folders: tuple[Path, ...]) -> None:
        self.folders = folders
        # Paths made up front: enter() runs between fork and exec and should allocate little.
        self._procs = tuple(os.fsencode(folder / "cgroup.procs") for folder in folders)
        self._freezer = _freezer_of(folders)
        self._cpu_usage = _cpu_usage_of(folders)

    @property
    def can_freeze(self) -> bool:
        """Whether the cgroup has a freezer (v1 ``freezer.state``, v2 ``cgroup.freeze``)."""
        return self._freezer is not None

    def freeze(self, timeout: float = FREEZE_TIMEOUT_S) -> bool:
        """(Blocking) stop every process and thread of the cgroup, those it starts later too;
        True once all are frozen (False: no freezer, or still freezing after ``timeout``)."""
        if self._freezer is None:
            return False
        control, frozen, _, state, done = self._freezer
        _write(control, frozen)
        deadline = time.monotonic() + timeout
        delay = 0.0002
        while True:
            try:
                if done in state.read_text():
                    return True
            except OSError:
                return False
            if time.monotonic() > deadline:
                log.warning("%s is still freezing after %.1f s", control.parent, timeout)
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def thaw(self) -> None:
        """(Blocking) let the cgroup's processes run again (nothing without a freezer)."""
        if self._freezer is not None:
            control, _, thawed, _, _ = self._freezer
            _write(control, thawed)

    def cpu_seconds(self) -> float | None:
        """(Blocking) CPU time every process of the cgroup has used, those that ended too
        (v1 ``cpuacct.usage``, v2 ``cpu.stat`` ``usage_usec``); None without accounting."""
        if self._cpu_usage is None:
            return None
        path, scale = self._cpu_usage
        try:
            text = path.read_text()
        except OSError:
            return None
        if path.name == "cpu.stat":
            text = next((line.split()[1] for line in text.splitlines() if line.startswith("usage_usec ")), "0")
        return int(text.strip() or 0) * scale

    def enter(self) -> None:
        """Move the calling process into the cgroup (safe in a ``preexec_fn``)."""
        for path in self._procs:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def add_tree(self, pid: int) -> None:
        """(Blocking) move ``pid`` and all its descendants into the cgroup."""
        moved: set[int] = set()
        for _ in range(20):  # until no new descendant shows up
            tree = set(proctree.pids(pid))
            if not tree:
                return
            new = tree - moved
            if not new:
                return
            for member in sorted(new):
                for path in self._procs:
                    try:
                        _write(Path(os.fsdecode(path)), str(member))
                    except ProcessLookupError:
                        break
            moved |= new

    def add(self, pid: int) -> None:
        """(Blocking) move the one process ``pid`` (one that has started none yet) into the cgroup."""
        for path in self._procs:
            _write(Path(os.fsdecode(path)), str(pid))

    def pids(self) -> set[int]:
        """(Blocking) the processes in the cgroup now (never zombies)."""
        return _read_pids(Path(os.fsdecode(self._procs[0])))

    def oom_kills(self) -> int:
        """(Blocking) how many processes the OOM killer took in this cgroup (0 without a memory
        controller or when unreadable)."""
        for folder in self.folders:
            for name in ("memory.oom_control", "memory.events"):  # v1, v2
                try:
                    text = (folder / name).read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

    def kill(self, keep: frozenset[int] = frozenset(), timeout: float = KILL_TIMEOUT_S) -> int:
        """(Blocking) SIGKILL every process in the cgroup but ``keep`` until none is left
        (or ``timeout``); returns how many were killed. Never signals a process outside:
        each pid is pinned by a pidfd and checked to still be a member before the signal."""
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        try:
            self.thaw()  # a frozen process takes a SIGKILL only once thawed (cgroup v1)
        except OSError:
            pass
        while True:
            try:
                targets = self.pids() - keep
            except OSError:
                break
            if not targets:
                break
            handles: dict[int, int] = {}
            try:
                for pid in targets:
                    try:
                        handles[pid] = os.pidfd_open(pid)
                    except ProcessLookupError:
                        continue
                members = self.pids()
                for pid, fd in handles.items():
                    if pid in members:
                        try:
                            signal.pidfd_send_signal(fd, signal.SIGKILL)
                            killed.add(pid)
                        except ProcessLookupError:
                            pass
            finally:
                for fd in handles.values():
                    os.close(fd)
            if time.monotonic() > deadline:
                log.warning("processes kept appearing in %s while they were killed", self.folders[0])
                break
            time.sleep(0.002)
        return len(killed)

    def remove(self, timeout: float = REMOVE_TIMEOUT_S) -> bool:
        """(Blocking) kill whatever is left in the cgroup and remove its folders, retrying
        while dying processes leave; a failure is logged and returns False, never raises."""
        deadline = time.monotonic() + timeout
        remaining = [folder for folder in self.folders if folder.exists()]
        delay = 0.002
        while remaining:
            try:
                self.kill(timeout=max(0.0, deadline - time.monotonic()))
            except OSError:
                pass
            for folder in list(remaining):
                try:
                    folder.rmdir()
                    remaining.remove(folder)
                except FileNotFoundError:
                    remaining.remove(folder)
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.error("could not remove the kernel cgroup %s: %s", folder, exc)
                        return False
            if remaining:
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        return True


def _freezer_of(folders: tuple[Path, ...]) -> tuple[Path, str, str, Path, str] | None:
    """(control file, frozen value, thawed value, state file, state text once frozen) of the
    cgroup's freezer, or None."""
    for folder in folders:
        if (folder / "freezer.state").exists():  # v1
            return folder / "freezer.state", "FROZEN", "THAWED", folder / "freezer.state", "FROZEN"
        if (folder / "cgroup.freeze").exists():  # v2
            return folder / "cgroup.freeze", "1", "0", folder / "cgroup.events", "frozen 1"
    return None


def _cpu_usage_of(folders: tuple[Path, ...]) -> tuple[Path, float] | None:
    """The file that counts the cgroup's CPU time and its unit in seconds, or None."""
    for folder in folders:
        if (folder / "cpuacct.usage").exists():  # v1, nanoseconds
            return folder / "cpuacct.usage", 1e-9
        if (folder / "cgroup.freeze").exists() and (folder / "cpu.stat").exists():  # v2, microseconds
            return folder / "cpu.stat", 1e-6
    return None


class Cgroups:
    """Makes and removes per-kernel cgroups with the limits of one bot's settings."""

    def __init__(self, support: CgroupSupport | None, *, memory_mb: int, max_processes: int, reason: str = "") -> None:
        """``support``: from :func:`detect` (None: no cgroups, ``reason`` says why)."""
        self.support = support
        self.memory_bytes = memory_mb * MiB
        self.max_processes = max_processes
        self.reason = reason

    @classmethod
    def detected(cls, *, memory_mb: int, max_processes: int) -> Cgroups:
        """(Blocking the first time in a process) cgroups as this host allows them."""
        support, reason = detected()
        return cls(support, memory_mb=memory_mb, max_processes=max_processes, reason=reason)

    @property
    def enabled(self) -> bool:
        """Whether kernels get cgroups."""
        return self.support is not None

    @property
    def caps_memory(self) -> bool:
        """Whether each kernel's cgroup caps its memory (tmpfs files it writes included)."""
        return self.support is not None and "memory" in self.support.controllers

    def describe(self) -> str:
        """One line for people (``status`` shows it to chat users, so it names no host path):
        which isolation is in force, e.g. ``cgroup v1 (memory 640 MiB, pids 64, cpu weight 1/2
        of the bot); rlimits`` or ``rlimits only (no cgroup)``; :meth:`where` says the rest."""
        support = self.support
        if support is None:
            return "rlimits only (no cgroup)"
        parts = {
            "memory": f"memory {self.memory_bytes // MiB} MiB" + (" incl. swap" if support.swap_accounted else ""),
            "pids": f"pids {self.max_processes}",
            "cpu": "cpu weight 1/2 of the bot",
            "freezer": "frozen between turns",
            "cpuacct": "CPU time counted",
        }
        always = ("freezer", "cpuacct") if support.version == 2 else ()  # core files of every v2 cgroup
        used = ", ".join(parts[name] for name in (*support.controllers, *always))
        return f"cgroup v{support.version} ({used}); rlimits"

    def where(self) -> str:
        """For the start-up log only (host paths): where kernels' cgroups are made, e.g.
        ``beneath /user.slice/threadbook``, or why none can be."""
        if self.support is None:
            return f"none ({self.reason or 'not detected'})"
        return "beneath " + ", ".join(dict.fromkeys(_shown(h) for h in self.support.hierarchies))

    def create(self, kernel_id: str) -> KernelCgroup | None:
        """(Blocking) a new cgroup for one kernel with its limits set; None without cgroups.
        Raises ``OSError`` (after removing what it made) when it cannot be made."""
        support = self.support
        if support is None:
            return None
        name = f"{KERNEL_PREFIX}{os.getpid()}-{kernel_id}"
        made: list[Path] = []
        try:
            for hierarchy in support.hierarchies:
                folder = hierarchy.parent / name
                folder.mkdir()
                made.append(folder)
                self._limit(support.version, hierarchy.controllers, folder)
        except OSError:
            KernelCgroup(tuple(made)).remove()
            raise
        return KernelCgroup(tuple(made))

    def _limit(self, version: int, controllers: tuple[str, ...], folder: Path) -> None:
        if "memory" in controllers:
            if version == 1:
                _write(folder / "memory.limit_in_bytes", str(self.memory_bytes))
                if (folder / "memory.memsw.limit_in_bytes").exists():  # after the limit: memsw >= limit
                    _write(folder / "memory.memsw.limit_in_bytes", str(self.memory_bytes))
            else:
                _write(folder / "memory.max", str(self.memory_bytes))
                if (folder / "memory.swap.max").exists():
                    _write(folder / "memory.swap.max", "0")
        if "pids" in controllers:
            _write(folder / "pids.max", str(self.max_processes))


def _shown(hierarchy: Hierarchy) -> str:
    own = hierarchy.own.rstrip("/")
    return f"{own}/{PARENT}"
