"""The quota probe and the watchdog around it, with a stand-in kernel and a stand-in count of
the file system's used bytes (no real kernel, no real flood: nothing here writes more than a
few KiB)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kernels.host.workspace import Workspace
from kernels.session import quota_probe
from kernels.session.execution import WATCHDOG_INTERVAL_S, QuotaWatch, Watchdog

pytestmark = pytest.mark.timeout(30)
MiB = 2**20


class FakeKernel:
    """What the watchdog and the probe ask of a kernel: alive, interruptible, freezable."""

    def __init__(self) -> None:
        self.frozen = False
        self.freezes = 0
        self.interrupts = 0

    async def is_alive(self) -> bool:
        return True

    async def interrupt(self) -> None:
        self.interrupts += 1

    def freeze_blocking(self) -> bool:
        self.frozen = True
        self.freezes += 1
        return True

    async def thaw(self) -> bool:
        self.frozen = False
        return True


class FakeDisk:
    """The file system's used bytes, as the probe reads them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.used = 0
        monkeypatch.setattr(quota_probe, "_used_bytes", lambda *_: self.used)


async def soon(condition: Callable[[], bool], within: float = 2.0) -> None:
    end = time.monotonic() + within
    while not condition():
        assert time.monotonic() < end, "not within the time"
        await asyncio.sleep(0.002)


async def start(workspace: Workspace, kernel: FakeKernel) -> QuotaWatch:
    return await QuotaWatch.start(workspace, workspace.scan(), kernel, thaw=kernel.thaw, frozen=lambda: None)


async def test_a_kernel_the_probe_froze_after_a_timeout_is_thawed_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FakeDisk(monkeypatch)
    workspace = Workspace(tmp_path, max_file_bytes=MiB, quota_bytes=MiB)
    kernel = FakeKernel()
    quota = await start(workspace, kernel)
    watchdog = Watchdog(kernel, grace=0.5, key="t")  # type: ignore[arg-type]
    watchdog.arm(time.monotonic(), 0.0, quota)
    await watchdog.cell_started()
    try:
        # Execution._wait's loop while the kernel sends nothing
        assert await watchdog.look(now := time.monotonic()) is None  # timed out: interrupted
        assert watchdog.interrupted_at is not None and kernel.interrupts == 1
        # While the loop waits, another writer on the file system trips the probe: it freezes the kernel.
        disk.used += 2 * MiB
        await soon(lambda: quota.tripped)
        assert kernel.frozen
        await asyncio.sleep(max(watchdog.until(now) - time.monotonic(), 0.001))
        while (end := await watchdog.look(now := time.monotonic())) is None and kernel.frozen:
            await asyncio.sleep(max(watchdog.until(now) - now, 0.001))
        assert end is None, "a frozen kernel within its quota was declared stuck"
        assert not kernel.frozen  # thawed: the SIGINT it holds reaches it now
        assert time.monotonic() < watchdog.interrupted_at + 0.5
    finally:
        await watchdog.disarm()


def sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes (what the walk counts) that takes no room on the disk."""
    with open(path, "wb") as f:
        f.truncate(size)


async def test_an_over_quota_workspace_that_shrank_grows_back_without_a_trip_per_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FakeDisk(monkeypatch)
    workspace = Workspace(tmp_path, max_file_bytes=4 * MiB, quota_bytes=MiB)
    sparse(tmp_path / "old.bin", 2 * MiB)  # over the quota before the cell
    kernel = FakeKernel()
    quota = await start(workspace, kernel)
    try:
        # The cell deletes 2 MiB and writes 1.5 MiB back: still under what it had, so allowed.
        (tmp_path / "old.bin").unlink()
        sparse(tmp_path / "new.bin", 3 * MiB // 2)
        disk.used += 4096  # no room at all at the start: the first write trips
        await soon(lambda: quota.tripped)
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
        assert await quota.after_trip() is None and not kernel.frozen and not quota.tripped
        # 0.5 MiB of room is left (up to the 2 MiB it had): a small write trips nothing.
        disk.used += 4096
        await asyncio.sleep(0.1)
        assert not quota.tripped and kernel.freezes == 1
    finally:
        await quota.stop()


async def test_the_probe_is_re_armed_once_per_watchdog_tick_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FakeDisk(monkeypatch)
    workspace = Workspace(tmp_path, max_file_bytes=MiB, quota_bytes=MiB)
    kernel = FakeKernel()
    quota = await start(workspace, kernel)
    walks = 0
    scan = workspace.scan

    def counted_scan() -> object:
        nonlocal walks
        walks += 1
        return scan()

    monkeypatch.setattr(workspace, "scan", counted_scan)
    try:
        for _ in range(2):
            armed = time.monotonic()
            disk.used += 2 * MiB  # another writer: the file system grew past the room, not the workspace
            await soon(lambda: quota.tripped)
            assert await quota.after_trip() is None  # too soon after arming: no walk, still frozen
            assert kernel.frozen and quota.tripped and walks == 0
            await asyncio.sleep(max(armed + WATCHDOG_INTERVAL_S - time.monotonic(), 0) + 0.01)
            assert await quota.after_trip() is None  # a tick later: walked, within quota, thawed
            assert not kernel.frozen and not quota.tripped and walks == 1
            walks = 0
    finally:
        await quota.stop()


async def test_a_freeze_that_fails_still_trips_the_probe_and_it_goes_on_looking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FakeDisk(monkeypatch)
    calls = 0

    def failing_freeze() -> bool:
        nonlocal calls
        calls += 1
        raise OSError("cgroup.freeze: no such device")

    probe = quota_probe.QuotaProbe(tmp_path, MiB, failing_freeze)
    try:
        for n in (1, 2):
            disk.used += 2 * MiB
            await soon(probe.tripped.is_set)  # fail closed: the session walks (and stops) the kernel
            assert calls == n
            probe.rearm(MiB)  # within quota after all: the probe still looks
    finally:
        await asyncio.to_thread(probe.stop)


async def test_a_stopped_probe_freezes_nothing_afterwards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = FakeDisk(monkeypatch)
    state = {"frozen": False, "stopped": False, "frozen_after_stop": False}

    def slow_freeze() -> bool:
        time.sleep(0.2)  # a cgroup freeze waits until every process has stopped
        state["frozen"] = True
        state["frozen_after_stop"] = state["stopped"]
        return True

    probe = quota_probe.QuotaProbe(tmp_path, MiB, slow_freeze)
    disk.used += 2 * MiB
    await asyncio.sleep(0.05)  # the freeze is under way
    await asyncio.to_thread(probe.stop)
    state["stopped"] = True  # the session thaws the kernel now
    await asyncio.sleep(0.3)
    assert state["frozen"] and not state["frozen_after_stop"]
