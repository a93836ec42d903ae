"""Warm pool with real kernels: fast hand-out, refill, isolation, uploads, cap, no leftovers."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from kernels import KernelOptions, KernelPool, build_pool
from kernels.warm.pool import WARM_DIR
from tests.kernels.conftest import kernel_processes, kernel_settings


@pytest_asyncio.fixture
async def warm_pool(tmp_path: Path) -> AsyncIterator[KernelPool]:
    pool = build_pool(kernel_settings(tmp_path, warm_pool=2, max_kernels=3, preload=("matplotlib",)))
    await pool.start()
    assert pool.warm is not None
    await pool.warm.wait_ready(timeout=30)
    yield pool
    await pool.shutdown_all()


async def test_hand_out_is_warm_sees_uploads_and_refills(warm_pool: KernelPool) -> None:
    warm = warm_pool.warm
    assert warm is not None
    workspace = warm_pool.workspaces.for_key("w:a")
    (workspace.path / "upload.csv").write_text("a,b\n1,2\n")  # the first message's attachment

    session = await warm_pool.get_or_start("w:a")
    result = await session.execute(
        "import os; print(open('upload.csv').read().split()[1], os.getcwd() == os.environ['HOME'])"
    )
    assert result.ok and result.streams[0].text == "1,2 True\n", result
    assert result.execution_count == 1  # the warm-up left no trace in the thread's history
    assert (await session.execute("_, len(In)")).result == "('', 3)"  # nor a result (its priming shows nothing)
    # The thread got the warm kernel, not a cold start (how fast that is: `python -m bench`, first_exec pool).
    assert (warm.hits, warm.misses) == (1, 0)

    await session.execute("open('made.txt', 'w').write('x')")
    assert (workspace.path / "made.txt").read_text() == "x"  # the Workspace object still addresses it
    assert not (workspace.path.parent / WARM_DIR / "made.txt").exists()

    plot = await session.execute("import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.show()")
    assert plot.ok and [d.png() is not None for d in plot.displays] == [True]

    await warm.wait_ready(timeout=30)  # refilled behind the hand-out, within max_kernels (1 + 2)
    assert warm.count == 2  # ready ones only: nothing is starting any more


async def test_threads_with_warm_kernels_are_isolated_and_capped(warm_pool: KernelPool) -> None:
    warm = warm_pool.warm
    assert warm is not None
    a, b = await asyncio.gather(warm_pool.get_or_start("w:a"), warm_pool.get_or_start("w:b"))
    await a.execute("secret = 41")
    result = await b.execute("'secret' in dir(), __import__('os').listdir('.')")
    assert result.result == "(False, [])"
    assert a.pid != b.pid

    # 2 sessions + at most 1 warm kernel: the cap holds while the pool refills.
    await asyncio.sleep(0.05)
    assert len(warm_pool.sessions()) + warm.count <= 3
    # A thread with other options (network) never gets a warm kernel, and makes room for itself.
    other = await warm_pool.get_or_start("w:c", KernelOptions(network=True))
    assert (await other.execute("1+1")).result == "2"
    assert len(warm_pool.sessions()) == 3 and warm.count == 0


async def test_shutdown_leaves_no_process_and_no_warm_folder(tmp_path: Path) -> None:
    pool = build_pool(kernel_settings(tmp_path, warm_pool=2, max_kernels=4))
    await pool.start()
    assert pool.warm is not None
    await pool.warm.wait_ready(1, timeout=30)  # one ready, likely one still starting
    session = await pool.get_or_start("w:x")
    await session.execute("1")
    await pool.shutdown_all()
    assert kernel_processes() == []
    assert not (pool.workspaces.root / WARM_DIR).exists()
    assert (pool.workspaces.root / pool.workspaces.folder_name("w:x")).is_dir()  # thread files stay


async def test_a_warm_kernel_that_died_is_never_handed_out_and_is_cleaned_up(tmp_path: Path) -> None:
    pool = build_pool(kernel_settings(tmp_path, warm_pool=1, max_kernels=2))
    await pool.start()
    assert pool.warm is not None
    await pool.warm.wait_ready(1, timeout=30)
    (dead,) = pool.warm._ready
    dead_pid = dead.handle.pid
    assert dead_pid is not None
    os.kill(dead_pid, signal.SIGKILL)
    while await dead.handle.is_alive():
        await asyncio.sleep(0.01)
    session = await pool.get_or_start("w:after-death")
    assert session.pid != dead_pid and (await session.execute("1+1")).result == "2"
    await pool.shutdown_all()
    assert kernel_processes() == [] and not dead.folder.exists()


async def test_the_refill_waits_for_a_handed_out_kernels_first_cell(tmp_path: Path) -> None:
    pool = build_pool(kernel_settings(tmp_path, warm_pool=1, max_kernels=3))
    await pool.start()
    try:
        warm = pool.warm
        assert warm is not None
        await warm.wait_ready(timeout=30)
        session = await pool.get_or_start("w:first")  # the model writes its first cell meanwhile
        cell = asyncio.create_task(session.execute("import time; time.sleep(1.5)"))
        await asyncio.sleep(0.8)
        assert not cell.done() and warm.count == 0  # no kernel starts beside the thread's first cell
        assert (await cell).ok
        await warm.wait_ready(timeout=30)  # then the pool refills
    finally:
        await pool.shutdown_all()
