"""Kernel start-up scenarios: first execution in a new thread, 20 at once, idle memory.

Each scenario runs with three kernel sources, side by side in one run:
``spawn`` (a plain cold start), ``pool`` (a warm kernel available) and ``fork`` (pool empty,
the fork server forks one).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from kernels import KernelPool, build_pool
from kernels.forking.launcher import ForkingLauncher
from kernels.host import proctree
from kernels.seam.settings import KernelSettings, PackageSettings

MODES = ("spawn", "pool", "fork", "gateway", "gateway-pool")
#: Kernels on a real Jupyter Kernel Gateway (:mod:`bench.gateway`): cold, and from a warm pool.
GATEWAY_MODES = frozenset({"gateway", "gateway-pool"})
#: What the gateway sources are measured in (the rest would mostly measure this machine twice).
GATEWAY_SCENARIOS = frozenset({"first_exec", "burst", "turn_overhead"})
PRELOAD = ("pandas", "numpy", "matplotlib")
FIRST_CELL = "1 + 1"
MiB = 1024 * 1024


Sandbox = Literal["none", "bwrap"]


def mode_config(mode: str, warm: int) -> dict[str, Any]:
    """The ``kernels:`` keys that make a kernel source: warm pool, fork server, gateway."""
    if mode in GATEWAY_MODES:
        from bench.gateway import gateway_config, shared_gateway

        return {
            "warm_pool": warm if mode == "gateway-pool" else 0,
            "fork_server": False,
            "gateway": gateway_config(shared_gateway()),
        }
    return {"warm_pool": warm if mode == "pool" else 0, "fork_server": mode in ("pool", "fork")}


def settings_for(
    mode: str, root: Path, *, sandbox: Sandbox = "none", warm: int = 0, max_kernels: int = 120
) -> KernelSettings:
    """Kernel settings of one mode (``pool`` refills from the fork server) under ``sandbox``."""
    return KernelSettings(
        workspace_root=root / "workspaces",
        sandbox=sandbox,
        preload=PRELOAD,
        max_kernels=max_kernels,
        exec_timeout_s=60,
        packages=PackageSettings(dir=root / "packages"),
        **mode_config(mode, warm),
    )


@asynccontextmanager
async def open_pool(mode: str, root: Path, *, sandbox: Sandbox, warm: int = 0) -> AsyncIterator[KernelPool]:
    """A started pool of ``mode`` (warm kernels ready), shut down on exit."""
    pool = build_pool(settings_for(mode, root, sandbox=sandbox, warm=warm))
    await pool.start()
    try:
        if mode == "fork":
            assert isinstance(pool.launcher, ForkingLauncher) and pool.launcher.available, "fork server not up"
        if pool.warm is not None:
            await pool.warm.wait_ready(timeout=120)
        yield pool
    finally:
        await pool.shutdown_all()


async def time_first_cell(pool: KernelPool, key: str) -> float:
    """Seconds from asking ``pool`` for the kernel of new thread ``key`` to its first cell's result."""
    started = time.perf_counter()
    session = await pool.get_or_start(key)
    result = await session.execute(FIRST_CELL)
    if result.result != "2":
        raise RuntimeError(f"first execution in {key} failed: {result}")
    return time.perf_counter() - started


async def first_execution(mode: str, root: Path, samples: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """New thread → first cell done, one thread at a time (warm kernel ready before each)."""
    times: list[float] = []
    async with open_pool(mode, root, sandbox=sandbox, warm=1) as pool:
        for i in range(samples):
            if pool.warm is not None:
                await pool.warm.wait_ready(timeout=120)
            times.append(await time_first_cell(pool, f"bench:first:{i}"))
            await pool.shutdown(f"bench:first:{i}")
        _check_forked(mode, pool, samples)
    return summary(times)


def _check_forked(mode: str, pool: KernelPool, starts: int) -> None:
    """In ``fork`` mode every start must have been a fork (a spawn fallback would skew the numbers)."""
    if mode == "fork":
        assert isinstance(pool.launcher, ForkingLauncher)
        if pool.launcher.forked != starts:
            raise RuntimeError(f"{pool.launcher.spawned} of {starts} kernels were spawned, not forked")


#: Kernel sources whose bursts are smaller: each of their kernels (warm ones included) is a
#: cold start, here or on the gateway (100 of them would take minutes).
COLD_MODES = frozenset({"spawn", "gateway", "gateway-pool"})
COLD_BURST = 20


async def burst(mode: str, root: Path, threads: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """``threads`` new threads at once (:data:`COLD_BURST` for cold sources): each one's first
    cell; wall time; the floor (CPU the burst cost, of the bot and every kernel process, ÷
    cores: no scheduling does better); idle PSS per kernel."""
    threads = min(threads, COLD_BURST) if mode in COLD_MODES else threads
    async with open_pool(mode, root, sandbox=sandbox, warm=threads) as pool:
        cpu_before = await asyncio.to_thread(_cpu_seconds)
        started = time.perf_counter()
        times = await asyncio.gather(*(time_first_cell(pool, f"bench:burst:{i}") for i in range(threads)))
        wall = time.perf_counter() - started
        cpu = await asyncio.to_thread(_cpu_seconds)
        _check_forked(mode, pool, threads)
        if mode in GATEWAY_MODES:  # the kernels are the gateway's processes: their memory is not ours to see
            return {**summary(list(times)), "wall_s": wall}
        burst_cpu = sum(cpu.values()) - sum(v for pid, v in cpu_before.items() if pid in cpu)
        cores = len(os.sched_getaffinity(0))
        floor = {
            "cpu_per_kernel_ms": burst_cpu / threads * 1000,
            "floor_s": burst_cpu / cores,
            "floor_ratio": wall / (burst_cpu / cores) if burst_cpu else None,
        }
        sessions = pool.sessions()
        await asyncio.gather(*(s.execute("import pandas, numpy, matplotlib.pyplot") for s in sessions))
        await asyncio.sleep(0.5)  # let the kernels settle (idle)
        pss = [await s.memory_bytes() or 0 for s in sessions]
        parent = 0
        if isinstance(pool.launcher, ForkingLauncher):
            kernels = await asyncio.to_thread(_tree_pids, [s.pid for s in sessions])
            parent = await _pss_zygote(pool.launcher.server.pid, kernels)
        result = summary(list(times))
        result["wall_s"] = wall
        result.update(floor)
        # The fork server's own memory is shared by its children: each kernel carries a share.
        per_kernel = [(p + parent / len(pss)) / MiB for p in pss]
        result["idle_pss_mib"] = statistics.median(per_kernel)
        result["fork_server_pss_mib"] = parent / MiB
    return result


def _cpu_seconds() -> dict[int, float]:
    """(Blocking) CPU seconds (user + system) of this process and each of its descendants
    (kernels, the fork server and what it forked), by pid."""
    import psutil

    from bench.cpu import process_cpu

    me = psutil.Process()
    seconds: dict[int, float] = {}
    for proc in [me, *me.children(recursive=True)]:
        if (used := process_cpu(proc)) is not None:  # else it ended meanwhile
            seconds[proc.pid] = sum(used)
    return seconds


async def _pss(pid: int | None) -> int:
    import psutil

    if pid is None:
        return 0
    info = await asyncio.to_thread(psutil.Process(pid).memory_full_info)
    return int(getattr(info, "pss", info.rss))


def _tree_pids(roots: list[int | None]) -> set[int]:
    """(Blocking) every process of the kernels ``roots`` (a jailed kernel's supervisor too)."""
    return {pid for root in roots if root is not None for pid in proctree.pids(root)}


async def _pss_zygote(pid: int | None, kernels: set[int]) -> int:
    """PSS of the fork server's own processes: (sandboxed) its bwrap wrapper, the zygote, its
    helper and the supervisors waiting for a kernel, not the processes of ``kernels`` (a
    jailed kernel's supervisor among them: their PSS is counted per kernel)."""
    import psutil

    if pid is None:
        return 0

    def measure() -> int:
        total = 0
        procs = [psutil.Process(pid)]
        if procs[0].name() == "bwrap":  # sandboxed: the zygote is bwrap's child
            procs += procs[0].children()
        for child in procs[-1].children(recursive=True):
            if child.pid not in kernels:  # the supervisors' helper, waiting supervisors
                procs.append(child)
        for proc in procs:
            info = proc.memory_full_info()
            total += int(getattr(info, "pss", info.rss))
        return total

    return await asyncio.to_thread(measure)


def summary(times: list[float]) -> dict[str, Any]:
    """p50 / p90 / max in milliseconds of a list of durations in seconds."""
    ordered = sorted(times)
    ms = [t * 1000 for t in ordered]
    p90 = ms[min(len(ms) - 1, max(0, round(0.9 * len(ms)) - 1))]
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p90_ms": p90, "max_ms": ms[-1]}
