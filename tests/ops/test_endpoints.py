"""The ops endpoints of a real core: /healthz, /metrics after a real turn, /readyz as the
model endpoint goes down and comes back, and what else makes the bot unready."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bot import metrics
from bot.health import Readiness
from bot.store import Store
from tests.fakes.memory import MemoryChat
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call
from tests.ops.conftest import Ops, Switch, value

pytestmark = pytest.mark.timeout(90)


async def test_healthz_answers_while_the_loop_runs(ops: Ops) -> None:
    status, body = await ops.get("/healthz")
    assert status == 200 and '"ok"' in body


async def test_metrics_move_after_one_real_turn(ops: Ops, llm: ScriptedOpenAI) -> None:
    before = await ops.metrics()
    # Every known label value is there from the start, at whatever this process counted so far.
    assert ("threadbook_turns_total", (("outcome", "answer"),)) in before
    assert ("threadbook_executions_total", (("outcome", "timeout_restarted"),)) in before
    assert ("threadbook_errors_total", (("kind", "llm_connection"),)) in before
    assert value(before, "threadbook_kernels_max") == ops.core.settings.kernels.max_kernels
    assert ("threadbook_new_thread_kernels_total", (("warm", "hit"),)) in before
    assert value(before, "threadbook_kernels_warm_target") == 0  # no warm pool here

    llm.script(tool_call("print(6 * 7)", usage=(120, 15)), answer("It is 42.", usage=(160, 6)))
    chat = MemoryChat(ops.core.dispatcher)
    outbox = await chat.say("what is 6 times 7?", message_id="m-metrics")
    assert outbox.reply.text == "It is 42." and outbox.reply.ok

    after = await ops.metrics()

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("threadbook_turns_total", outcome="answer") == 1
    assert moved("threadbook_turn_duration_seconds_count") == 1
    assert moved("threadbook_executions_total", outcome="ok") == 1
    assert moved("threadbook_execution_duration_seconds_count") == 1
    assert moved("threadbook_llm_tokens_total", model="fake-model", kind="prompt") == 280
    assert moved("threadbook_llm_tokens_total", model="fake-model", kind="completion") == 21
    assert moved("threadbook_llm_request_duration_seconds_count", model="fake-model") == 2
    # The thread's kernel stays after its turn, read from the pool at scrape time.
    assert value(after, "threadbook_kernels", state="idle") + value(after, "threadbook_kernels", state="busy") == 1
    assert value(after, "threadbook_kernel_queue_waiting") == 0
    assert value(after, "threadbook_threads_queued") == 0

    # A command is a turn of its own outcome; nothing else moves for it.
    status_before = await ops.metrics()
    await chat.say("help", message_id="m-help")
    after_help = await ops.metrics()
    assert (
        value(after_help, "threadbook_turns_total", outcome="command")
        - value(status_before, "threadbook_turns_total", outcome="command")
        == 1
    )


async def test_metrics_count_failed_model_requests_and_errored_code(
    ops: Ops, llm: ScriptedOpenAI, switch: Switch
) -> None:
    before = await ops.metrics()
    llm.script(tool_call("1 / 0"), answer("Division by zero."))
    chat = MemoryChat(ops.core.dispatcher)
    await chat.say("divide by zero", message_id="m-zero")
    await switch.off()
    failed = await chat.say("again?", message_id="m-down")
    assert not failed.reply.ok
    after = await ops.metrics()
    assert (
        value(after, "threadbook_executions_total", outcome="error")
        - value(before, "threadbook_executions_total", outcome="error")
        == 1
    )
    assert (
        value(after, "threadbook_turns_total", outcome="llm_error")
        - value(before, "threadbook_turns_total", outcome="llm_error")
        == 1
    )
    assert (
        value(after, "threadbook_errors_total", kind="llm_connection")
        - value(before, "threadbook_errors_total", kind="llm_connection")
        == 1
    )


async def test_readyz_follows_the_model_endpoint(ops: Ops, llm: ScriptedOpenAI, switch: Switch) -> None:
    readiness = ops.server.readiness
    # Up, and nothing asked yet: readiness asks GET /models itself.
    status, body = await ops.ready()
    assert status == 200, body
    assert body["ready"] is True and body["failed"] == []
    assert set(body["checks"]) == {"store", "sandbox", "llm", "stopping"}
    assert body["checks"]["llm"]["detail"] == "GET /models answered HTTP 200"

    # Down: the answer above is kept PROBE_CACHE_S; once that has passed, it is 503 naming the llm.
    await switch.off()
    status, body = await ops.ready()
    assert status == 200, "the probe's answer is kept for a while"
    readiness.probe_cache_s = 0  # (instead of waiting 10 s)
    status, body = await ops.ready()
    assert status == 503, body
    assert body["ready"] is False and body["failed"] == ["llm"]
    assert not body["checks"]["llm"]["ok"] and "could not be reached" in body["checks"]["llm"]["detail"]
    assert body["checks"]["store"]["ok"] and body["checks"]["sandbox"]["ok"]

    # Back (the same URL): ready again.
    await switch.on()
    status, body = await ops.ready()
    assert status == 200, body

    # A real answer to the bot's own request counts: no probe needed for LLM_RECENT_S ...
    llm.script(answer("Hello!"))
    chat = MemoryChat(ops.core.dispatcher)
    assert (await chat.say("hello", message_id="m-hello")).reply.ok
    status, body = await ops.ready()
    assert status == 200 and body["checks"]["llm"]["detail"].startswith("answered a request")
    await switch.off()
    status, body = await ops.ready()
    assert status == 200, "a request answered within the last minute, and none failed since"
    # ... until one of its requests fails: then readiness asks again, and the endpoint is down.
    assert not (await chat.say("still there?", message_id="m-fail")).reply.ok
    status, body = await ops.ready()
    assert status == 503 and body["failed"] == ["llm"]
    await switch.on()
    status, body = await ops.ready()
    assert status == 200, body


async def test_readyz_is_unready_while_stopping(ops: Ops) -> None:
    ops.server.readiness.stopping = True
    status, body = await ops.ready()
    assert status == 503 and body["failed"] == ["stopping"]


async def test_readyz_names_a_store_that_cannot_be_read(ops: Ops, tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "other" / "threadbook.db")
    readiness = Readiness(
        store=store, llm=ops.core.settings.llm, kernels=ops.core.settings.kernels, launcher=ops.core.pool.launcher
    )
    try:
        assert (await readiness.store_check()).ok
        await store.close()
        check = await readiness.store_check()
        assert not check.ok and "store" in check.detail
    finally:
        await readiness.close()


def test_every_metric_is_in_the_bot_registry_only() -> None:
    from prometheus_client import REGISTRY as GLOBAL

    ours = {name for name in metrics.REGISTRY._names_to_collectors if name.startswith("threadbook_")}
    assert "threadbook_turns_total" in ours and "threadbook_llm_tokens_total" in ours
    assert not {name for name in GLOBAL._names_to_collectors if name.startswith("threadbook_")}


def deliberately_blocking_the_loop(seconds: float) -> None:
    """What a bug in the bot looks like to the loop: synchronous work that never yields."""
    time.sleep(seconds)


async def test_a_blocked_loop_is_reported_by_the_watchdog_and_fails_healthz(
    ops: Ops, caplog: pytest.LogCaptureFixture
) -> None:
    before = value(await ops.metrics(), "threadbook_event_loop_stalls_total")
    seen: dict[str, tuple[int, str]] = {}

    def probe() -> None:  # an orchestrator's liveness probe, from outside the blocked loop
        time.sleep(1.8)
        try:
            with urllib.request.urlopen(ops.server.url + "/healthz", timeout=5) as response:
                seen["during"] = (response.status, response.read().decode())
        except urllib.error.HTTPError as exc:
            seen["during"] = (exc.code, exc.read().decode())

    prober = threading.Thread(target=probe)
    with caplog.at_level(logging.ERROR, logger="bot.loopwatch"):
        prober.start()
        deliberately_blocking_the_loop(3.0)
        prober.join(10)
    status, body = seen["during"]
    assert status == 503 and '"stalled"' in body
    stalls = [r for r in caplog.records if "has not turned" in r.getMessage()]
    assert len(stalls) == 1 and "deliberately_blocking_the_loop" in stalls[0].getMessage()
    await asyncio.sleep(0.3)  # the loop turns again: healthy again, the stall counted once
    assert (await ops.get("/healthz"))[0] == 200
    assert value(await ops.metrics(), "threadbook_event_loop_stalls_total") == before + 1
