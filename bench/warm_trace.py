"""``warm_trace``: a bursty trace of new threads against a fixed warm pool and ``warm_pool: auto``.

The trace, in its own time: a trickle of one new thread every two minutes, a burst of
``burst`` new threads at once, the trickle again, a second burst eight minutes after the
first, the trickle again. It is replayed :data:`SCALE` times faster than real time: the
adaptive target's clock runs that much faster (its hour is a real minute, its minute a
real second), so the pool sees the rates it would see at full length, while kernel starts
take their real time. Each new thread runs its first cell, and its kernel is then shut
down (the threads' lifetime is not what this measures; it keeps a 2-core machine light).

Modes: ``fixed`` (``warm_pool: 2``) and ``auto``, both refilling from the fork server with
pandas, numpy and matplotlib preloaded. Reported: the hit rate (new threads that got a warm
kernel), first-cell latency (p50/p90/max), the peak of warm kernels (ready or starting) and
how many were warm when each burst came.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.kernels import Sandbox, settings_for, summary, time_first_cell
from kernels import KernelPool, build_launcher
from kernels.forking.launcher import ForkingLauncher
from kernels.warm.target import EVALUATE_EVERY_S, WarmTarget, available_memory

MODES = ("fixed", "auto")
#: ``warm_pool`` of the ``fixed`` mode (the shipped config's).
FIXED = 2
#: Trace seconds per real second.
SCALE = 60.0
#: Minutes of the trace: trickle arrivals, and when the bursts come.
TRICKLE_MIN = (0, 2, 4, 6, 10, 12, 14, 18, 20, 22)
BURSTS_MIN = (8, 16)
#: Trace time after the last arrival, so the last threads finish inside the trace.
TAIL_MIN = 1


#: Arrivals come this far into their minute (a burst's stay within one of the target's minutes).
INTO_MINUTE = 0.25


def arrivals(burst: int) -> list[float]:
    """When each new thread arrives, in real seconds from the start, in order."""
    minutes = [*TRICKLE_MIN, *(m for m in BURSTS_MIN for _ in range(burst))]
    return sorted((m + INTO_MINUTE) * 60 / SCALE for m in minutes)


async def _new_thread(pool: KernelPool, key: str) -> float:
    """A new thread's first cell (:func:`time_first_cell`); its kernel then stops."""
    elapsed = await time_first_cell(pool, key)
    await pool.shutdown(key)
    return elapsed


async def replay(mode: str, root: Path, burst: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """Replay the trace against a warm pool of ``mode`` (``fixed`` or ``auto``)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    settings = settings_for("pool", root, sandbox=sandbox, warm=FIXED).model_copy(
        update={"snapshot": False, **({"warm_pool": "auto"} if mode == "auto" else {})}
    )
    origin = [time.monotonic()]
    target = WarmTarget(
        max_kernels=settings.max_kernels,
        memory=available_memory,
        clock=lambda: (time.monotonic() - origin[0]) * SCALE,  # the trace's time
        evaluate_every_s=EVALUATE_EVERY_S / SCALE,
        memory_every_s=60.0,  # a real second
    )
    launcher = await asyncio.to_thread(build_launcher, settings)
    pool = KernelPool(settings, launcher=launcher, warm_target=target)
    await pool.start()
    watching: list[asyncio.Task[None]] = []
    try:
        warm = pool.warm
        assert warm is not None
        assert isinstance(pool.launcher, ForkingLauncher) and pool.launcher.available, "fork server not up"
        await warm.wait_ready(timeout=120)
        peak = warm.count
        at_bursts: list[int] = []

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, warm.count)
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        watching.append(watcher)
        threads: list[asyncio.Task[float]] = []
        bursts = [(m + INTO_MINUTE) * 60 / SCALE for m in BURSTS_MIN]
        schedule = arrivals(burst)
        begin = time.monotonic()
        origin[0] -= 60 / SCALE - (begin - origin[0]) % (60 / SCALE)  # the trace starts a minute of the target's
        for i, at in enumerate(schedule):
            await asyncio.sleep(max(0.0, begin + at - time.monotonic()))
            if at in bursts and len(at_bursts) < bursts.index(at) + 1:
                at_bursts.append(warm.count)
            threads.append(asyncio.create_task(_new_thread(pool, f"bench:trace:{i}")))
        times = await asyncio.gather(*threads)
        in_burst = [[t for t, at in zip(times, schedule) if at == b] for b in bursts]
        await asyncio.sleep(
            max(0.0, begin + (max(TRICKLE_MIN + BURSTS_MIN) + TAIL_MIN) * 60 / SCALE - time.monotonic())
        )
        result = summary(list(times))
        result.update(
            hits=warm.hits,
            misses=warm.misses,
            hit_rate=warm.hits / max(1, warm.hits + warm.misses),
            peak_warm=peak,
            warm_at_bursts=at_bursts,
            warm_at_end=warm.count,
            burst_p50_ms=[summary(ts)["p50_ms"] for ts in in_burst],
            burst_max_ms=[max(ts) * 1000 for ts in in_burst],
            wall_s=time.monotonic() - begin,
            forked=pool.launcher.forked,
            spawned=pool.launcher.spawned,
        )
        return result
    finally:
        for task in watching:
            task.cancel()
        await pool.shutdown_all()
