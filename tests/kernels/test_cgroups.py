"""Per-kernel cgroups against the real ``/sys/fs/cgroup``: detection, limits, membership,
killing, removal; and the parsing of ``/proc/self/cgroup`` and ``mountinfo``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kernels.host.cgroups import (
    KERNEL_PREFIX,
    PARENT,
    Cgroups,
    CgroupSupport,
    KernelCgroup,
    _mounts,
    _own_cgroups,
    _place,
    detect,
    detected,
)

SUPPORT, REASON = detected()
needs_cgroups = pytest.mark.skipif(
    SUPPORT is None, reason=f"no per-kernel cgroups on this machine (run as root with cgroups): {REASON}"
)
MiB = 2**20


def _file(cgroup: KernelCgroup, *names: str) -> Path:
    """The first of ``names`` that exists in one of the cgroup's folders."""
    for folder in cgroup.folders:
        for name in names:
            if (folder / name).exists():
                return folder / name
    raise AssertionError(f"none of {names} in {cgroup.folders}")


@pytest.fixture
def cgroup() -> Iterator[KernelCgroup]:
    assert SUPPORT is not None
    made = Cgroups(SUPPORT, memory_mb=96, max_processes=16).create(f"test-{uuid.uuid4().hex[:8]}")
    assert made is not None
    yield made
    made.remove()


def _sleeper(cgroup: KernelCgroup, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv or ["sleep", "60"], preexec_fn=cgroup.enter)


def test_own_cgroups_and_mounts_are_parsed() -> None:
    own = _own_cgroups("12:pids:/user.slice\n4:cpu,cpuacct:/user.slice\n3:memory:/docker/abc\n0::/init.scope\n")
    assert own == {
        "pids": "/user.slice",
        "cpu": "/user.slice",
        "cpuacct": "/user.slice",
        "memory": "/docker/abc",
        "": "/init.scope",
    }
    mountinfo = (
        "30 25 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        "35 25 0:31 /docker/abc /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory\n"
        "36 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "37 25 0:33 / /mnt/with\\040space rw - cgroup cgroup rw,pids\n"
        "38 25 8:1 / / rw - ext4 /dev/sda1 rw\n"
    )
    mounts = _mounts(mountinfo)
    assert [(m.fstype, str(m.point)) for m in mounts] == [
        ("cgroup2", "/sys/fs/cgroup/unified"),
        ("cgroup", "/sys/fs/cgroup/memory"),
        ("cgroup", "/sys/fs/cgroup/cpu,cpuacct"),
        ("cgroup", "/mnt/with space"),
    ]
    # A container's mount shows its own cgroup as the root of the hierarchy.
    assert _place(mounts[1], "/docker/abc") == Path("/sys/fs/cgroup/memory")
    assert _place(mounts[1], "/docker/abc/sub") == Path("/sys/fs/cgroup/memory/sub")
    assert _place(mounts[1], "/other") is None
    assert _place(mounts[2], "/user.slice") == Path("/sys/fs/cgroup/cpu,cpuacct/user.slice")


def test_nothing_mounted_means_rlimits_only() -> None:
    support, reason = detect(proc_cgroup="0::/\n", mountinfo="38 25 8:1 / / rw - ext4 /dev/sda1 rw\n")
    assert support is None and "not mounted" in reason
    cgroups = Cgroups(support, memory_mb=640, max_processes=64, reason=reason)
    assert not cgroups.enabled and cgroups.create("x") is None
    # People (`status`) are told which isolation holds, the start-up log why: no path for the former.
    assert cgroups.describe() == "rlimits only (no cgroup)"
    assert cgroups.where().startswith("none (cgroup v2: not mounted")


@needs_cgroups
def test_detection_finds_the_bots_own_cgroups() -> None:
    assert SUPPORT is not None
    assert "memory" in SUPPORT.controllers
    own = _own_cgroups(Path("/proc/self/cgroup").read_text())
    for hierarchy in SUPPORT.hierarchies:
        assert hierarchy.parent.name == PARENT and hierarchy.parent.is_dir()
        key = "" if SUPPORT.version == 2 else hierarchy.controllers[0]
        assert hierarchy.own == own[key], "kernels' cgroups must live beneath the bot's own"
    cgroups = Cgroups(SUPPORT, memory_mb=640, max_processes=64)
    line = cgroups.describe()
    assert line.startswith(f"cgroup v{SUPPORT.version} (memory 640 MiB") and line.endswith("; rlimits")
    assert "/" not in line.replace("1/2", ""), "a host path in what `status` shows"
    assert cgroups.where().startswith("beneath /") and cgroups.where().endswith(f"/{PARENT}")
    assert detect()[0] == SUPPORT  # detecting again finds the same (the folders exist now)


@needs_cgroups
def test_a_kernel_cgroup_has_its_limits(cgroup: KernelCgroup) -> None:
    assert SUPPORT is not None
    assert len(cgroup.folders) == len(SUPPORT.hierarchies)
    assert int(_file(cgroup, "memory.limit_in_bytes", "memory.max").read_text()) == 96 * MiB
    if SUPPORT.swap_accounted:
        swap = _file(cgroup, "memory.memsw.limit_in_bytes", "memory.swap.max").read_text().strip()
        assert swap in (str(96 * MiB), "0")
    if "pids" in SUPPORT.controllers:
        assert _file(cgroup, "pids.max").read_text().strip() == "16"
    if "cpu" in SUPPORT.controllers:
        parent = _file(cgroup, "cpu.shares", "cpu.weight").parent.parent
        assert (parent / "cpu.shares").exists() or (parent / "cpu.weight").exists()
        mine = _file(cgroup, "cpu.shares", "cpu.weight")
        kernels = int((parent / mine.name).read_text())
        assert kernels < int(mine.read_text()), "all kernels together weigh less than one kernel's default"


@needs_cgroups
def test_processes_enter_are_killed_and_the_cgroup_is_removed(cgroup: KernelCgroup) -> None:
    first = _sleeper(cgroup)
    second = subprocess.Popen(["sleep", "60"])  # outside: must survive
    try:
        deadline = time.monotonic() + 5
        while cgroup.pids() != {first.pid} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cgroup.pids() == {first.pid}
        assert cgroup.kill(keep=frozenset({first.pid})) == 0 and first.poll() is None
        assert cgroup.kill() == 1
        assert first.wait(5) == -9 and second.poll() is None
        assert cgroup.pids() == set()
        third = _sleeper(cgroup)
        assert cgroup.remove() and not any(folder.exists() for folder in cgroup.folders)
        assert third.wait(5) == -9, "remove() kills what is left first"
        assert cgroup.remove(), "removing twice is fine"
    finally:
        second.kill()
        second.wait()


@needs_cgroups
def test_a_process_tree_is_moved_and_double_forks_are_caught(cgroup: KernelCgroup) -> None:
    tree = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & exec sleep 60"])
    try:
        time.sleep(0.2)
        cgroup.add_tree(tree.pid)
        members = cgroup.pids()
        assert tree.pid in members and len(members) == 3
        # A daemon that leaves the tree (setsid + double fork) stays a member.
        subprocess.run(["sh", "-c", "setsid sleep 61 &"], preexec_fn=cgroup.enter, check=True)
        time.sleep(0.2)
        assert len(cgroup.pids()) == 4
        assert cgroup.kill(keep=frozenset({tree.pid})) == 3
        assert cgroup.pids() == {tree.pid}
    finally:
        tree.kill()
        tree.wait()


@needs_cgroups
def test_memory_of_all_processes_counts_and_oom_kills_are_seen(cgroup: KernelCgroup) -> None:
    code = (
        "import mmap; m = mmap.mmap(-1, 256 * 2**20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n"
        "for i in range(0, len(m), 4096): m[i] = 1"
    )
    done = subprocess.run([sys.executable, "-c", code], preexec_fn=cgroup.enter, capture_output=True, timeout=60)
    assert done.returncode == -9, "256 MiB of shared memory in a 96 MiB cgroup"
    assert cgroup.oom_kills() >= 1


@needs_cgroups
def test_cgroups_of_a_dead_bot_are_removed_at_detection() -> None:
    assert SUPPORT is not None
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = [h.parent / f"{KERNEL_PREFIX}{gone.pid}-{uuid.uuid4().hex[:8]}" for h in SUPPORT.hierarchies]
    alive = [h.parent / f"{KERNEL_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}" for h in SUPPORT.hierarchies]
    for folder in [*stale, *alive]:
        folder.mkdir()
    try:
        support, _ = detect()
        assert isinstance(support, CgroupSupport)
        assert not any(folder.exists() for folder in stale)
        assert all(folder.exists() for folder in alive), "a live bot's cgroups are left alone"
    finally:
        KernelCgroup(tuple(alive)).remove()


@needs_cgroups
def test_a_dead_bots_frozen_kernel_is_killed_and_removed_at_detection() -> None:
    """A bot killed between turns leaves its kernels frozen (a SIGKILL waits for the thaw):
    the next bot's detection thaws them through their freezer folder, kills and removes them."""
    assert SUPPORT is not None
    gone = subprocess.Popen(["true"])
    gone.wait()
    name = f"{KERNEL_PREFIX}{gone.pid}-{uuid.uuid4().hex[:8]}"
    folders = tuple(h.parent / name for h in SUPPORT.hierarchies)
    for folder in folders:
        folder.mkdir()
    kernel = KernelCgroup(folders)
    # An orphan, as a dead bot's kernel is (its parent, init, reaps it once it dies).
    shell = subprocess.run(
        ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
        preexec_fn=kernel.enter,
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = psutil.Process(int(shell.stdout))
    try:
        if not (kernel.can_freeze and kernel.freeze()):
            pytest.skip("no freezer here")
        orphan.kill()  # pending until thawed, like the pdeathsig of a dead bot's kernel
        time.sleep(0.1)
        assert orphan.is_running() and orphan.status() != psutil.STATUS_ZOMBIE
        started = time.monotonic()
        support, _ = detect()
        assert isinstance(support, CgroupSupport)
        assert not any(folder.exists() for folder in kernel.folders)
        assert time.monotonic() - started < 5  # each folder alone would wait for its kill timeout
        assert not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE
    finally:
        kernel.remove()
