"""Turns per second through whole bot processes: one and two replicas on one PostgreSQL, and one
on the default SQLite store for comparison.

Each replica is a real ``python -m bot run`` process (so two replicas can use both cores)
behind the Slack Events API of a fake Slack; the model answers at once with text and no code,
so this measures the bot's own work per message (claim, queue, store, posting) plus one
kernel per thread (a turn leases its thread's kernel before asking the model; forked from
the fork server here), which is why there are few threads with many messages each. The load:
``threads`` threads of ``MESSAGES`` messages each, every message delivered right after the
previous delivery (a thread's next one is not held back for the answer), spread round-robin
over the replicas as a load balancer would. Measured from the first delivery to the last ✅
reaction (which the bot adds after posting its answer): turns per second, and per turn the
time from its delivery to its ✅. A turn not answered exactly once, or answered out of order
within its thread, counts as an error.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import yaml

from bench.gateway import KERNEL_PYTHON, free_port
from bench.kernels import summary
from bench.postgres import LocalPostgres
from tests.fakes.bot_process import BotProcesses
from tests.fakes.openai_server import ScriptedOpenAI, answer
from tests.fakes.slack_server import FakeSlack

#: The modes of this scenario: the store, the number of replicas, and how messages are spread:
#: round-robin per message (a thread's messages alternate between replicas, as a load balancer
#: that knows no threads would), or "sticky" (each thread's messages to one replica).
MODES = ("sqlite", "1-replica", "2-replicas", "2-replicas-sticky")
#: The modes that need PostgreSQL.
POSTGRES_MODES = frozenset(MODES[1:])
#: Messages per thread.
MESSAGES = 10
#: A pause between deliveries, as between events of a busy channel (and so that a thread's
#: messages are claimed in the order they were sent, as Slack's are).
_GAP_S = 0.004
_TOKEN = re.compile(r"\b(t\d+m\d+)\b")


def _model(request: dict[str, Any]) -> Any:
    asked = next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")
    found = _TOKEN.search(asked)
    return answer(f"echo {found.group(1) if found else '?'}")


def _config(
    folder: Path, shared: Path, *, slack: FakeSlack, llm: ScriptedOpenAI, store: dict[str, Any], port: int
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "llm": {"base_url": llm.base_url, "api_key": "k", "model": "fake-model", "max_retries": 0},
                "slack": {
                    "bot_token": slack.bot_token,
                    "signing_secret": slack.signing_secret,
                    "api_url": slack.api_url,
                    "http_host": "127.0.0.1",
                    "http_port": port,
                },
                "kernels": {
                    "workspace_root": str(shared / "workspaces"),
                    "sandbox": "none",
                    "warm_pool": 0,
                    "preload": [],
                    "fork_server": True,
                    "python": str(KERNEL_PYTHON),
                    "packages": {"dir": str(shared / "packages")},
                },
                "storage": store,
            }
        )
    )
    return config


async def turns_per_second(mode: str, root: Path, threads: int) -> dict[str, Any]:
    """``threads`` × :data:`MESSAGES` messages through the replicas of ``mode``."""
    if mode == "sqlite":
        return await _measure(root, 1, {"path": str(root / "threadbook.db")}, threads)
    postgres = LocalPostgres()
    await asyncio.to_thread(postgres.start)
    try:
        url = await asyncio.to_thread(postgres.database)
        return await _measure(
            root, 1 if mode == "1-replica" else 2, {"url": url}, threads, sticky=mode.endswith("sticky")
        )
    finally:
        await asyncio.to_thread(postgres.stop)


async def _measure(
    root: Path, replicas: int, store: dict[str, Any], threads: int, *, sticky: bool = False
) -> dict[str, Any]:
    async with FakeSlack() as slack, ScriptedOpenAI() as llm:
        llm.script(*[_model] * (threads * MESSAGES + 10))
        bots, urls = [], []
        for n in range(replicas):
            port = free_port()
            config = _config(root / f"replica-{n}", root, slack=slack, llm=llm, store=store, port=port)
            bots.append(BotProcesses(root / f"replica-{n}", config))
            urls.append(f"http://127.0.0.1:{port}/slack/events")
        try:
            await asyncio.gather(*(b.start() for b in bots))
            await asyncio.gather(*(b.wait_for_log("Slack: Events API at", 60) for b in bots))
            return await _load(slack, urls, threads, sticky)
        finally:
            for bot in bots:
                if bot.process is not None and bot.process.returncode is None:
                    await bot.terminate()
                bot.cleanup()


async def _load(slack: FakeSlack, urls: list[str], threads: int, sticky: bool) -> dict[str, Any]:
    roots: dict[int, dict[str, Any]] = {}
    delivered: dict[str, float] = {}  # message ts → when its delivery began
    started = time.monotonic()
    sent = 0
    for m in range(MESSAGES):
        for t in range(threads):
            token = f"t{t}m{m}"
            if m == 0:
                event = roots[t] = slack.mention(f"C{t}", f"question {token}")
            else:
                event = slack.message_event(f"C{t}", f"and {token}", thread_ts=roots[t]["ts"])
            delivered[event["ts"]] = time.monotonic()
            status, _ = await slack.post_event(urls[(t if sticky else sent) % len(urls)], event)
            if status != 200:
                raise RuntimeError(f"the bot answered the event with HTTP {status}")
            sent += 1
            await asyncio.sleep(_GAP_S)

    def done_at() -> dict[str, float]:
        return {
            str(c.args.get("timestamp")): c.at
            for c in slack.calls_to("reactions.add")
            if c.args.get("name") == "white_check_mark"
        }

    await slack.wait_for(lambda: len(done_at()) >= sent or None, timeout=300)
    finished = done_at()
    wall = max(finished.values()) - started
    await asyncio.sleep(0.5)  # a duplicate answer would arrive now
    errors = 0
    for t, root in roots.items():
        answers = [m.text for m in slack.bot_messages(f"C{t}", root["ts"]) if m.text.startswith("echo ")]
        expected = [f"echo t{t}m{m}" for m in range(MESSAGES)]
        errors += sum(1 for got, want in zip(answers, expected) if got != want) + abs(len(answers) - len(expected))
    result = summary([finished[ts] - at for ts, at in delivered.items() if ts in finished])
    result.update(wall_s=wall, errors=errors, turns_per_s=sent / wall)
    return result
