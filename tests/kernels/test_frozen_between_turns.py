"""Nothing of a thread runs between its turns: the attacks of an independent run, as tests.

A Python thread started by a cell used to keep running after the cell returned: it wrote
past the workspace quota and spun the CPU while ``usage`` counted nothing. Now the kernel is
frozen whenever no work holds its session, its CPU time is what its processes really used,
and a writer as fast as the disk allows is stopped within twice the quota. Real kernels:
spawned, bubblewrap-sandboxed, forked from the sandboxed fork server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from kernels import KernelPool, build_pool
from kernels.seam.result import Outcome
from tests.kernels.conftest import kernel_settings
from tests.kernels.test_snapshots import SOURCES
from tests.security.conftest import SKIP_REASON

pytestmark = pytest.mark.timeout(120)
MiB = 2**20
QUOTA_MB = 64
KINDS = ["spawn", "bwrap", "fork"]

#: A thread that writes 1 MiB every 5 ms into the workspace, up to 300 MiB, after the cell returns.
BACKGROUND_WRITER = """
import threading, time
def write():
    with open("grow.bin", "wb", buffering=0) as f:
        for _ in range(300):
            f.write(b"0" * (1 << 20))
            time.sleep(0.005)
threading.Thread(target=write, daemon=True).start()
"""
BACKGROUND_SPINNER = """
import threading
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
"""
#: Two processes spinning for a second each, in parallel: about 2 s of CPU in 1 s of wall time.
TWO_CPU_SECONDS = """
import subprocess, sys
spin = "import time\\nend = time.process_time() + 1.0\\nwhile time.process_time() < end: pass"
procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
print([p.wait() for p in procs])
"""
#: As fast as the disk allows, 16 MiB per file (no single file meets the per-file limit).
FAST_WRITER = """
chunk = b"0" * (1 << 20)
n = 0
while True:
    with open(f"flood-{n // 16}.bin", "ab", buffering=0) as f:
        f.write(chunk)
    n += 1
"""
SINGLE_FILE_WRITER = """
chunk = b"0" * (1 << 20)
with open("one.bin", "wb", buffering=0) as f:
    while True:
        f.write(chunk)
"""


@pytest_asyncio.fixture(params=KINDS)
async def pool(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KernelPool]:
    if request.param != "spawn" and SKIP_REASON:
        pytest.skip(SKIP_REASON)
    settings = kernel_settings(tmp_path, workspace_quota_mb=QUOTA_MB, max_file_mb=1024, **SOURCES[request.param])
    kernel_pool = build_pool(settings)
    await kernel_pool.start()
    yield kernel_pool
    await kernel_pool.shutdown_all()


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def settled(pool: KernelPool) -> None:
    """Wait for the after-turn save (the kernel is thawed while it saves, bounded by the quota)."""
    for _ in range(200):
        if not pool._saves:
            return
        await asyncio.sleep(0.05)


async def test_a_thread_a_cell_started_writes_nothing_between_turns(pool: KernelPool) -> None:
    async with pool.lease("t:writer") as session:
        assert (await session.execute(BACKGROUND_WRITER)).ok
    await settled(pool)
    grown = session.workspace.path / "grow.bin"
    idle_from = size(grown)
    await asyncio.sleep(1.5)  # idle: 300 writes would have happened by now
    assert size(grown) == idle_from
    # Thawed for the next cell, it writes again, and the quota check (which runs while the
    # kernel can run) stops it within twice the quota.
    async with pool.lease("t:writer") as session:
        result = await session.execute("import time\ntime.sleep(3)")
    assert result.outcome is Outcome.DIED and "quota" in (result.notice or "")
    assert size(grown) <= 2 * QUOTA_MB * MiB


async def test_an_idle_thread_uses_no_cpu(pool: KernelPool) -> None:
    async with pool.lease("t:spin") as session:
        assert (await session.execute(BACKGROUND_SPINNER)).ok
    await settled(pool)
    handle = session._handle
    assert handle is not None
    before = await handle.cpu_seconds()
    await asyncio.sleep(2.0)
    after = await handle.cpu_seconds()
    assert before is not None and after is not None
    assert after - before < 0.05, f"an idle kernel used {after - before:.2f} s of CPU in 2 s"


async def test_kernel_seconds_are_the_cpu_time_its_processes_used(pool: KernelPool) -> None:
    async with pool.lease("t:cpu") as session:
        session.take_cpu_seconds()
        result = await session.execute(TWO_CPU_SECONDS)
        assert result.ok and "[0, 0]" in result.stdout
        used = session.take_cpu_seconds()
    assert used is not None and used >= 1.6, used  # both processes' seconds (wall time: about 1 s)


async def test_a_kernel_that_dies_is_billed_for_the_cpu_it_used(pool: KernelPool) -> None:
    spin_then_die = (
        "import os, time\nt = time.process_time()\nwhile time.process_time() - t < 1: pass\nos.kill(os.getpid(), 9)"
    )
    async with pool.lease("t:dies") as session:
        session.take_cpu_seconds()
        result = await session.execute(spin_then_die)
        assert result.outcome is Outcome.DIED
        used = session.take_cpu_seconds()
    assert used is not None and used >= 0.9, used  # its cgroup still counted when it was discarded


async def test_a_writer_as_fast_as_the_disk_is_stopped_within_twice_the_quota(pool: KernelPool) -> None:
    async with pool.lease("t:flood") as session:
        result = await session.execute(FAST_WRITER)
    assert result.outcome is Outcome.DIED and "quota" in (result.notice or "")
    written = sum(size(path) for path in session.workspace.path.glob("flood-*.bin"))
    print(f"flood: {written / MiB:.0f} MiB")
    assert QUOTA_MB * MiB < written <= 2 * QUOTA_MB * MiB, f"{written / MiB:.0f} MiB against a {QUOTA_MB} MiB quota"


async def test_no_single_file_outgrows_the_quota(pool: KernelPool) -> None:
    async with pool.lease("t:one") as session:
        result = await session.execute(SINGLE_FILE_WRITER)
    assert result.outcome is Outcome.ERROR and "File too large" in str(result.error)
    assert size(session.workspace.path / "one.bin") == QUOTA_MB * MiB


#: A cell that replaces the function the bot's after-turn save calls in the kernel.
SWAPPED_SAVE = """
import subprocess, threadbook_kernel.snapshot as snap
_real = snap.save_for_bot
def save_for_bot(max_bytes):
    subprocess.Popen(["sleep", "1017"])
    return _real(max_bytes)
snap.save_for_bot = save_for_bot
x = 1
"""


def sleepers() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if (proc.info["cmdline"] or [])[:2] == ["sleep", "1017"] and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:  # ended while we looked
            continue
    return found


async def test_a_swapped_save_function_leaves_no_process_behind(pool: KernelPool) -> None:
    async with pool.lease("t:swap") as session:
        assert (await session.execute(SWAPPED_SAVE)).ok
    await settled(pool)
    assert session.snapshots.last_save is not None  # the save ran (through the thread's replacement)
    assert sleepers() == []


#: Stops itself at 8 times the quota, so that a regression fails the test without filling the disk.
SAVE_THAT_FLOODS = f"""
import threadbook_kernel.snapshot as snap
def save_for_bot(max_bytes):
    chunk = b"0" * (1 << 20)
    for n in range({8 * QUOTA_MB}):
        with open(f"saved-{{n // 16}}.bin", "ab", buffering=0) as f:
            f.write(chunk)
snap.save_for_bot = save_for_bot
x = 1
"""


async def test_a_save_function_that_floods_the_workspace_is_stopped_at_the_quota(pool: KernelPool) -> None:
    async with pool.lease("t:flood-save") as session:
        assert (await session.execute(SAVE_THAT_FLOODS)).ok
    await settled(pool)
    assert session.workspace.scan().bytes <= 2 * QUOTA_MB * MiB  # the save was watched as a cell is
    assert session.snapshots.last_save is None and pool.get("t:flood-save") is None  # stopped: it left the pool
    async with pool.lease("t:flood-save") as again:  # and the thread hears why
        assert any("quota" in notice for notice in again.take_thread_notices())
