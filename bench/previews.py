"""The ``preview`` scenario (issue 44): what the bot's own one-shots cost a turn.

Per mode, ``spawn`` (a fresh interpreter per one-shot) and ``fork`` (forked from the one-shot
fork server, :mod:`kernels.oneshot.server`), through the whole bot (the real dispatcher, turn
runner and kernels, the scripted model answering at once, an in-memory chat platform):

* ``p50_ms`` / ``p90_ms`` / ``max_ms``: what the preview of a 20,000-row CSV upload adds to a
  turn (a turn with the file attached minus the same turn without, alternately);
* ``crowd_wall_ms``: 20 such previews at once (the bot's own call, :func:`bot.attachments.preview`,
  as a turn makes it), with ``crowd_floor_ms``, the CPU they cost (the bot and every one-shot
  process, user + system) ÷ cores, and ``crowd_ratio`` = wall ÷ floor (target ≤ 1.3);
* ``export_html_ms`` / ``export_ms``: ``export html`` (a one-shot) and ``export`` (the
  notebook) of a thread of 10 cells (DataFrames, text), message to reply, p50.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from bench.cpu import CpuMeter
from bench.kernels import Sandbox, summary
from bot.app import Core
from bot.attachments import preview
from kernels.oneshot.runner import OneShot
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat, bytes_attachment
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

MODES = ("spawn", "fork")
ROWS = 20_000
CROWD = 20
CELLS = 10


def sample_csv(rows: int = ROWS, seed: int = 44) -> bytes:
    """A CSV of ``rows`` rows × 7 columns (ints, strings, floats, dates), the same every run."""
    rng = random.Random(seed)
    lines = ["id,region,product,units,price,day,note"]
    for i in range(rows):
        region = rng.choice(("north", "south", "east", "west"))
        day = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        lines.append(f"{i},{region},p{rng.randint(1, 500)},{rng.randint(1, 100)},{rng.random() * 100:.2f},{day},n{i}")
    return ("\n".join(lines) + "\n").encode()


async def preview_cost(mode: str, root: Path, samples: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """The scenario for one mode (see the module docstring)."""
    data = sample_csv()
    async with ScriptedOpenAI() as llm:
        settings = make_settings(
            root,
            llm_url=llm.base_url,
            kernels={"sandbox": sandbox, "fork_server": mode == "fork", "max_upload_mb": 10},
        )
        async with Core.open(settings) as core:
            # (Before issue 44 the core held no one-shot runner of its own: the turns' one.)
            oneshot: OneShot = getattr(core, "oneshot", None) or core.dispatcher._turns._oneshot
            forking = hasattr(oneshot, "wait_ready") and await oneshot.wait_ready()
            if mode == "fork" and not forking:
                raise RuntimeError("the one-shot fork server did not start")
            chat = MemoryChat(core.dispatcher)
            added = await _added_to_a_turn(chat, llm, data, samples)
            crowd = await _crowd(core, oneshot, data)
            exports = await _exports(chat, llm, samples)
            server = getattr(oneshot, "server", None)
            if mode == "fork" and server is not None and server.forked < samples:
                raise RuntimeError(f"only {server.forked} one-shots were forked")
    result = summary(added)
    result.update(crowd)
    result.update(exports)
    return result


async def _added_to_a_turn(chat: MemoryChat, llm: ScriptedOpenAI, data: bytes, samples: int) -> list[float]:
    """Turns with and without the CSV, alternately (the first pair warms up): the differences."""
    plain: list[float] = []
    with_file: list[float] = []
    for i in range(samples + 1):
        llm.script(answer("ok"))
        started = time.perf_counter()
        await chat.say("hello", thread="preview")
        plain.append(time.perf_counter() - started)
        llm.script(answer("ok"))
        started = time.perf_counter()
        await chat.say("hello", thread="preview", attachments=[bytes_attachment(f"sales{i}.csv", data)])
        with_file.append(time.perf_counter() - started)
        if f"CSV, {ROWS:,} rows" not in str(llm.requests[-1]):
            raise RuntimeError("no preview reached the model")
    return [w - p for w, p in zip(with_file[1:], plain[1:], strict=True)]


async def _crowd(core: Core, oneshot: OneShot, data: bytes) -> dict[str, Any]:
    """:data:`CROWD` previews at once, as turns make them: wall time, CPU floor, their ratio."""
    workspace = core.pool.workspaces.for_key("bench:preview-crowd")
    await asyncio.to_thread(workspace.path.mkdir, parents=True, exist_ok=True)
    for i in range(CROWD):
        await asyncio.to_thread((workspace.path / f"crowd{i}.csv").write_bytes, data)
    await preview(oneshot, workspace, "crowd0.csv", len(data))  # warm-up
    meter = CpuMeter()
    with meter.oneshot_cgroups() if getattr(oneshot, "server", None) is None else contextlib.nullcontext():
        await asyncio.to_thread(meter.begin)
        started = time.perf_counter()
        texts = await asyncio.gather(*(preview(oneshot, workspace, f"crowd{i}.csv", len(data)) for i in range(CROWD)))
        wall = time.perf_counter() - started
        await asyncio.to_thread(meter.end)
    if not all(f"CSV, {ROWS:,} rows" in text for text in texts):
        raise RuntimeError("a preview of the crowd failed")
    cores = len(os.sched_getaffinity(0))
    cpu = sum(v["user"] + v["system"] for v in meter.result["by_process"].values())
    return {
        "crowd": CROWD,
        "crowd_wall_ms": wall * 1000,
        "crowd_floor_ms": cpu / cores * 1000,
        "crowd_ratio": wall / (cpu / cores) if cpu else None,
        "crowd_cpu_per_preview_ms": cpu / CROWD * 1000,
        "crowd_others_s": meter.result["others_s"],
    }


async def _exports(chat: MemoryChat, llm: ScriptedOpenAI, samples: int) -> dict[str, Any]:
    """A thread of :data:`CELLS` cells, then ``export html`` and ``export`` (p50 of ``samples`` each)."""
    for i in range(CELLS):
        code = f"import pandas as pd\nprint('cell {i}')\npd.DataFrame({{'a': range({i + 3}), 'b': 'x'}})"
        llm.script(tool_call(code), answer(f"Cell {i} ran."))
        await chat.say(f"run cell {i}", thread="export")
    times: dict[str, list[float]] = {"export html": [], "export": []}
    for _ in range(samples + 1):
        for command, spent in times.items():
            started = time.perf_counter()
            reply = (await chat.say(command, thread="export", mentioned=False)).reply
            spent.append(time.perf_counter() - started)
            if not reply.ok or not reply.files:
                raise RuntimeError(f"{command} failed: {reply.text}")
    return {
        "export_html_ms": statistics.median(times["export html"][1:]) * 1000,
        "export_ms": statistics.median(times["export"][1:]) * 1000,
    }
