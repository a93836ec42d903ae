"""Nothing runs between turns: what a cell leaves running is killed when it returns (real,
unsandboxed kernels; with the host's cgroups where the test may make them, and without)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from kernels import KernelLauncher, KernelOptions, KernelPool, build_pool
from kernels.forking.launcher import ForkingLauncher
from kernels.host.cgroups import Cgroups, detected
from tests.kernels.conftest import kernel_settings

#: Starts a child and a daemon that leaves the tree (setsid, double fork); prints their pids.
LEAVE_TWO = """
import json, subprocess, time
child = subprocess.Popen(['sleep', '300'])
daemon = subprocess.run(['sh', '-c', 'setsid sleep 301 </dev/null >/dev/null 2>&1 & echo $!'],
                        capture_output=True, text=True).stdout.strip()
time.sleep(0.1)
print(json.dumps([child.pid, int(daemon)]))
"""


def _running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


async def test_leftovers_are_killed_when_the_cell_returns(tmp_path: Path) -> None:
    pool = build_pool(kernel_settings(tmp_path))
    pids: list[int] = []
    try:
        session = await pool.get_or_start("t:leftovers")
        quiet = await session.execute("import subprocess; subprocess.run(['true']).returncode")
        assert quiet.ok and quiet.notice is None, "a cell that leaves nothing gets no notice"
        result = await session.execute(LEAVE_TWO)
        pids = json.loads(result.stdout)
        cgroups = pool.launcher.spawner.cgroups.enabled
        expected = 2 if cgroups else 1  # without a cgroup the double-forked daemon is out of reach
        assert result.notice == f"{expected} background process(es) left by this code were stopped.", result.notice
        assert not _running(pids[0])
        if cgroups:
            assert not _running(pids[1])
        after = await session.execute("1 + 1")
        assert after.result == "2" and not after.kernel_restarted and after.notice is None
    finally:
        await pool.shutdown_all()
        _kill(pids)


async def test_a_channel_may_allow_background_processes(tmp_path: Path) -> None:
    pool = build_pool(kernel_settings(tmp_path))
    pids: list[int] = []
    try:
        session = await pool.get_or_start("t:background", KernelOptions(background_processes=True))
        result = await session.execute(LEAVE_TWO)
        pids = json.loads(result.stdout)
        assert result.notice is None and all(_running(pid) for pid in pids)
        await pool.shutdown("t:background")
        if pool.launcher.spawner.cgroups.enabled:  # the kernel's cgroup takes even the daemon along
            deadline = time.monotonic() + 5
            while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not any(_running(pid) for pid in pids)
    finally:
        await pool.shutdown_all()
        _kill(pids)


async def test_without_cgroups_the_process_tree_is_used(tmp_path: Path) -> None:
    settings = kernel_settings(tmp_path)
    none = Cgroups(None, memory_mb=settings.memory_mb, max_processes=settings.max_processes, reason="test")
    launcher = KernelLauncher(settings, cgroups=none)
    assert launcher.isolation == "rlimits only (no cgroup)" and launcher.spawner.cgroups.where() == "none (test)"
    pool = KernelPool(settings, launcher=launcher)
    pids: list[int] = []
    try:
        session = await pool.get_or_start("t:tree")
        assert session._handle is not None and session._handle.cgroup is None
        result = await session.execute("import subprocess; print(subprocess.Popen(['sleep', '300']).pid)")
        pids = [int(result.stdout)]
        assert result.notice == "1 background process(es) left by this code were stopped."
        assert not _running(pids[0])
    finally:
        await pool.shutdown_all()
        _kill(pids)


@pytest.mark.skipif(detected()[0] is None, reason=f"no per-kernel cgroups here: {detected()[1]}")
async def test_kernels_start_in_their_cgroup_with_a_high_oom_score(tmp_path: Path) -> None:
    pool = build_pool(kernel_settings(tmp_path, memory_mb=512, max_processes=64))
    folders: tuple[Path, ...] = ()
    try:
        session = await pool.get_or_start("t:cgroup")
        handle = session._handle
        assert handle is not None and handle.cgroup is not None and handle.pid is not None
        assert handle.infrastructure == {handle.pid} == handle.cgroup.pids()
        assert Path(f"/proc/{handle.pid}/oom_score_adj").read_text().strip() == "1000"
        assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"
        folders = handle.cgroup.folders
        assert "cgroup v" in pool.launcher.isolation and "memory 512 MiB" in pool.launcher.isolation
    finally:
        await pool.shutdown_all()
    assert not any(folder.exists() for folder in folders), "the cgroup outlived its kernel"


def test_background_processes_do_not_change_how_kernels_start(tmp_path: Path) -> None:
    """A forked (or warm) kernel started for the default options serves a channel that allows
    background processes: only the session acts on it."""
    launcher = ForkingLauncher(KernelLauncher(kernel_settings(tmp_path)))
    assert launcher.fits(launcher.plan(tmp_path, KernelOptions(background_processes=True)))
    assert not launcher.fits(launcher.plan(tmp_path, KernelOptions(network=True, background_processes=True)))
    assert KernelOptions(background_processes=True).for_launch() == KernelOptions()


def test_the_launcher_walks_the_same_process_tree_as_the_sweep() -> None:
    """``descendants_of`` (kill) and ``tree_pss`` (memory) walk :func:`leftovers.process_tree`:
    the root's descendants without the root, and nothing for a process that is gone."""
    from kernels.host.leftovers import process_tree
    from kernels.spawn import handle, process

    child = subprocess.Popen(["sleep", "300"])
    try:
        me = psutil.Process().pid
        assert child.pid in [proc.pid for proc in process.descendants_of(me)]
        assert me not in [proc.pid for proc in process.descendants_of(me)]
        assert [proc.pid for proc in process_tree(child.pid)] == [child.pid]
        assert process.descendants_of(child.pid) == []
        assert (handle.tree_pss(child.pid) or 0) > 0
    finally:
        child.kill()
        child.wait()
    assert process.descendants_of(child.pid) == [] and handle.tree_pss(child.pid) is None
    assert process.descendants_of(None) == [] and handle.tree_pss(None) is None
