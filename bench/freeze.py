"""The ``freeze`` scenario: what freezing a kernel between turns costs, and what it saves.

Per kernel source, in one run: ``p50_ms``/``max_ms`` of one freeze + CPU reading + thaw of a
thread's kernel (what each execution adds: the session thaws the kernel before the cell and
freezes it after), ``exec_p50_ms`` of ``1 + 1`` with it, and ``idle_cpu_s``: the CPU time an
idle thread's kernel used over ``idle_s`` while a thread its cell started spins (0 when frozen).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from bench.kernels import Sandbox, open_pool, summary

SPINNER = "import threading\nthreading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()"
KEY = "bench:freeze"


async def freeze_cost(
    mode: str, root: Path, samples: int, idle_s: float, *, sandbox: Sandbox = "none"
) -> dict[str, Any]:
    """Time ``samples`` freeze/thaw cycles and executions, then an idle kernel's CPU over ``idle_s``."""
    async with open_pool(mode, root, sandbox=sandbox) as pool:
        session = await pool.get_or_start(KEY)
        await session.execute("x = 1")
        handle = session._handle
        assert handle is not None
        cycles: list[float] = []
        for _ in range(samples):
            started = time.perf_counter()
            await handle.thaw()
            await handle.freeze()
            await handle.cpu_seconds()
            cycles.append(time.perf_counter() - started)
        executions: list[float] = []
        for _ in range(samples):
            started = time.perf_counter()
            if (await session.execute("1 + 1")).result != "2":
                raise RuntimeError("1 + 1 failed")
            executions.append(time.perf_counter() - started)
        await session.execute(SPINNER)
        before = await handle.cpu_seconds()
        await asyncio.sleep(idle_s)
        after = await handle.cpu_seconds()
    result = summary(cycles)
    result["exec_p50_ms"] = statistics.median(executions) * 1000
    result["idle_s"] = idle_s
    result["idle_cpu_s"] = None if before is None or after is None else after - before
    return result
