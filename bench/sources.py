"""The ``sources`` scenario (issue 33): rows of a PostgreSQL table into a DataFrame in the kernel.

A table of 1,000,000 rows × 5 columns (bigint, double, integer, text, timestamptz) in a local
PostgreSQL (:mod:`bench.postgres`). ``p50_ms``/``max_ms``: the ``sql`` tool's whole call for
100,000 rows of it, as a turn makes it (parse, read-only query, Parquet into the thread's
workspace, ``read_parquet`` in the thread's kernel, the summary for the model).
``peak_mib``: how much the bot process's resident memory rose over its level before, at
most, while the tool fetched all 1,000,000 rows (sampled every 5 ms; the kernel is another
process). ``load_1m_ms``: that call's time. ``wide_peak_mib``/``wide_ms`` (issue 39): the same
for 100 rows of 4 MB each (``repeat('x', 4000000)``), the attack run's query, which took the
bot from 255 to 2,324 MiB before rows were fetched by bytes.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from bench.kernels import Sandbox, open_pool, summary
from bench.postgres import LocalPostgres
from bot.sources.registry import Sources
from bot.sources.settings import SourceSettings
from bot.sources.tool import SqlTool

MODES = ("spawn",)
ROWS = 1_000_000
SAMPLE_ROWS = 100_000
#: Issue 39's wide rows: 100 of 4 MB each.
WIDE_QUERY = "SELECT n, repeat('x', 4000000) AS blob FROM generate_series(1, 100) AS n"
KEY = "bench:sources"
_TABLE = f"""
CREATE TABLE orders AS
SELECT n::bigint AS order_id, (n % 997) * 1.25::float8 AS amount, (n % 20)::int AS quantity,
       'region-' || (n % 7) AS region, timestamptz '2024-01-01' + n * interval '1 minute' AS ordered_at
FROM generate_series(1, {ROWS}) AS n
"""


async def load_rows(mode: str, root: Path, samples: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """``samples`` calls of 100,000 rows, then one of 1,000,000 with the bot's memory watched."""
    postgres = LocalPostgres()
    await asyncio.to_thread(postgres.start)
    try:
        url = await asyncio.to_thread(postgres.database)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(_TABLE)
            await conn.execute("VACUUM ANALYZE orders")
        finally:
            await conn.close()
        sources = Sources({"bench": SourceSettings(url=url, max_rows=ROWS, statement_timeout_s=120)})  # type: ignore[arg-type]
        try:
            return await _measure(mode, root, samples, sources, sandbox)
        finally:
            await sources.close()
    finally:
        await asyncio.to_thread(postgres.stop)


async def _measure(mode: str, root: Path, samples: int, sources: Sources, sandbox: Sandbox) -> dict[str, Any]:
    async with open_pool(mode, root, sandbox=sandbox, warm=0) as pool:
        session = await pool.get_or_start(KEY)
        tool = SqlTool(sources=sources, granted=["bench"], kernel=session, workspace=pool.workspaces.for_key(KEY))

        async def call(rows: int) -> str:
            told = await tool.call(json.dumps({"query": f"SELECT * FROM orders LIMIT {rows}", "name": "df"}))
            if f"{rows:,} rows × 5 columns" not in told:
                raise RuntimeError(f"the call did not load {rows} rows: {told[:300]}")
            return told

        await call(1_000)  # the pool's first connection, the imports in the kernel
        times: list[float] = []
        for _ in range(samples):
            started = time.perf_counter()
            await call(SAMPLE_ROWS)
            times.append(time.perf_counter() - started)
        check = await session.execute("len(df), list(df.dtypes.astype(str))")
        if not check.ok or str(SAMPLE_ROWS) not in (check.result or ""):
            raise RuntimeError(f"the DataFrame is not in the kernel: {check.result} {check.error}")

        peak, took = await _peak_while(call(ROWS))

        async def wide() -> None:
            told = await tool.call(json.dumps({"query": WIDE_QUERY, "name": "wide"}))
            if "100 rows × 2 columns" not in told:
                raise RuntimeError(f"the wide rows were not loaded: {told[:300]}")

        wide_peak, wide_took = await _peak_while(wide())
        return {
            **summary(times),
            "peak_mib": peak / 2**20,
            "load_1m_ms": took * 1000,
            "wide_peak_mib": wide_peak / 2**20,
            "wide_ms": wide_took * 1000,
        }


async def _peak_while(work: Any) -> tuple[int, float]:
    """(the most the process's RSS rose over its level before ``work``, seconds ``work`` took)."""
    process = psutil.Process()
    base = process.memory_info().rss
    peak = base
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        await work
    finally:
        took = time.perf_counter() - started
        done.set()
        sampler.join()
    return peak - base, took
