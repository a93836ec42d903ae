"""Fork-server kernels with real processes: same session behaviour as spawned ones, restart, no leftovers."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest_asyncio

from kernels import KernelPool, Outcome
from kernels.forkserver import ForkingLauncher
from tests.kernels.conftest import kernel_settings


@pytest_asyncio.fixture
async def forking_pool(tmp_path: Path) -> AsyncIterator[KernelPool]:
    pool = KernelPool(kernel_settings(tmp_path, fork_server=True, preload=("numpy", "matplotlib"), exec_timeout_s=5))
    await pool.start()
    assert isinstance(pool.launcher, ForkingLauncher) and pool.launcher.available
    yield pool
    await pool.shutdown_all()


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


async def test_forked_kernels_behave_like_spawned_ones(forking_pool: KernelPool) -> None:
    launcher = forking_pool.launcher
    assert isinstance(launcher, ForkingLauncher)
    a, b = await asyncio.gather(forking_pool.get_or_start("f:a"), forking_pool.get_or_start("f:b"))
    assert launcher.forked == 2 and launcher.spawned == 0
    code = "import os, numpy as np; v = 1; print(np.random.randint(1 << 30), os.getcwd() == os.environ['HOME'])"
    ra, rb = await asyncio.gather(a.execute(code), b.execute(code))
    assert ra.ok and rb.ok and ra.execution_count == 1, (ra, rb)
    assert ra.streams[0].text != rb.streams[0].text  # numpy reseeded in each child
    assert ra.streams[0].text.endswith("True\n") and a.workspace.path.name in (await a.execute("os.getcwd()")).result
    assert (await b.execute("'v' in dir() and 'pd' not in dir()")).result == "True"

    plot = await a.execute("import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.show()")
    assert [d.png() is not None for d in plot.displays] == [True]  # %matplotlib inline ran in the child

    stuck = await a.execute("while True: pass", timeout=0.5)  # signal-mode interrupt reaches the child
    assert stuck.outcome is Outcome.TIMEOUT_INTERRUPTED and (await a.execute("v")).result == "1"

    died = await b.execute("import os; os.kill(os.getpid(), 9)")
    assert died.outcome is Outcome.DIED and "SIGKILL" in died.notice
    again = await b.execute("'v' in dir()")
    assert again.result == "False" and again.kernel_restarted

    await a.execute("import subprocess; p = subprocess.Popen(['sleep', '60'], start_new_session=True)")
    tree = [psutil.Process(a.pid), *psutil.Process(a.pid).children(recursive=True)]
    assert len(tree) == 2
    await forking_pool.shutdown("f:a")
    await asyncio.sleep(0.05)
    assert _alive(tree) == []  # the kernel and what it started, even in its own session


async def test_dead_fork_server_falls_back_to_spawn_and_comes_back(forking_pool: KernelPool) -> None:
    launcher = forking_pool.launcher
    assert isinstance(launcher, ForkingLauncher)
    before = await forking_pool.get_or_start("f:before")
    await before.execute("v = 1")
    zygote = launcher.server.pid
    assert zygote is not None
    os.kill(zygote, signal.SIGKILL)
    while launcher.available:
        await asyncio.sleep(0.01)

    spawned = await forking_pool.get_or_start("f:spawned")
    assert (await spawned.execute("1 + 1")).result == "2" and launcher.spawned == 1
    assert (await before.execute("v")).result == "1"  # kernels forked earlier keep running

    for _ in range(100):
        if launcher.available:
            break
        await asyncio.sleep(0.05)
    assert launcher.available and launcher.server.starts == 2 and launcher.server.pid != zygote
    forked = await forking_pool.get_or_start("f:after")
    assert (await forked.execute("2 + 2")).result == "4" and launcher.forked == 2

    pids = [s.pid for s in forking_pool.sessions()]
    server_pid = launcher.server.pid
    await forking_pool.shutdown_all()
    assert not any(pid is not None and psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids)
    assert server_pid is not None and not psutil.pid_exists(server_pid)
