"""The fork path step by step: where a new thread's time goes from asking for a kernel to
the first ``1 + 1`` when the fork server starts it (pool empty).

The bot's side is timed by wrapping the steps of one start for the length of the scenario;
the kernel's side comes from the moments the forked child keeps (``sys._threadbook_fork_trace``,
see ``kernels/fork/zygote.py``). Everything is wall-clock time, so the two sides line up.
"""

from __future__ import annotations

import ast
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kernels.spawn.spawner as spawner_module
from bench.kernels import FIRST_CELL, Sandbox, open_pool
from kernels.forking.launcher import ForkingLauncher, ForkServer
from kernels.session.process import KernelProcess
from kernels.session.session import KernelSession
from kernels.spawn.handle import LocalKernelHandle
from kernels.spawn.spawner import Spawner

#: (step, from mark, to mark) in the order a start goes through them.
STEPS = (
    ("pool: session, plan", "asked", "launch"),
    ("bot: run dir, connection file", "launch", "request"),
    ("fork request reaches the zygote, fork()", "request", "fork"),
    ("child: leave the zygote (jail when sandboxed, session, keyring, log)", "fork", "kernel"),
    ("child: IPKernelApp.initialize", "kernel", "initialized"),
    ("child: start, kernel_info + iopub answered", "initialized", "ready"),
    ("bot: note the kernel's processes", "ready", "recorded"),
    ("bot: snapshot check (a new thread has none to load)", "recorded", "session"),
    ("first execution (1 + 1)", "session", "answered"),
)


@contextmanager
def _marking(marks: dict[str, float]) -> Iterator[None]:
    """Record in ``marks`` when each bot-side step of a start ends (the wraps are undone on exit)."""
    patches: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, before: str | None, after: str | None) -> None:
        original = getattr(owner, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            if before is not None:
                marks.setdefault(before, time.time())
            result = await original(*args, **kwargs)
            if after is not None:
                marks[after] = time.time()
            return result

        patches.append((owner, name, original))
        setattr(owner, name, timed)

    wrap(Spawner, "spawn", "launch", None)
    wrap(ForkServer, "fork", "request", None)
    wrap(spawner_module, "wait_ready", None, "ready")
    wrap(LocalKernelHandle, "record_infrastructure", None, "recorded")
    wrap(KernelProcess, "ensure", None, "session")
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)


async def _child_trace(session: KernelSession) -> dict[str, float]:
    result = await session.execute("__import__('sys')._threadbook_fork_trace")
    trace = ast.literal_eval(result.result or "{}")
    return {str(k): float(v) for k, v in trace.items()}


async def fork_path(root: Path, samples: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """``samples`` new threads one after another, each forked: total p50 and the p50 of every step."""
    per_step: dict[str, list[float]] = {step: [] for step, _, _ in STEPS}
    totals: list[float] = []
    async with open_pool("fork", root, sandbox=sandbox) as pool:
        assert isinstance(pool.launcher, ForkingLauncher)
        for i in range(samples):
            key = f"bench:fork-path:{i}"
            marks: dict[str, float] = {}
            with _marking(marks):
                marks["asked"] = time.time()
                session = await pool.get_or_start(key)
                result = await session.execute(FIRST_CELL)
                marks["answered"] = time.time()
            if result.result != "2":
                raise RuntimeError(f"first execution in {key} failed: {result}")
            marks.update(await _child_trace(session))
            totals.append(marks["answered"] - marks["asked"])
            for step, start, end in STEPS:
                per_step[step].append(marks[end] - marks[start])
            await pool.shutdown(key)
        if pool.launcher.forked != samples:
            raise RuntimeError(f"{pool.launcher.spawned} of {samples} kernels were spawned, not forked")
    return {
        "n": samples,
        "p50_ms": statistics.median(totals) * 1000,
        "max_ms": max(totals) * 1000,
        "steps_ms": {step: statistics.median(times) * 1000 for step, times in per_step.items()},
    }


def breakdown_table(result: dict[str, Any]) -> str:
    """The steps as a Markdown table (ms, p50 over the samples)."""
    rows = ["| step | p50 ms |", "|---|---|"]
    rows += [f"| {step} | {ms:.1f} |" for step, ms in result["steps_ms"].items()]
    rows.append(f"| **request → first result (p50 of totals)** | **{result['p50_ms']:.1f}** |")
    return "\n".join(rows)
