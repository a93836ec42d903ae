"""A server that speaks only the Responses API answers a two-step turn with ``llm.api: auto``,
end to end: through Slack (real bolt and adapter, fake Slack, real kernels; the answer streamed)
and through ``python -m bot console``. Each tool result goes back with the turn's reasoning;
the reasoning reaches no one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.bot.test_console import run_cli, write_config
from tests.fakes.openai_server import ScriptedOpenAI, answer, encrypted, last_tool_output, tool_call
from tests.slack.conftest import running_bot
from tests.slack.test_outbound import shown_texts

THINK_1 = "SECRET-THOUGHT-1 set x first"
THINK_2 = "SECRET-THOUGHT-2 then print it"


def two_steps() -> list[Any]:
    return [
        tool_call("x = 6 * 7", reasoning=THINK_1),
        tool_call("print(x)", reasoning=THINK_2),
        # Slow enough (about a second) for Slack to be sent a draft before the answer is whole.
        lambda body: answer(
            ("x is 42." if "42" in (last_tool_output(body) or "") else "no 42") + " That is six sevens." * 3,
            pace_s=0.05,
        ),
    ]


def assert_reasoning_went_back(llm: ScriptedOpenAI) -> None:
    """Each request after a tool call carried the reasoning items of the turn so far, in order."""
    assert llm.missing == ["/v1/chat/completions"] and set(llm.endpoints) == {"responses"}
    assert llm.rejected == []
    first, second, third = llm.requests[:3]

    def reasoning(request: dict[str, Any]) -> list[str]:
        return [i["encrypted_content"] for i in request["input"] if i.get("type") == "reasoning"]

    assert reasoning(first) == []
    assert reasoning(second) == [encrypted(THINK_1)]
    assert reasoning(third) == [encrypted(THINK_1), encrypted(THINK_2)]
    assert "42" in (last_tool_output(third) or "")
    assert all(r["store"] is False for r in llm.requests)


async def test_a_responses_only_server_answers_through_slack(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False, streaming=True) as bot:
        bot.llm.apis = {"responses"}  # llm.api is auto (the default)
        bot.llm.script(*two_steps())
        event = bot.slack.mention("C1", "what is 6 times 7?")
        await bot.slack.post_event(bot.events_url, event)
        assert await bot.finished(event) == {"white_check_mark"}
        shown = json.dumps(list(shown_texts(bot.slack.calls)))
        streamed = [c for c in bot.slack.calls if c.method in ("chat.startStream", "chat.appendStream")]

        bot.llm.script(answer("You asked for 6 times 7."))
        follow = bot.slack.message_event("C1", "what did I ask?", thread_ts=event["ts"])
        await bot.slack.post_event(bot.events_url, follow)
        await bot.finished(follow)
    assert "x is 42." in shown and streamed  # the answer streamed into Slack
    assert "SECRET-THOUGHT" not in shown and "gAAAA" not in shown
    assert_reasoning_went_back(bot.llm)
    # The next turn replays the stored thread: its tool calls and results, none of the reasoning.
    replayed = json.dumps(bot.llm.requests[-1]["input"])
    assert "x = 6 * 7" in replayed and "SECRET-THOUGHT" not in replayed and "gAAAA" not in replayed


async def test_a_responses_only_server_answers_through_the_console(tmp_path: Path) -> None:
    async with ScriptedOpenAI(apis=("responses",)) as llm:
        llm.script(*two_steps())
        config = write_config(tmp_path, llm.base_url)
        code, out, err = await run_cli(
            "console",
            "--config",
            str(config),
            "--out",
            str(tmp_path / "out"),
            stdin="what is 6 times 7?\n",
            cwd=tmp_path,
        )
    assert code == 0, err
    assert "x is 42." in out
    assert "SECRET-THOUGHT" not in out + err and "gAAAA" not in out + err
    assert_reasoning_went_back(llm)
