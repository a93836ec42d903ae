"""Each code step as a task card in the streamed answer (Slack's chat streaming chunks), end to
end: real bolt + slack_sdk, Core, kernels; fake Slack (which checks every chunk against Slack's
schema) and scripted model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.fakes.openai_server import answer, tool_call
from tests.fakes.slack_server import Message
from tests.slack.conftest import Bot, running_bot

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: Two steps: the first prints for a while (its card shows its latest lines), the second is quick.
FIRST = "# Count the rows\nimport time\nfor i in range(5):\n    print(f'row {i}', flush=True)\n    time.sleep(0.5)"
SECOND = "# Sum them\nprint(sum(range(5)))"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bot]:
    async with running_bot(tmp_path_factory.mktemp("slack-cards"), socket_mode=False, streaming=True) as running:
        yield running


def streamed(bot: Bot, event: dict[str, Any]) -> Message:
    [message] = [m for m in bot.slack.bot_messages(event["channel"], event["ts"]) if m.stream_state is not None]
    return message


def status_messages(bot: Bot, event: dict[str, Any]) -> list[Message]:
    """The turn's status message (the one with the Stop button; deleted at the end)."""
    return [
        m
        for m in bot.slack.messages
        if m.channel == event["channel"] and m.thread_ts == event["ts"] and "threadbook_stop" in str(m.blocks)
    ]


def cards(message: Message) -> dict[str, list[dict[str, Any]]]:
    """Each card's updates, by id, in order."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    for chunk in message.chunks:
        if chunk["type"] == "task_update":
            by_id.setdefault(chunk["id"], []).append(chunk)
    return by_id


async def test_two_steps_are_two_cards_that_complete_and_the_answer_follows(bot: Bot) -> None:
    bot.llm.script(tool_call(FIRST), tool_call(SECOND), answer("There are 5 rows; they sum to 10."))
    event = bot.slack.mention("C_CARDS", "count and sum the rows")
    await bot.slack.post_event(bot.events_url, event)
    assert await bot.finished(event) == {"white_check_mark"}

    message = streamed(bot, event)
    assert message.stream_state == "stopped"
    assert message.chunks[0] == {"type": "plan_update", "title": "count and sum the rows"}
    steps = cards(message)
    assert list(steps) == ["step-1", "step-2"]
    assert steps["step-1"][0]["title"] == "Count the rows" and steps["step-2"][-1]["title"] == "Sum them"
    assert steps["step-1"][0]["status"] == "in_progress"  # shown while it ran
    assert all(updates[-1]["status"] == "complete" for updates in steps.values())  # a quick step: its end alone
    # While it ran, the first card showed the latest lines it printed.
    assert any("row " in c.get("output", "") for c in steps["step-1"][:-1])
    # The answer streams after the cards, in the same message, with its feedback buttons.
    last_card = max(i for i, c in enumerate(message.chunks) if c["type"] == "task_update")
    texts = [i for i, c in enumerate(message.chunks) if c["type"] == "markdown_text"]
    assert texts and min(texts) > last_card
    assert message.text.strip() == "There are 5 rows; they sum to 10."
    assert any(b.get("type") == "context_actions" for b in message.blocks or [])
    # The status message (with its Stop button) showed the steps' one-line headlines, not their output block.
    [status] = status_messages(bot, event)
    assert any(u.startswith("Running step 1") for u in status.updates)
    assert not any("```" in u for u in status.updates)


async def test_a_failing_step_ends_in_error_and_its_output_is_rewritten(bot: Bot) -> None:
    root = str(bot.core.settings.kernels.workspace_root.resolve())
    failing = f"print('<!channel> see {root}/other/secret.csv', flush=True)\nimport time\ntime.sleep(1.5)\n1 / 0"
    bot.llm.script(tool_call(failing), answer("Dividing by zero failed."))
    event = bot.slack.mention("C_CARDS2", "divide by zero")
    await bot.slack.post_event(bot.events_url, event)
    assert await bot.finished(event) == {"white_check_mark"}

    steps = cards(streamed(bot, event))
    assert steps["step-1"][-1]["status"] == "error"
    outputs = [c["output"] for c in steps["step-1"] if "output" in c]
    assert outputs and all(root not in o for o in outputs)  # host paths rewritten
    assert all("<!channel>" not in o for o in outputs)  # no ping


async def test_where_slack_will_not_stream_the_status_message_shows_the_steps(bot: Bot) -> None:
    bot.slack.refuse_streaming = "feature_not_enabled"
    try:
        bot.llm.script(tool_call(FIRST), answer("Counted."))
        event = bot.slack.mention("C_CARDS3", "count the rows")
        await bot.slack.post_event(bot.events_url, event)
        assert await bot.finished(event) == {"white_check_mark"}
        assert not any(m.chunks for m in bot.slack.bot_messages("C_CARDS3", event["ts"]))
        [status] = status_messages(bot, event)
        assert any("row " in u for u in status.updates)  # the lines in the status message, as before
    finally:
        bot.slack.refuse_streaming = None


async def test_a_refused_table_at_the_end_still_stops_the_steps_message_with_its_cards_done(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    async with running_bot(tmp_path_factory.mktemp("cards-refused"), socket_mode=False, streaming=True) as refusing:
        refusing.slack.refuse_blocks = {"table", "data_table"}
        table = "Totals:\n\n| Step | Rows |\n|---|--:|\n| sum | 10 |\n\nDone."
        refusing.llm.script(tool_call(SECOND), answer(table))
        event = refusing.slack.mention("C_CARDS_REFUSED", "sum the rows")
        await refusing.slack.post_event(refusing.events_url, event)
        assert await refusing.finished(event) == {"white_check_mark"}
        message = streamed(refusing, event)
        assert message.stream_state == "stopped"  # not left streaming because its last call was refused
        assert cards(message)["step-1"][-1]["status"] == "complete"
        posted = "\n".join(m.text for m in refusing.slack.bot_messages(event["channel"], event["ts"]))
        assert "Totals:" in posted and "Done." in posted and "sum  |   10" in posted
