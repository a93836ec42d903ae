"""The quota probe and the watchdog around it, with a stand-in kernel and a stand-in count of
the file system's used bytes (no real kernel, no real flood: nothing here writes more than a
few KiB)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kernels.session import quota_probe
from kernels.session.execution import QuotaWatch, Watchdog
from kernels.workspace import Workspace

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
        watchdog.disarm()
