"""Live work on Slack, end to end (real bolt + slack_sdk, Core, kernels; fake Slack and model):
a running cell's status shows its time and latest lines, throttled; each thread is an agent
session whose own Stop interrupts the cell; an app that is no agent keeps its own status."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.fakes.openai_server import answer, tool_call
from tests.fakes.slack_server import Message
from tests.slack.conftest import Bot, running_bot

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: The issue's case: a 7-second cell printing a line every half second, with a redrawn bar on stderr.
SEVEN_SECONDS = """# Count to fourteen slowly
import sys, time
for i in range(14):
    print(f"line {i}", flush=True)
    sys.stderr.write(f"\\rbar {i + 1}/14")
    sys.stderr.flush()
    time.sleep(0.5)
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bot]:
    async with running_bot(tmp_path_factory.mktemp("slack-live"), socket_mode=False) as running:
        yield running


def status_message(bot: Bot, channel: str, thread_ts: str) -> Message:
    """The status message of the thread's turn (the one with the Stop button)."""
    [status] = [
        m
        for m in bot.slack.messages
        if m.channel == channel and m.thread_ts == thread_ts and "threadbook_stop" in str(m.blocks)
    ]
    return status


async def test_a_running_cell_shows_its_time_and_latest_lines_about_once_a_second(bot: Bot) -> None:
    slack = bot.slack
    bot.llm.script(tool_call(SEVEN_SECONDS), answer("Counted."))
    event = slack.mention("C_LIVE", "count to fourteen, slowly")
    await slack.post_event(bot.events_url, event)
    assert await bot.finished(event) == {"white_check_mark"}

    status = status_message(bot, "C_LIVE", event["ts"])
    running = [text for text in status.updates if text.startswith("Running step 1")]
    # The step is labelled with the model's own words (its first-line comment), not the import.
    assert running and all(
        text.startswith("Running step 1 (") and "Count to fourteen slowly" in text for text in running
    )
    # Several of the printed lines showed up before the cell ended, and the elapsed time moved on.
    seen = {int(n) for text in running for n in re.findall(r"line (\d+)", text)}
    assert len(seen) >= 4 and min(seen) < 7
    assert len({re.search(r"\((\d+) s\)", text).group(1) for text in running if re.search(r"\((\d+) s\)", text)}) >= 3  # type: ignore[union-attr]
    # stderr shows too, and a bar redrawn with \r is one line in its latest state, never a pile of states.
    bars = [re.findall(r"bar \d+/14", text) for text in running]
    assert any(bars) and all(len(found) <= 1 for found in bars)
    # Within Slack's rate: an edit a second at most, the newest state only (no backlog after the end).
    edits = [c.at for c in slack.calls_to("chat.update") if c.args.get("ts") == status.ts]
    assert all(later - earlier >= 0.9 for earlier, later in zip(edits, edits[1:]))
    assert len(edits) <= 7 + 3
    deleted_at = next(c.at for c in slack.calls_to("chat.delete") if c.args.get("ts") == status.ts)
    assert all(at <= deleted_at for at in edits)
    # The thread was an agent session: processing (titled with the question) while working, then active.
    assert slack.sessions[("C_LIVE", event["ts"])] == ["processing", "active"]
    assert slack.session_titles[("C_LIVE", event["ts"])] == "count to fourteen, slowly"


async def test_slacks_own_stop_interrupts_the_cell_and_the_thread_goes_on(bot: Bot, tmp_path: Path) -> None:
    slack = bot.slack
    started = tmp_path / "cell-started"
    code = f"import pathlib, time\nkept = 41\npathlib.Path({str(started)!r}).touch()\ntime.sleep(60)\nprint('finished')"
    bot.llm.script(tool_call(code))
    requests_before = len(bot.llm.requests)
    event = slack.mention("C_STOP", "wait a minute")
    await slack.post_event(bot.events_url, event)
    where = ("C_STOP", event["ts"])
    await slack.wait_for(lambda: started.exists() and slack.sessions.get(where) == ["processing"], 30)
    await slack.post_event(bot.events_url, slack.agent_session_stopped("C_STOP", event["ts"]))
    assert await bot.finished(event, timeout=20) == {"x"}  # as after our own Stop button
    assert "stop" in bot.answers(event)[-1].lower()
    assert slack.sessions[where][-1] == "active"
    assert len(bot.llm.requests) == requests_before + 1  # no further model call after Stop
    assert not any("finished" in text for text in bot.answers(event))

    # Variables kept, thread usable: the next question in the thread sees them.
    bot.llm.script(
        tool_call("print(kept + 1)"), lambda request: answer("It is " + request["messages"][-1]["content"].strip())
    )
    again = slack.message_event("C_STOP", f"<@{slack.bot_user_id}> and now?", thread_ts=event["ts"])
    await slack.post_event(bot.events_url, again)
    assert await bot.finished(again) == {"white_check_mark"}
    assert any("42" in text for text in bot.answers(again))
    stopped_cell = [m for m in bot.llm.requests[-2]["messages"] if m["role"] == "tool"][0]
    assert "stopped on request" in str(stopped_cell["content"]).lower()  # interrupted, not timed out or killed
    assert slack.sessions[where][-2:] == ["processing", "active"]


async def test_an_app_slack_does_not_know_as_an_agent_keeps_its_own_stop_and_says_so_once(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    slack = bot.slack
    slack.refuse_sessions = "not_allowed_token_type"
    tried_before = len(slack.calls_to("agents.sessions.setStatus"))
    caplog.set_level(logging.INFO, logger="threadbook.slack")
    events = []
    for channel in ("C_PLAIN1", "C_PLAIN2"):
        bot.llm.script(tool_call("import time\ntime.sleep(1.2)\nprint('one')"), answer("Printed one."))
        event = slack.mention(channel, "print one")
        await slack.post_event(bot.events_url, event)
        assert await bot.finished(event) == {"white_check_mark"}
        events.append(event)
    # Asked once, refused, never asked again; no turn failed, and each kept its Stop button and status.
    assert len(slack.calls_to("agents.sessions.setStatus")) == tried_before + 1
    for event in events:
        status = status_message(bot, event["channel"], event["ts"])
        assert status.deleted and status.blocks[1]["elements"][0]["action_id"] == "threadbook_stop"  # type: ignore[index]
        assert any(text.startswith("Running step 1") for text in status.updates)
        assert bot.answers(event) == ["Printed one."]
    assert len([r for r in caplog.records if "refused agent sessions" in r.getMessage()]) == 1
    await asyncio.sleep(0)


async def test_a_host_path_printed_across_the_line_limit_never_shows_its_head(bot: Bot) -> None:
    """The status rewrites host paths before it cuts a line to its length: a workspace path
    printed so that the 160-character cut falls inside it shows neither it nor its head."""
    root = str(bot.core.settings.kernels.workspace_root.resolve())
    printed = "x" * 150 + " " + root + "/some-thread/secret.csv"
    code = f"import time\nfor _ in range(6):\n    print({printed!r}, flush=True)\n    time.sleep(0.5)"
    bot.llm.script(tool_call(code), answer("Printed."))
    event = bot.slack.mention("C_PATH", "print a long line")
    await bot.slack.post_event(bot.events_url, event)
    assert await bot.finished(event) == {"white_check_mark"}

    running = [text for text in status_message(bot, "C_PATH", event["ts"]).updates if "\nxxxxx" in text]
    assert running, "the printed line was never shown"
    head = root[: root.index("/", 1) + 2]  # the first folder's name and one more character: "/tmp/p"
    assert all(head not in text for text in running), running
    assert all("x" * 150 in text for text in running), running  # the line itself is still shown, cut


async def test_a_stop_from_someone_access_keeps_out_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``access.allow_users: [alice]``, bob's Stop (Slack's own, and our button) neither
    interrupts alice's cell nor changes her status; the refusal is logged."""
    caplog.set_level(logging.WARNING, logger="bot.dispatcher")
    async with running_bot(tmp_path, socket_mode=False, access={"allow_users": ["U_ALICE"]}) as alice_bot:
        slack = alice_bot.slack
        started = tmp_path / "cell-started"
        code = f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(3)\nprint('finished')"
        alice_bot.llm.script(tool_call(code), answer("Slept."))
        event = slack.mention("C_ACL", "sleep a little", user="U_ALICE")
        await slack.post_event(alice_bot.events_url, event)
        await slack.wait_for(lambda: started.exists(), 30)
        await slack.post_event(alice_bot.events_url, slack.agent_session_stopped("C_ACL", event["ts"], user="U_BOB"))
        status = status_message(alice_bot, "C_ACL", event["ts"])
        key = f"slack:{slack.team_id}:C_ACL:{event['ts']}"
        await slack.post_interactive(
            alice_bot.events_url, slack.block_action(status, "threadbook_stop", key, user="U_BOB")
        )

        assert await alice_bot.finished(event) == {"white_check_mark"}
        assert alice_bot.answers(event)[-1] == "Slept."
        tool_result = [m for m in alice_bot.llm.requests[-1]["messages"] if m["role"] == "tool"][0]
        assert "finished" in str(tool_result["content"])  # the cell ran to its end
        assert not any("stop" in text.lower() for text in status.updates)
        assert len([r for r in caplog.records if "ignored Stop from U_BOB" in r.getMessage()]) == 2
        # Slack showed alice's session stopped when bob clicked; it was set processing again, then active.
        assert slack.sessions[("C_ACL", event["ts"])] == ["processing", "processing", "active"]
