"""A kernel that dies at any moment costs only its own thread.

Real kernels (spawned, bubblewrap-sandboxed, forked from the sandboxed fork server, and warm
ones), killed during a cell, after the cell before the after-turn save, during the save,
during the restore, while idle, and while waiting warm. In every case the thread is told once,
its next execution gets a fresh kernel, and a neighbour thread goes on answering: before the
fix, a dead kernel's after-turn save spun on the event loop and froze every thread.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from kernels import KernelPool, Reaper, build_pool
from kernels.seam.result import Outcome
from tests.kernels.conftest import kernel_settings
from tests.kernels.test_snapshots import SOURCES
from tests.security.conftest import SKIP_REASON

pytestmark = pytest.mark.timeout(90)  # a frozen loop never lets asyncio's own timeouts fire

KILL_ITSELF = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
#: A variable whose pickling kills the kernel (the save runs in the kernel's own process).
KILLS_WHEN_SAVED = """
import os, signal
class Bomb:
    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)
bomb = Bomb()
"""
#: A variable that saves fine and ends the kernel when loaded.
KILLS_WHEN_LOADED = """
import os
class Bomb:
    def __reduce__(self):
        return (os._exit, (3,))
bomb = Bomb()
"""


@pytest_asyncio.fixture(params=list(SOURCES))
async def pool(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KernelPool]:
    if request.param != "spawn" and SKIP_REASON:
        pytest.skip(SKIP_REASON)
    kernel_pool = build_pool(kernel_settings(tmp_path, **SOURCES[request.param]))
    await kernel_pool.start()
    yield kernel_pool
    await kernel_pool.shutdown_all()


async def settled(pool: KernelPool) -> None:
    """Wait until no after-turn save is pending (each ends on its own, bounded)."""
    for _ in range(200):
        if not pool._saves:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("an after-turn save never ended")


async def neighbour_answers(pool: KernelPool) -> None:
    """Another thread runs ``1+1`` promptly: the event loop is not frozen by the dead kernel."""

    async def ask() -> str | None:
        async with pool.lease("t:neighbour") as session:
            return (await session.execute("1+1")).result

    assert await asyncio.wait_for(ask(), 30) == "2"


async def turn(pool: KernelPool, key: str, code: str) -> tuple[Outcome, str | None, list[str]]:
    """One turn of ``key`` running ``code``: its outcome, its result and what the thread is told."""
    async with pool.lease(key) as session:
        result = await session.execute(code)
        return result.outcome, result.result, session.take_thread_notices()


async def test_death_during_a_cell(pool: KernelPool) -> None:
    """The issue's reproduction: ``x = 1``, then a cell that kills its kernel, then a neighbour."""
    assert (await turn(pool, "t:a", "x = 1"))[0] is Outcome.OK
    await settled(pool)
    outcome, _, told = await turn(pool, "t:a", KILL_ITSELF)
    assert outcome is Outcome.DIED
    assert len(told) == 1 and "SIGKILL" in told[0] and "files in the workspace are kept" in told[0]
    await neighbour_answers(pool)
    await settled(pool)
    assert pool.get("t:a") is None  # the dead kernel's session left the pool
    outcome, value, told = await turn(pool, "t:a", "x + 1")
    assert (outcome, value, told) == (Outcome.OK, "2", [])  # restored from the save; told once only


async def test_death_after_the_cell_before_the_save(pool: KernelPool) -> None:
    code = "x = 1\nimport os, signal, threading\nthreading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()"
    outcome, _, told = await turn(pool, "t:b", code)
    assert outcome is Outcome.OK and told == []
    await settled(pool)
    assert pool.get("t:b") is None
    await neighbour_answers(pool)
    outcome, value, told = await turn(pool, "t:b", "'x' in dir()")
    assert (outcome, value) == (Outcome.OK, "False")
    assert len(told) == 1 and "SIGKILL" in told[0]
    assert (await turn(pool, "t:b", "1"))[2] == []


async def test_death_during_the_save(pool: KernelPool) -> None:
    assert (await turn(pool, "t:c", "y = 5"))[0] is Outcome.OK
    await settled(pool)
    assert (await turn(pool, "t:c", KILLS_WHEN_SAVED))[0] is Outcome.OK
    await settled(pool)  # the save killed the kernel; the task ended and the session left
    assert pool.get("t:c") is None
    await neighbour_answers(pool)
    outcome, value, told = await turn(pool, "t:c", "y")
    assert (outcome, value) == (Outcome.OK, "5")  # the last good snapshot
    assert len(told) == 1 and "SIGKILL" in told[0]


async def test_death_during_the_restore(pool: KernelPool) -> None:
    assert (await turn(pool, "t:d", KILLS_WHEN_LOADED + "z = 7"))[0] is Outcome.OK
    await settled(pool)
    await pool.shutdown("t:d")  # culled: saved on the way down (the bomb saves fine)
    outcome, value, told = await turn(pool, "t:d", "'z' in dir()")
    assert (outcome, value) == (Outcome.OK, "False")
    assert len(told) == 1 and "loading its saved variables stopped it" in told[0]
    await neighbour_answers(pool)
    await pool.shutdown("t:d")
    assert (await turn(pool, "t:d", "1"))[:2] == (Outcome.OK, "1")  # the snapshot that killed was discarded


async def test_death_while_idle(pool: KernelPool) -> None:
    """Killed between two messages. A frozen kernel (cgroup freezer) takes the signal when it
    is thawed for the next execution, which then reports the death; unfrozen (SIGSTOP'd)
    processes die at once and the reaper's pass takes the session out. Either way the thread
    hears it once and goes on with its saved variables."""
    assert (await turn(pool, "t:e", "w = 3"))[0] is Outcome.OK
    await settled(pool)
    session = pool.get("t:e")
    assert session is not None and session.pid is not None
    # The OOM killer, an operator, between two messages: the kernel process and whatever
    # holds it (a sandboxed fork server's kernel runs under a supervisor, the pid the pool
    # knows). Killing the supervisor alone would end the kernel only once thawed, racing the
    # next execution the kernel could still answer.
    supervisor = psutil.Process(session.pid)
    for process in [*supervisor.children(recursive=True), supervisor]:
        os.kill(process.pid, signal.SIGKILL)
    await asyncio.sleep(0.3)
    assert await Reaper(pool, pool.settings).cull_kernels() == []  # never counted as culled
    await neighbour_answers(pool)
    said: list[str] = []
    for _ in range(2):  # the first execution may be the one that finds it dead
        outcome, value, told = await turn(pool, "t:e", "w")
        said += told
        if outcome is Outcome.OK:
            break
        assert outcome is Outcome.DIED
    assert (outcome, value) == (Outcome.OK, "3")
    assert len(said) == 1 and "SIGKILL" in said[0]


async def test_a_full_workspace_ends_the_save_and_tells_the_thread_once(tmp_path: Path) -> None:
    pool = build_pool(kernel_settings(tmp_path, workspace_quota_mb=1))
    try:
        fill = "open('fill.bin', 'wb').write(b'0' * 1024 * 1024)\nv = 1"  # exactly the quota: no room left
        assert (await turn(pool, "t:f", fill))[0] is Outcome.OK
        await settled(pool)
        await neighbour_answers(pool)
        outcome, _, told = await turn(pool, "t:f", "v")
        assert outcome is Outcome.OK
        assert told == [] or "could not be saved (the workspace is full)" in told[0]
        await settled(pool)
        said = told + (await turn(pool, "t:f", "v"))[2]
        await settled(pool)
        said += (await turn(pool, "t:f", "v"))[2]
        assert len(said) == 1 and "could not be saved (the workspace is full)" in said[0]
    finally:
        await pool.shutdown_all()


async def test_a_warm_kernel_that_died_waiting_is_not_handed_out(tmp_path: Path) -> None:
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    pool = build_pool(kernel_settings(tmp_path, **SOURCES["warm"]))
    await pool.start()
    try:
        assert pool.warm is not None
        await pool.warm.wait_ready(timeout=60)
        os.kill(pool.warm._ready[0].handle.pid, signal.SIGKILL)
        await asyncio.sleep(0.2)
        outcome, value, told = await turn(pool, "t:g", "1+1")
        assert (outcome, value, told) == (Outcome.OK, "2", [])
        await neighbour_answers(pool)
    finally:
        await pool.shutdown_all()


async def test_a_kernel_that_cannot_be_thawed_is_lost_at_once(pool: KernelPool) -> None:
    """Fail closed: the cell does not wait its timeout on a kernel left frozen."""

    async with pool.lease("t:thaw") as session:
        assert (await session.execute("x = 1")).ok
        handle = session._handle
        assert handle is not None
        real_thaw, calls = handle.thaw, 0

        async def broken_thaw() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:  # the thaw for the cell fails; the discard's own try works (a cgroup v1
                raise OSError("cgroup.freeze: no such device")  # frozen process takes no SIGKILL)
            await real_thaw()

        handle.thaw = broken_thaw  # type: ignore[method-assign]
        started = asyncio.get_running_loop().time()
        result = await session.execute("x", timeout=15)
        assert asyncio.get_running_loop().time() - started < 5
        assert result.outcome is Outcome.DIED and "could not be resumed" in (result.notice or "")
        assert any("could not be resumed" in notice for notice in session.take_thread_notices())
        again = await session.execute("1+1")
        assert again.result == "2" and again.kernel_restarted
    await neighbour_answers(pool)
