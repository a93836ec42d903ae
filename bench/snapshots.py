"""The ``restore`` scenario: a thread's variables saved and loaded into its next kernel.

The namespace holds a 1-million-row DataFrame (numbers, strings, categories, timestamps:
about 60 MiB in memory) and the CSV it came from. Measured per kernel source, in one run:
``save_ms`` (the bot's save, as after a turn), ``p50_ms``/``max_ms`` (the restore a new
kernel of the thread waits for), ``csv_ms`` (re-reading the CSV instead, what the model
would do without a snapshot) and the snapshot's size.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bench.kernels import Sandbox, open_pool, summary

ROWS = 1_000_000
NAMESPACE = f"""
import numpy as np, pandas as pd
rng = np.random.default_rng(7)
n = {ROWS}
df = pd.DataFrame({{
    "order_id": np.arange(n),
    "amount": rng.gamma(2.0, 50.0, n).round(2),
    "quantity": rng.integers(1, 20, n),
    "region": pd.Categorical(rng.choice(["north", "south", "east", "west"], n)),
    "customer": [f"customer-{{i % 50_000}}" for i in range(n)],
    "ordered_at": pd.date_range("2024-01-01", periods=n, freq="min"),
}})
df.to_csv("orders.csv", index=False)
by_region = df.groupby("region", observed=True).amount.sum()
"""
CHECK = "assert len(df) == n and by_region.sum() > 0"
#: The same DataFrame from the CSV, dtypes included (what the model would run without a snapshot).
CSV_READ = "df_again = pd.read_csv('orders.csv', parse_dates=['ordered_at'], dtype={'region': 'category'})"
KEY = "bench:restore"


async def restore(mode: str, root: Path, samples: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """Save and restore a namespace with a 1M-row DataFrame ``samples`` times; re-read its CSV as often."""
    async with open_pool(mode, root, sandbox=sandbox, warm=1) as pool:
        session = await pool.get_or_start(KEY)
        made = await session.execute(NAMESPACE, timeout=300)
        if not made.ok:
            raise RuntimeError(f"building the namespace failed: {made.error}")
        saves: list[float] = []
        restores: list[float] = []
        csv: list[float] = []
        size = 0
        for _ in range(samples):
            await session.execute("df.loc[0, 'quantity'] += 0")  # code ran: the next save writes
            started = time.perf_counter()
            report = await session.save_state()
            saves.append(time.perf_counter() - started)
            if report is None:
                raise RuntimeError("the save wrote nothing")
            size = report.bytes
            await pool.shutdown(KEY)  # nothing unsaved: no second save on the way down
            if pool.warm is not None:
                await pool.warm.wait_ready(timeout=120)
            session = await pool.get_or_start(KEY)
            restored = session.restored
            if restored is None or restored.failure is not None or not (await session.execute(CHECK)).ok:
                raise RuntimeError(f"the restore failed: {restored}")
            restores.append(restored.seconds)
            started = time.perf_counter()
            reread = await session.execute(CSV_READ, timeout=300)
            csv.append(time.perf_counter() - started)
            if not reread.ok:
                raise RuntimeError(f"re-reading the CSV failed: {reread.error}")
            await session.execute("del df_again")
    result = summary(restores)
    result["save_ms"] = statistics.median(saves) * 1000
    result["csv_ms"] = statistics.median(csv) * 1000
    result["snapshot_mib"] = size / 2**20
    return result
