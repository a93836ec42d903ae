"""The real ``python -m bot run`` with ``ops.http_port`` and ``logging.format: json``: the
endpoints answer, a Slack turn moves /metrics and logs JSON lines that name it, and SIGTERM
makes the replica unready before it stops."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import kernel_config
from tests.fakes.bot_process import BotProcesses, eventually
from tests.fakes.openai_server import ScriptedOpenAI, answer, delay, tool_call
from tests.fakes.slack_server import FakeSlack

BOT_TOKEN, APP_TOKEN = "xoxb-ops-bot-4711", "xapp-ops-app-4712"

pytestmark = pytest.mark.timeout(90)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest_asyncio.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[FakeSlack, ScriptedOpenAI, BotProcesses, str]]:
    port = free_port()
    async with FakeSlack(bot_token=BOT_TOKEN, app_token=APP_TOKEN) as slack, ScriptedOpenAI() as llm:
        config = tmp_path / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "llm": {"base_url": llm.base_url, "api_key": "k", "model": "fake-model", "max_retries": 0},
                    "slack": {
                        "bot_token": BOT_TOKEN,
                        "app_token": APP_TOKEN,
                        "api_url": slack.api_url,
                        "streaming": False,
                    },
                    "kernels": kernel_config(tmp_path),
                    "storage": {"path": str(tmp_path / "data" / "threadbook.db")},
                    "ops": {"shutdown_grace_s": 3, "http_host": "127.0.0.1", "http_port": port},
                    "logging": {"format": "json"},
                }
            )
        )
        bots = BotProcesses(tmp_path, config)
        try:
            yield slack, llm, bots, f"http://127.0.0.1:{port}"
        finally:
            bots.cleanup()


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.get(url) as response:
        return response.status, await response.text()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


async def test_the_bot_process_serves_ops_and_logs_json(
    world: tuple[FakeSlack, ScriptedOpenAI, BotProcesses, str],
) -> None:
    slack, llm, bots, base = world
    await bots.start()
    await bots.wait_for_log("operations endpoints on 127.0.0.1", timeout=30)
    await slack.wait_for(lambda: slack.socket_connects == 1, 20)
    async with aiohttp.ClientSession() as http:
        assert (await get(http, base + "/healthz"))[0] == 200
        status, body = await get(http, base + "/readyz")
        assert status == 200, body

        llm.script(tool_call("print(2 ** 10)"), answer("It is 1024."))
        event = slack.mention("C_OPS", "what is 2 to the 10th?")
        await slack.socket_send("events_api", slack.event_callback(event))
        await slack.wait_for(lambda: [m for m in slack.bot_messages("C_OPS", event["ts"]) if "1024" in m.text], 30)

        # Counted once the turn has ended (its reply is posted just before).
        for _ in range(100):
            metrics = samples((await get(http, base + "/metrics"))[1])
            if metrics.get(("threadbook_turns_total", (("outcome", "answer"),))) == 1:
                break
            await asyncio.sleep(0.05)
        assert metrics[("threadbook_turns_total", (("outcome", "answer"),))] == 1
        assert metrics[("threadbook_executions_total", (("outcome", "ok"),))] == 1
        assert metrics[("threadbook_llm_tokens_total", (("kind", "prompt"), ("model", "fake-model")))] > 0

    # Every line the process wrote is one JSON object.
    lines: list[dict[str, Any]] = [json.loads(raw) for raw in bots.log().splitlines() if raw.strip()]
    assert lines and any(line["message"].startswith("Threadbook is running") for line in lines)
    turn = [line for line in lines if line.get("turn") == f"C_OPS:{event['ts']}"]
    assert turn and all(line["thread"] == f"slack:T1:C_OPS:{event['ts']}" for line in turn)
    assert any(line["logger"] == "bot.turn" for line in turn)

    # SIGTERM with a turn running: during the grace the replica is unready (no new events are
    # routed to it) and still alive; then it stops cleanly.
    llm.script(delay(60))
    hanging = slack.mention("C_OPS", "and slowly?")
    await slack.socket_send("events_api", slack.event_callback(hanging))
    await eventually(lambda: len(llm.requests) == 3)
    stopped = asyncio.create_task(bots.terminate())
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            status, body = await get(http, base + "/readyz")
            if status == 503:
                break
            await asyncio.sleep(0.01)
        assert status == 503 and json.loads(body)["failed"] == ["stopping"], body
        assert (await get(http, base + "/healthz"))[0] == 200
    assert await stopped == 0, bots.log()
