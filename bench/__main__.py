"""``python -m bench [--quick]``: kernel start-up and bot benchmarks, spawn vs pool vs fork vs gateway.

Prints one table (p50/p90/max, wall time, idle PSS), writes ``bench/results.json`` and
checks the targets (issues 7 and 21); a missed target makes the exit code 1, except in ``--quick``
mode (a smoke run for CI: fewer samples, targets reported only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import (
    cpu,
    fork_path,
    freeze,
    kernels,
    mcp,
    previews,
    rendering,
    replicas,
    slack,
    snapshots,
    sources,
    warm_trace,
)
from bench.gateway import GATEWAY, stop_shared_gateway
from bench.kernels import Sandbox
from bench.postgres import find_postgres

RESULTS = Path(__file__).with_name("results.json")


@dataclass(frozen=True)
class Sizes:
    """How much each scenario does."""

    first: int
    burst: int
    turns: int
    concurrent: int
    queued: int
    restores: int
    #: Threads of the ``replicas`` scenario (each gets ``replicas.MESSAGES`` messages).
    replica_threads: int
    #: New threads in each burst of the ``warm_trace`` scenario; 0: not run (it takes ~50 s).
    trace_burst: int = 0
    #: How long the ``freeze`` scenario watches an idle kernel whose cell left a spinning thread.
    idle_s: float = 2.0


FULL = Sizes(
    first=10,
    burst=100,
    turns=30,
    concurrent=100,
    queued=24,
    restores=5,
    replica_threads=10,
    trace_burst=20,
    idle_s=60.0,
)
QUICK = Sizes(first=2, burst=3, turns=5, concurrent=5, queued=4, restores=1, replica_threads=2)


@dataclass(frozen=True)
class Target:
    """One goal: ``scenario``/``mode`` result ``field`` must be <= ``limit``."""

    scenario: str
    mode: str
    field: str
    limit: float
    text: str


TARGETS = (
    Target("first_exec", "pool", "p50_ms", 20, "first execution, warm kernel available: p50 <= 20 ms"),
    Target("first_exec", "fork", "p50_ms", 50, "first execution, pool empty (fork server): p50 <= 50 ms"),
    Target("burst", "pool", "max_ms", 3000, "100 new threads at once (warm pool): all within 3 s"),
    Target("burst", "pool", "floor_s", 1.0, "100 new kernels at once (warm pool): CPU floor (CPU / cores) <= 1 s"),
    Target("burst", "pool", "floor_ratio", 1.3, "100 new kernels at once (warm pool): wall <= 1.3 x its CPU floor"),
    Target("burst", "fork", "max_ms", 5000, "100 new threads at once (fork server): all within 5 s"),
    Target("burst", "fork", "idle_pss_mib", 20, "idle kernel with pandas/numpy/matplotlib: <= 20 MiB PSS"),
    Target("turn_overhead", "pool", "p50_ms", 20, "bot overhead per turn via Slack, print(1): p50 <= 20 ms"),
    Target("turn_api", "pool", "delta_p50_ms", 2, "a Responses API turn's overhead within 2 ms of a chat turn's (p50)"),
    Target("concurrent", "pool", "errors", 0, "100 concurrent threads answered, no error (warm pool)"),
    Target("concurrent", "pool", "wall_s", 3.0, "100 new Slack threads answered at once (warm pool): within 3 s"),
    Target("concurrent", "fork", "errors", 0, "100 concurrent threads answered, no error (fork server)"),
    Target("concurrent", "fork", "wall_s", 4.0, "100 new Slack threads answered at once (fork server): within 4 s"),
    Target("concurrent", "spawn", "errors", 0, "100 concurrent threads answered, no error (spawn)"),
    Target(
        "queued", "fork", "errors", 0, "24 new threads against 12 kernels: all answered, none refused (fork server)"
    ),
    Target("queued", "pool", "errors", 0, "24 new threads against 12 kernels: all answered, none refused (warm pool)"),
    Target("restore", "fork", "p50_ms", 1000, "restore a thread's 1M-row DataFrame into its next kernel: p50 <= 1 s"),
    Target("freeze", "fork", "p50_ms", 2, "freeze + CPU reading + thaw of a thread's kernel: p50 <= 2 ms"),
    Target(
        "freeze", "fork", "idle_cpu_s", 0.05, "an idle thread's kernel, a spinning thread in it: no CPU (<= 0.05 s)"
    ),
    Target("preview", "fork", "p50_ms", 50, "an upload's preview (20,000-row CSV) added to a turn: p50 <= 50 ms"),
    Target("preview", "fork", "crowd_ratio", 1.3, "20 previews at once: wall <= 1.3 x their CPU floor"),
    Target("preview", "fork", "export_html_ms", 300, "export html of a 10-cell thread: p50 <= 300 ms"),
    Target(
        "sources", "spawn", "p50_ms", 1500, "100,000 rows x 5 columns from PostgreSQL into a DataFrame: p50 <= 1.5 s"
    ),
    Target("sources", "spawn", "peak_mib", 100, "the bot's memory while fetching 1,000,000 rows: <= +100 MiB"),
    Target("sources", "spawn", "wide_peak_mib", 100, "the bot's memory while fetching 100 rows of 4 MB: <= +100 MiB"),
    Target("mcp", "http", "p50_ms", 20, "an MCP tool call against a local streamable HTTP server: p50 <= 20 ms"),
    Target(
        "mcp", "http", "big_peak_mib", 64, "the bot's memory while a 3 MB MCP result comes and is saved: <= +64 MiB"
    ),
    Target(
        "mcp",
        "http",
        "stall_3mb_ms",
        50,
        "the event loop's largest stall while a 3 MB MCP result comes (HTTP): <= 50 ms",
    ),
    Target(
        "mcp",
        "stdio",
        "stall_3mb_ms",
        50,
        "the event loop's largest stall while a 3 MB MCP result comes (stdio): <= 50 ms",
    ),
    Target("rendering", "slack_table", "p90_ms", 5, "a 100-row table laid out for Slack (native block): p90 <= 5 ms"),
    Target("rendering", "discord_table", "p90_ms", 5, "a 100-row table laid out for Discord (code block): p90 <= 5 ms"),
    Target("rendering", "chart", "p90_ms", 5, "a 6-series chart read and made a Slack chart block: p90 <= 5 ms"),
    Target(
        "replicas",
        "2-replicas",
        "errors",
        0,
        "100 messages in 10 threads through 2 replicas on PostgreSQL: each answered once, in order",
    ),
)


def scenarios(sizes: Sizes, sandbox: Sandbox = "none") -> dict[str, Callable[[str, Path], Awaitable[dict[str, Any]]]]:
    """Scenario name → coroutine function (mode, scratch dir) → result, kernels under ``sandbox``."""
    return {
        "first_exec": lambda mode, root: kernels.first_execution(mode, root, sizes.first, sandbox=sandbox),
        "fork_path": lambda mode, root: fork_path.fork_path(root, sizes.first * 2, sandbox=sandbox),
        "burst": lambda mode, root: kernels.burst(mode, root, sizes.burst, sandbox=sandbox),
        "turn_overhead": lambda mode, root: slack.turn_overhead(mode, root, sizes.turns, sandbox=sandbox),
        "turn_api": lambda mode, root: slack.api_overhead(mode, root, sizes.turns, sandbox=sandbox),
        "concurrent": lambda mode, root: slack.concurrent_threads(mode, root, sizes.concurrent, sandbox=sandbox),
        "queued": lambda mode, root: slack.queued_threads(mode, root, sizes.queued, sandbox=sandbox),
        "restore": lambda mode, root: snapshots.restore(mode, root, sizes.restores, sandbox=sandbox),
        "freeze": lambda mode, root: freeze.freeze_cost(mode, root, sizes.turns, sizes.idle_s, sandbox=sandbox),
        "replicas": lambda mode, root: replicas.turns_per_second(mode, root, sizes.replica_threads),
        "sources": lambda mode, root: sources.load_rows(mode, root, sizes.first, sandbox=sandbox),
        "rendering": lambda mode, root: rendering.render_cost(mode, root, sizes.turns * 10),
        "mcp": lambda mode, root: mcp.call_cost(mode, root, sizes.turns * 10),
        "preview": lambda mode, root: previews.preview_cost(mode, root, sizes.first, sandbox=sandbox),
        **(
            {"warm_trace": lambda mode, root: warm_trace.replay(mode, root, sizes.trace_burst, sandbox=sandbox)}
            if sizes.trace_burst
            else {}
        ),
    }


#: Scenarios whose modes are not kernel sources.
SCENARIO_MODES: dict[str, tuple[str, ...]] = {
    "replicas": replicas.MODES,
    "warm_trace": warm_trace.MODES,
    "fork_path": ("fork",),
    "sources": sources.MODES,
    "freeze": ("spawn", "fork"),
    "turn_api": ("pool",),
    "rendering": rendering.MODES,
    "mcp": mcp.MODES,
    "preview": previews.MODES,
}


async def run(
    sizes: Sizes,
    only: set[str] | None,
    sandbox: Sandbox = "none",
    modes: set[str] | None = None,
    *,
    quiet_first: bool = True,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every scenario for every mode (or only those in ``only`` and ``modes``); a failing one
    records its error and the run goes on. ``quiet_first``: each scenario waits until the
    machine is quiet (:func:`bench.cpu.settle`: the last one's kernels may still be going away)."""
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name, scenario in scenarios(sizes, sandbox).items():
        if only and name not in only:
            continue
        for mode in SCENARIO_MODES.get(name, kernels.MODES):
            if modes and mode not in modes:
                continue
            if mode in kernels.GATEWAY_MODES and (name not in kernels.GATEWAY_SCENARIOS or not GATEWAY.exists()):
                continue  # without .venv-gateway (make gateway-env) the gateway sources are left out
            if (mode in replicas.POSTGRES_MODES or name == "sources") and find_postgres()[0] is None:
                continue  # without PostgreSQL (Debian: postgresql) the replica modes are left out
            settled = await cpu.settle() if quiet_first else 0.0
            with tempfile.TemporaryDirectory(prefix=f"bench-{name}-{mode}-") as scratch:
                started = time.perf_counter()
                try:
                    outcome = await scenario(mode, Path(scratch))
                except Exception as exc:  # reported in the table and the JSON
                    logging.getLogger("bench").exception("%s/%s failed", name, mode)
                    outcome = {"error": f"{type(exc).__name__}: {exc}"}
                outcome["scenario_s"] = time.perf_counter() - started
                outcome["settled_s"] = settled
            results.setdefault(name, {})[mode] = outcome
            print(f"  {name:<14} {mode:<6} done in {outcome['scenario_s']:.1f} s", file=sys.stderr, flush=True)
    return results


def check(results: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each target with the measured value and whether it was met (None: not measured)."""
    checks = []
    for target in TARGETS:
        value = results.get(target.scenario, {}).get(target.mode, {}).get(target.field)
        met = None if value is None else value <= target.limit
        checks.append(
            {"target": target.text, "scenario": target.scenario, "value": value, "limit": target.limit, "met": met}
        )
    return checks


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


#: Scenario-specific numbers shown in the table's last column: key → label.
_ALSO = {
    "save_ms": "save {:.0f} ms",
    "csv_ms": "CSV re-read {:.0f} ms",
    "snapshot_mib": "snapshot {:.1f} MiB",
    "turns_per_s": "{:.1f} turns/s",
    "hit_rate": "hit rate {:.0%}",
    "peak_warm": "peak warm {}",
    "floor_s": "floor {:.2f} s",
    "cpu_per_kernel_ms": "CPU {:.0f} ms/kernel",
    "peak_mib": "bot peak +{:.1f} MiB (1M rows)",
    "load_1m_ms": "1M rows {:.0f} ms",
    "wide_peak_mib": "bot peak +{:.1f} MiB (100 rows of 4 MB)",
    "wide_ms": "wide rows {:.0f} ms",
    "sdk_p50_ms": "bare SDK call p50 {:.2f} ms",
    "big_peak_mib": "bot peak +{:.1f} MiB (3 MB result)",
    "big_kept_mib": "+{:.1f} MiB after it",
    "big_ms": "3 MB result {:.0f} ms",
    "stall_3mb_ms": "loop stall {:.0f} ms (3 MB)",
    "stall_12mb_ms": "{:.0f} ms (12 MB)",
    "chat_p50_ms": "chat p50 {:.1f} ms",
    "floor_ratio": "wall / floor {:.2f}",
    "cpu_per_turn_ms": "CPU {:.0f} ms/turn",
    "crowd_wall_ms": "20 at once {:.0f} ms",
    "crowd_floor_ms": "floor {:.0f} ms",
    "crowd_ratio": "wall / floor {:.2f}",
    "export_html_ms": "export html {:.0f} ms",
    "export_ms": "export {:.0f} ms",
    "delta_p50_ms": "Responses − chat p50 {:+.1f} ms",
}


def _also(result: dict[str, Any]) -> str:
    return ", ".join(label.format(result[key]) for key, label in _ALSO.items() if key in result)


def table(results: dict[str, dict[str, dict[str, Any]]], checks: list[dict[str, Any]]) -> str:
    """The results and target checks as a Markdown table."""
    lines = [
        "| scenario | mode | n | p50 ms | p90 ms | max ms | wall s | idle PSS MiB | errors | also |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, by_mode in results.items():
        for mode, r in by_mode.items():
            if "error" in r:
                lines.append(f"| {name} | {mode} | failed: {r['error'][:80]} | | | | | | | |")
                continue
            lines.append(
                f"| {name} | {mode} | {r.get('n', '-')} | {_fmt(r.get('p50_ms'))} | {_fmt(r.get('p90_ms'))} | "
                f"{_fmt(r.get('max_ms'))} | {_fmt(r.get('wall_s'), 2)} | {_fmt(r.get('idle_pss_mib'))} | "
                f"{_fmt(r.get('errors'))} | {_also(r)} |"
            )
    path = results.get("fork_path", {}).get("fork", {})
    if "steps_ms" in path:
        lines += ["", "Fork path (pool empty), p50 per step:", "", fork_path.breakdown_table(path)]
    for mode, r in results.get("concurrent", {}).items():
        if "cpu" in r:
            title = f"CPU per turn, {r['cpu']['turns']} new Slack threads at once ({mode}), by phase:"
            lines += ["", title, "", cpu.table(r["cpu"])]
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for c in checks:
        met = {True: "yes", False: "**NO**", None: "not measured"}[c["met"]]
        lines.append(f"| {c['target']} | {_fmt(c['value'])} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run, print, write results.json; exit 1 when a target is missed (not in --quick mode)."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small CI smoke run; targets do not fail it")
    parser.add_argument("--only", action="append", choices=list(scenarios(FULL)), help="run only these scenarios")
    parser.add_argument("--mode", action="append", help="run only these modes (spawn, pool, fork, ...)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON results")
    parser.add_argument(
        "--sandbox",
        choices=("none", "bwrap"),
        default="none",
        help="kernel sandbox of every mode (bwrap: spawned vs fork-server kernels in bubblewrap)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sizes = QUICK if args.quick else FULL
    started = time.perf_counter()
    try:
        only, modes = set(args.only or ()), set(args.mode or ())
        results = asyncio.run(run(sizes, only or None, args.sandbox, modes or None, quiet_first=not args.quick))
    finally:
        stop_shared_gateway()
    checks = check(results)
    document = {
        "quick": args.quick,
        "sandbox": args.sandbox,
        "sizes": sizes.__dict__,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "duration_s": time.perf_counter() - started,
        "results": results,
        "targets": checks,
    }
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    print(table(results, checks))
    failed = any(r.get("error") for by_mode in results.values() for r in by_mode.values())
    missed = any(c["met"] is False for c in checks)
    return 1 if failed or (missed and not args.quick) else 0


if __name__ == "__main__":
    sys.exit(main())
