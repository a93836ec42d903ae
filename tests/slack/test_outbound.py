"""What the bot posts to Slack notifies no one and links only where it says (issue 31), end to end
(real bolt + slack_sdk, Core, kernels; fake Slack and model). Every text that reached the fake
Slack is checked: message texts and edits, section blocks, streamed ``markdown_text`` pieces,
shared-file comments and titles, the status line and thread titles."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bot.events import ThreadKey
from bot.schedules.runner import Scheduler
from tests.fakes.openai_server import answer, tool_call
from tests.fakes.slack_server import Call, FakeSlack
from tests.slack.conftest import Bot, running_bot

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: What the attack run made the model (or a user, a file name, a display name) write.
HOSTILE = (
    "Results: [see the chart](!channel), [thanks](!here), [team](!subteam^S0TEAM|analysts), "
    "[you](@U0BOSS), [room](#C0ROOM), [all](!everyone), raw <!channel> <@U0BOSS> <#C0ROOM> "
    "<!subteam^S0TEAM> and @here, [https://intranet.example.com/q3](https://evil.example.net/login), "
    "[intranet.example.com](https://evil.example.net/x), [script](javascript:alert(1)), "
    "[the docs](https://docs.example.org/guide)."
)
#: Slack's special tokens: a mention, a channel, a group, a broadcast.
_SPECIAL = re.compile(r"<\s*[!@#]")
#: Slack's ``<target|label>`` links and Markdown's ``[label](target)`` links.
_MRKDWN_LINK = re.compile(r"<([^<>|\s]+)\|([^<>]*)>")
_MARKDOWN_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*)\)")
_BROADCAST_WORD = re.compile(r"(?<![\w@])@(here|channel|everyone)\b")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bot]:
    async with running_bot(tmp_path_factory.mktemp("slack-outbound"), socket_mode=False, streaming=True) as running:
        yield running


def shown_texts(calls: list[Call]) -> Iterator[tuple[str, str]]:
    """(where, text) for every text these Web API calls carried to Slack."""
    for call in calls:
        for name in ("text", "markdown_text", "initial_comment", "status", "title"):
            value = call.args.get(name)
            if isinstance(value, str) and value:
                yield f"{call.method}.{name}", value
        for chunk in call.args.get("chunks") or []:  # a stream's answer text and task cards
            for name in ("text", "title", "details", "output"):
                value = chunk.get(name) if isinstance(chunk, dict) else None
                if isinstance(value, str) and value:
                    kind = "markdown_text" if chunk.get("type") == "markdown_text" else name
                    yield f"{call.method}.chunks.{kind}", value
        for block in call.args.get("blocks") or []:
            text = (block.get("text") or {}).get("text") if isinstance(block, dict) else None
            if isinstance(text, str):
                yield f"{call.method}.blocks", text
        for file in call.args.get("files") or []:
            if isinstance(file, dict) and isinstance(file.get("title"), str):
                yield f"{call.method}.files.title", file["title"]


def offences(slack: FakeSlack, since: int = 0) -> list[tuple[str, str]]:
    """Texts that would notify someone, link off http(s)/mailto, or show one address and open another."""
    bad: list[tuple[str, str]] = []
    for where, text in shown_texts(slack.calls[since:]):
        if _SPECIAL.search(text) or _BROADCAST_WORD.search(text):
            bad.append((where, text))
        links = [(t, label) for t, label in _MRKDWN_LINK.findall(text)]
        if where.endswith("markdown_text"):  # Markdown links are links only there; titles are plain text
            links += [(t, label) for label, t in _MARKDOWN_LINK.findall(text)]
        for target, label in links:
            if not re.match(r"(https?://|mailto:)", target) or ("example" in label and label not in target):
                bad.append((where, text))
    return bad


async def ask(bot: Bot, channel: str, text: str, **event: Any) -> dict[str, Any]:
    message = bot.slack.mention(channel, text, **event)
    await bot.slack.post_event(bot.events_url, message)
    await bot.finished(message)
    return message


async def test_a_hostile_answer_posted_whole_pings_no_one_and_shows_real_targets(bot: Bot) -> None:
    since = len(bot.slack.calls)
    bot.llm.script(answer(HOSTILE))
    event = await ask(bot, "C_WHOLE", "summarise the upload")
    [shown] = bot.answers(event)
    assert offences(bot.slack, since) == []
    assert "see the chart" in shown and "<https://docs.example.org/guide|the docs>" in shown
    assert "<https://evil.example.net/login>" in shown and "intranet.example.com/q3" not in shown
    assert "&lt;!channel&gt;" in shown  # the raw token is shown as text, not sent as a token
    assert "@\u2060here" in shown


async def test_a_hostile_answer_streamed_pings_no_one_in_any_piece(bot: Bot) -> None:
    since = len(bot.slack.calls)
    bot.llm.script(answer(HOSTILE * 3, pace_s=0.04))  # long enough to stream in several pieces
    event = await ask(bot, "C_STREAMED", "summarise the upload")
    streams = [c for c in bot.slack.calls[since:] if c.method in ("chat.startStream", "chat.appendStream")]
    assert len(streams) >= 2  # it did stream
    assert offences(bot.slack, since) == []
    [message] = [m for m in bot.slack.bot_messages("C_STREAMED", event["ts"]) if m.stream_state is not None]
    whole = "".join(message.pieces) + "".join(message.updates)
    assert "see the chart" in whole and "evil.example.net/login" in whole
    assert "](https://evil" not in whole and "!channel)" not in whole


@pytest.mark.parametrize("native", [True, False])
async def test_a_streamed_link_split_between_pieces_never_forms_a_mention(bot: Bot, native: bool) -> None:
    """The stream's pieces, put together by Slack, are one rendered text: ``<!chan`` + ``nel>``
    or ``[x](!chan`` + ``nel)`` arriving in two pieces cannot make a token."""
    bot.slack.refuse_streaming = None if native else "not_allowed"
    try:
        since = len(bot.slack.calls)
        text = (
            "Look "
            + "at this " * 40
            + "<!channel> and [the chart](!channel) and <https://evil.example.net|intranet.example.com>"
        )
        bot.llm.script(answer(text, pace_s=0.03))
        await ask(bot, f"C_SPLIT_{native}", "go")
        assert offences(bot.slack, since) == []
    finally:
        bot.slack.refuse_streaming = None


async def test_echoes_of_a_question_in_schedules_and_runs_ping_no_one(bot: Bot) -> None:
    since = len(bot.slack.calls)
    question = "schedule daily 9:00 [heads up](!channel) <!here> @channel revenue by region"
    event = await ask(bot, "C_ECHO", question, user_profile={"display_name": "[boss](!everyone) <!here>"})
    [confirmed] = bot.answers(event)
    assert confirmed.startswith("⏰ Scheduled #1") and "heads up" in confirmed
    listed = await ask(bot, "C_ECHO", "schedules", thread_ts=event["ts"])
    assert "#1" in bot.answers(listed)[-1] and "boss" in bot.answers(listed)[-1]  # the display name, harmless
    refused = await ask(bot, "C_ECHO", "unschedule 1", thread_ts=event["ts"], user="U2")
    assert "boss" in bot.answers(refused)[-1]
    bot.llm.script(answer("North leads."))
    [schedule] = await bot.core.store.schedules.of_thread(ThreadKey("slack", "T1", "C_ECHO", event["ts"]))
    assert schedule.next_run_at is not None
    scheduler = Scheduler(
        book=bot.core.store.schedules,
        handle=bot.core.dispatcher.handle,
        reaches=[bot.adapter],
        clock=lambda: schedule.next_run_at + 1,  # type: ignore[operator]
    )
    await asyncio.gather(*await scheduler.tick())
    assert any(t.startswith("⏰ Scheduled run #1") and "heads up" in t for t in bot.answers(event))
    assert offences(bot.slack, since) == []


async def test_a_file_the_kernel_named_to_ping_pings_no_one_in_files_uploads_or_titles(bot: Bot) -> None:
    since = len(bot.slack.calls)
    name = "q3` [see](!channel) <!here> `.csv"
    bot.llm.script(tool_call(f"open({name!r}, 'w').write('a,b\\n1,2\\n')"), answer("Saved it."))
    event = await ask(bot, "C_FILES", "save the table")
    assert [u.filename for u in bot.slack.uploads if u.thread_ts == event["ts"]] == [name]
    listed = await ask(bot, "C_FILES", "files", thread_ts=event["ts"])
    assert "q3" in bot.answers(listed)[-1]
    assert offences(bot.slack, since) == []


async def test_the_status_line_and_title_of_an_assistant_thread_ping_no_one(bot: Bot) -> None:
    since = len(bot.slack.calls)
    thread = bot.slack.assistant_thread_started("D_ASSIST", user="U1")
    await bot.slack.post_event(bot.events_url, thread)
    thread_ts = thread["assistant_thread"]["thread_ts"]
    await bot.slack.wait_for(lambda: bot.slack.bot_messages("D_ASSIST", thread_ts))
    bot.llm.script(answer("Done, <!channel>."))
    message = bot.slack.message_event(
        "D_ASSIST", "<!here> [x](!channel) what grew?", thread_ts=thread_ts, channel_type="im"
    )
    await bot.slack.post_event(bot.events_url, message)
    await bot.finished(message)
    assert offences(bot.slack, since) == []


@pytest.mark.parametrize("pace_s", [0.0, 0.02])
async def test_host_paths_in_an_answer_are_not_posted(bot: Bot, pace_s: float) -> None:
    """A traceback the model quotes (whole, or streamed) names no folder of the server."""
    kernels = bot.core.settings.kernels
    venv = os.path.dirname(os.path.dirname(os.path.abspath(kernels.python)))
    root = os.path.abspath(kernels.workspace_root)
    repo = str(Path(__file__).resolve().parents[2])
    since = len(bot.slack.calls)
    bot.llm.script(
        tool_call("import pandas as pd\npd.read_csv('missing.csv')"),
        lambda request: answer(
            f"It failed:\n```\n{request['messages'][-1]['content']}\n```\nSee {root}/abc123/missing.csv.", pace_s=pace_s
        ),
    )
    event = await ask(bot, f"C_PATHS_{int(pace_s * 100)}", "read missing.csv")
    texts = [text for _, text in shown_texts(bot.slack.calls[since:])]
    quoted = [t for t in texts if "FileNotFoundError" in t]
    assert quoted and any("site-packages/pandas" in t for t in quoted), texts  # the traceback is shown…
    assert any("/workspace/missing.csv" in t for t in quoted)
    assert [t for t in texts if venv in t or root in t or repo in t] == []  # …without the server's folders
    assert bot.answers(event)
