"""The benchmark's smoke run (``python -m bench --quick``) so the bench cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.postgres import find_postgres

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_quick_bench_writes_results_and_prints_the_table(tmp_path: Path) -> None:
    output = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,  # a smoke run; a loaded 2-core CI box is slow
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(output.read_text())
    assert document["quick"] is True
    for scenario in ("first_exec", "burst", "turn_overhead", "concurrent"):
        for mode in ("spawn", "pool", "fork"):
            result = document["results"][scenario][mode]
            assert "error" not in result and result["n"] > 0, (scenario, mode, result)
    assert all(r["errors"] == 0 for r in document["results"]["concurrent"].values())
    assert "| first_exec | pool |" in done.stdout and "| target | measured | met |" in done.stdout
    unmeasured = [c for c in document["targets"] if c["met"] is None]
    without_postgres = find_postgres()[0] is None  # the replica and sources modes need it (CI installs it)
    needs_postgres = [c for c in unmeasured if c["scenario"] in ("replicas", "sources")]
    assert unmeasured == (needs_postgres if without_postgres else [])
    assert document["results"]["replicas"]["sqlite"]["errors"] == 0
    # The fork path's breakdown: every step measured, the kernel's side from the forked child.
    path = document["results"]["fork_path"]["fork"]
    assert "error" not in path, path
    steps = path["steps_ms"]
    assert len(steps) == 9 and all(ms >= 0 for ms in steps.values()) and steps["child: IPKernelApp.initialize"] > 0
    assert abs(sum(steps.values()) - path["p50_ms"]) < path["p50_ms"]  # the steps make up the whole, roughly
    assert "Fork path (pool empty), p50 per step:" in done.stdout
