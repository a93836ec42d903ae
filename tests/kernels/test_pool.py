"""KernelPool and Reaper with real kernels: cap, LRU eviction, concurrency, culling, no orphans."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from kernels import KernelPool, Reaper, build_pool
from kernels.seam.result import QueueFullError, QueueLeftError, QueueTimeoutError
from tests.kernels.conftest import kernel_processes, kernel_settings


@pytest_asyncio.fixture
async def small_pool(tmp_path: Path) -> AsyncIterator[KernelPool]:
    pool = build_pool(
        kernel_settings(
            tmp_path, max_kernels=2, idle_timeout_s=0.3, reap_interval_s=0.1, queue_timeout_s=5, max_queue=2
        )
    )
    yield pool
    await pool.shutdown_all()


def rendezvous(folder: Path, mine: str, theirs: str) -> str:
    """A cell that marks ``mine`` and waits (up to 10 s) for ``theirs``: True only when both run at once."""
    return (
        "import os, time\n"
        f"open({str(folder / mine)!r}, 'w').close()\n"
        "deadline = time.monotonic() + 10\n"
        f"while not os.path.exists({str(folder / theirs)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        f"os.path.exists({str(folder / theirs)!r})"
    )


async def test_same_key_same_session_and_concurrent_sessions(small_pool: KernelPool, tmp_path: Path) -> None:
    a, b = await asyncio.gather(small_pool.get_or_start("p:a"), small_pool.get_or_start("p:b"))
    assert await small_pool.get_or_start("p:a") is a and small_pool.get("p:b") is b
    results = await asyncio.gather(a.execute(rendezvous(tmp_path, "a", "b")), b.execute(rendezvous(tmp_path, "b", "a")))
    assert [r.result for r in results] == ["True", "True"]  # each saw the other: they ran side by side
    one_at_a_time = await asyncio.gather(a.execute("import time; time.sleep(0.3); 1"), a.execute("2"))
    assert [r.result for r in one_at_a_time] == ["1", "2"]


async def test_full_pool_evicts_lru_idle_and_queues_when_all_busy(small_pool: KernelPool) -> None:
    a = await small_pool.get_or_start("p:a")
    await a.execute("v = 1")
    b = await small_pool.get_or_start("p:b")
    await b.execute("v = 2")
    c = await small_pool.get_or_start("p:c")  # evicts a, the least recently used
    assert small_pool.get("p:a") is None and a.state == "stopped" and not await a.is_alive()
    running = [asyncio.ensure_future(s.execute("import time; time.sleep(1.5)")) for s in (b, c)]
    while not (b.busy and c.busy):
        await asyncio.sleep(0.01)
    d = await small_pool.get_or_start("p:d")  # waits for b or c to finish, then takes its place
    assert [small_pool.get(k) is None for k in ("p:b", "p:c")].count(True) == 1  # one of them ended and left
    assert small_pool.queue_stats().recent_waits == 1
    assert (await d.execute("1+1")).result == "2"
    await asyncio.gather(*running)
    again = await small_pool.get_or_start("p:a")  # evicts b now; a's variables come back from its snapshot
    assert again.restored is not None and ("v", "int") in again.restored.restored
    result = await again.execute("v")
    assert result.result == "1" and result.kernel_restarted and "restored" in (result.notice or "")


async def test_queue_is_first_come_first_served_and_leases_hold_their_kernel(small_pool: KernelPool) -> None:
    """Two leased kernels (turns waiting for their model): new threads queue in arrival order,
    each starts when a lease ends; a thread that has a kernel never waits."""
    order: list[str] = []
    places: dict[str, list[int]] = {}

    async def ask(key: str) -> None:
        async def on_wait(ahead: int) -> None:
            places.setdefault(key, []).append(ahead)

        async with small_pool.lease(key, on_wait=on_wait) as session:
            order.append(key)
            await session.execute("1")

    async with small_pool.lease("q:a") as a:
        async with small_pool.lease("q:b"):
            waiting = [asyncio.ensure_future(ask(f"q:{n}")) for n in "cd"]
            while small_pool.queue_stats().waiting < 2:
                await asyncio.sleep(0.01)
            assert (await small_pool.get_or_start("q:a")) is a  # it has its kernel: no queue
            assert not any(task.done() for task in waiting)
        # One lease ended: the first thread in the queue takes that room, the second waits on.
        while small_pool.queue_stats().waiting > 1:
            await asyncio.sleep(0.01)
        assert small_pool.get("q:c") is not None and small_pool.get("q:d") is None
    await asyncio.gather(*waiting)
    assert order == ["q:c", "q:d"] and places["q:c"][0] == 0 and places["q:d"][0] == 1
    assert small_pool.queue_stats().waiting == 0 and small_pool.queue_stats().recent_waits == 2


async def test_queue_full_timeout_and_leave(small_pool: KernelPool) -> None:
    async with small_pool.lease("r:a"), small_pool.lease("r:b"):
        leave = asyncio.Event()
        first = asyncio.ensure_future(small_pool.get_or_start("r:c", leave=leave))
        second = asyncio.ensure_future(small_pool.get_or_start("r:d"))
        while small_pool.queue_stats().waiting < 2:
            await asyncio.sleep(0.01)
        with pytest.raises(QueueFullError):  # max_queue 2
            await small_pool.get_or_start("r:e")
        leave.set()  # Stop while waiting
        with pytest.raises(QueueLeftError):
            await first
        with pytest.raises(QueueTimeoutError):  # queue_timeout_s 5
            await second
    assert small_pool.queue_stats().waiting == 0 and small_pool.get("r:c") is None


async def test_reaper_culls_idle_kernels_and_a_later_execute_works(small_pool: KernelPool) -> None:
    settings = small_pool.settings
    session = await small_pool.get_or_start("p:idle")
    await session.execute("open('keep.txt', 'w').write('x'); v = 1")
    reaper = Reaper(small_pool, settings)
    reaper.start()
    try:
        for _ in range(50):
            if small_pool.get("p:idle") is None and not await session.is_alive():
                break
            await asyncio.sleep(0.1)
    finally:
        await reaper.stop()
    assert small_pool.get("p:idle") is None and not await session.is_alive()
    assert (session.workspace.path / "keep.txt").exists()
    fresh = await small_pool.get_or_start("p:idle")
    result = await fresh.execute("import os; os.path.exists('keep.txt')")
    assert result.result == "True" and result.kernel_restarted and fresh.executions == 1


async def test_reaper_spares_busy_kernels(small_pool: KernelPool) -> None:
    session = await small_pool.get_or_start("p:busy")
    running = asyncio.ensure_future(session.execute("import time; time.sleep(1)"))
    while not session.busy:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.4)  # longer than idle_timeout_s, but busy
    assert await small_pool.cull_idle(0.3) == []
    assert (await running).ok


async def test_shutdown_all_leaves_no_kernel_processes(tmp_path: Path) -> None:
    pool = build_pool(kernel_settings(tmp_path, max_kernels=3))
    sessions = await asyncio.gather(*(pool.get_or_start(f"p:{i}") for i in range(3)))
    started = await sessions[0].execute("import subprocess; subprocess.Popen(['sleep', '60']).pid")
    child = psutil.Process(int(started.result))
    pids = [s.pid for s in sessions]
    assert {p.pid for p in kernel_processes()} >= set(pids)
    await pool.shutdown_all()
    left = kernel_processes()
    assert left == [], [(p.pid, p.cmdline(), p.ppid(), pids) for p in left]
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE  # what a kernel started goes too
    assert pool.sessions() == []


async def test_asking_for_a_session_restarts_its_idle_clock(small_pool: KernelPool) -> None:
    session = await small_pool.get_or_start("p:asked")
    await asyncio.sleep(0.4)  # longer than idle_timeout_s
    assert await small_pool.get_or_start("p:asked") is session  # a turn asks, then waits for the model
    assert await small_pool.cull_idle(0.3) == [] and await session.is_alive()


@pytest.fixture(autouse=True)
def _no_kernel_outlives_a_test() -> Iterator[None]:
    yield
    left = kernel_processes()
    assert left == [], [(p.pid, p.status()) for p in left]
