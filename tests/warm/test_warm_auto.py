"""``warm_pool: auto`` with real kernels: grows after a burst of new threads, shrinks when quiet."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from kernels import KernelPool, build_launcher
from kernels.warm.target import MiB, WarmTarget
from tests.kernels.conftest import kernel_processes, kernel_settings


async def until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        await asyncio.sleep(0.02)


async def test_auto_pool_grows_after_a_burst_and_shrinks_when_quiet(tmp_path: Path) -> None:
    now = [0.0]  # the target's clock: an hour passes when the test says so
    settings = kernel_settings(tmp_path, warm_pool="auto", max_kernels=6)
    target = WarmTarget(max_kernels=6, clock=lambda: now[0], evaluate_every_s=0.05, memory=lambda: 64 * 1024 * MiB)
    pool = KernelPool(settings, launcher=build_launcher(settings), warm_target=target)
    warm = pool.warm
    assert warm is not None and warm.target is target
    await pool.start()
    try:
        await warm.wait_ready(1, timeout=60)  # quiet so far: one warm kernel
        assert warm.size == 1

        keys = [f"w:burst:{i}" for i in range(3)]
        sessions = await asyncio.gather(*(pool.get_or_start(key) for key in keys))
        assert [(await s.execute("1+1")).result for s in sessions] == ["2"] * 3
        assert warm.hits + warm.misses == 3 and warm.hits >= 1  # the one ready was handed out
        await until(lambda: warm.size == 3, "the target follows the burst")  # 3 threads, room for 3 more
        await warm.wait_ready(3, timeout=90)
        assert len(pool.sessions()) + warm.count <= settings.max_kernels

        await pool.shutdown(keys[0])  # a thread whose kernel stopped comes back: a new arrival
        again = await pool.get_or_start(keys[0])
        assert (await again.execute("1+1")).result == "2"
        assert warm.hits + warm.misses == 4
        await warm.wait_ready(3, timeout=90)  # refilled behind it: nothing starting any more

        now[0] += 3600  # an hour without new threads: the burst's minute has left the window
        await until(lambda: warm.size == 1, "the target falls back to one")
        await asyncio.sleep(0.2)  # several evaluations: nothing goes before the quiet minute
        assert len(warm._ready) >= 2
        now[0] += 60
        await until(lambda: warm.count == 1, "the extra warm kernels are discarded")
        await until(lambda: not warm._discards, "the discards finish")
        assert len(kernel_processes()) == len(pool.sessions()) + 1
    finally:
        await pool.shutdown_all()
    assert kernel_processes() == []
