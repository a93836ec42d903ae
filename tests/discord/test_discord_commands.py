"""Slash commands, forum posts, feedback buttons, tables and charts on Discord: real discord.py
against the fake Discord, the real Core, real kernels, scripted LLM.

One fake, one Core and one connected client (slash commands registered for ``GUILD_ID``, one
forum listed in ``discord.forum_channels``, one not) serve the whole module.
"""

from __future__ import annotations

import io
import json
import re
import sqlite3
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from PIL import Image

from adapters.discord import DiscordAdapter
from adapters.discord.adapter import HELP_OUTSIDE_SESSION
from adapters.discord.feedback import THANKS
from bot.app import Core
from tests.conftest import make_settings
from tests.discord.conftest import running_adapter
from tests.fakes.bot_process import eventually
from tests.fakes.discord_server import BOT_ID, CHANNEL_ID, GUILD_ID, USER, USER_ID, FakeDiscord, Sent
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

pytestmark = pytest.mark.asyncio(loop_scope="module")

SALES_CSV = b"month,amount\nJan,100\nFeb,200\nMar,300\n"
#: Discord's limit: an interaction must be answered (here: deferred) within 3 seconds.
ANSWER_WINDOW_S = 3.0


@dataclass
class World:
    discord: FakeDiscord
    llm: ScriptedOpenAI
    core: Core
    adapter: DiscordAdapter
    db: Path
    forum: int  # listed in discord.forum_channels
    other_forum: int  # not listed: a post must mention the bot

    async def turn_done(self, message_id: int | str, timeout: float = 30.0) -> str:
        """Wait for the ✅/❌/⏹️ reaction on the question ``message_id``; returns the emoji."""
        mid = int(message_id)
        return await self.discord.wait_until(
            lambda: next((e for (_, m, e) in self.discord.reactions if m == mid and e in "✅❌⏹️"), None), timeout
        )

    async def thread_with_session(self, text: str = "say hi") -> int:
        """A thread opened by a mention, whose first turn is done."""
        self.llm.script(answer("Hi."))
        message = await self.discord.user_message(text, mention_bot=True)
        thread_id = int((await self.discord.wait_for_thread(message["id"]))["id"])
        await self.turn_done(message["id"])
        return thread_id

    async def followups(self, interaction: dict[str, Any], count: int = 1) -> list[Sent]:
        """The first ``count`` followups of ``interaction`` (its answers after the deferral)."""

        def ready() -> list[Sent] | None:
            found = [s for s in self.discord.interaction_messages(interaction["id"]) if not s.original]
            return found[:count] if len(found) >= count else None

        return await self.discord.wait_until(ready, 30)

    def feedback_rows(self) -> list[tuple[str, str, str, int]]:
        """(thread, turn id, user, good) of every vote, read beside the bot."""
        with sqlite3.connect(self.db) as raw:
            rows = raw.execute("SELECT thread, turn_id, user_id, good FROM feedback").fetchall()
        raw.close()
        return [(str(t), str(m), str(u), int(g)) for t, m, u, g in rows]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    tmp_path = tmp_path_factory.mktemp("discord-commands")
    async with FakeDiscord() as fake, ScriptedOpenAI() as llm:
        forum, other_forum = fake.forum_channel("questions"), fake.forum_channel("chat")
        settings = make_settings(
            tmp_path,
            llm_url=llm.base_url,
            discord={
                "token": fake.token,
                "api_url": fake.api_url,
                "gateway_url": fake.gateway_url,
                "guild_ids": [GUILD_ID],
                "forum_channels": [forum],
            },
            access={"allow_users": [str(USER_ID)]},
        )
        async with running_adapter(settings) as (core, adapter):
            yield World(fake, llm, core, adapter, tmp_path / "data" / "threadbook.db", forum, other_forum)
        assert fake.unknown_routes == []
        # Slash-command replies, followups and button updates ping no one either (issue 31).
        assert fake.message_requests
        assert [line for line, body in fake.message_requests if body.get("allowed_mentions") != {"parse": []}] == []


@pytest.fixture(autouse=True)
def clean_script(world: World) -> Iterator[None]:
    """No test may leave unused model steps behind for the next one."""
    yield
    assert world.llm.remaining == 0, "a scripted LLM step was not used"


def deferred_in_time(fake: FakeDiscord, interaction: dict[str, Any]) -> bool:
    """The interaction's first (only) callback is a deferral that came within Discord's window."""
    [callback] = [c for c in fake.callbacks if c.interaction_id == int(interaction["id"])]
    return callback.type == 5 and callback.after_s < ANSWER_WINDOW_S


async def test_commands_are_registered_for_the_configured_guild_only(world: World) -> None:
    registered = world.discord.registered_commands
    assert list(registered) == [GUILD_ID]  # guild-scoped (instant), nothing global
    commands = {c["name"]: c for c in registered[GUILD_ID]}
    assert set(commands) == {"help", "reset", "files", "export", "status", "usage", "schedule", "ask"}
    [everyone] = commands["usage"]["options"]
    assert (everyone["name"], everyone["type"], everyone.get("required", False)) == ("everyone", 5, False)
    request, remove = commands["schedule"]["options"]
    assert (request["name"], request["type"], request.get("required", False)) == ("request", 3, False)
    assert (remove["name"], remove["type"], remove.get("required", False)) == ("remove", 4, False)
    [fmt] = commands["export"]["options"]
    assert fmt["name"] == "format" and not fmt.get("required")
    assert [c["value"] for c in fmt["choices"]] == ["ipynb", "html"]
    question, attachment = commands["ask"]["options"]
    assert (question["name"], question["type"], question["required"]) == ("question", 3, True)
    assert (attachment["name"], attachment["type"], attachment.get("required", False)) == ("attachment", 11, False)


async def test_in_thread_commands_are_deferred_at_once_and_answered(world: World) -> None:
    fake = world.discord
    thread_id = await world.thread_with_session("keep a number for me")
    requests_before = len(world.llm.requests)

    help_used = await fake.slash_command("help", channel_id=thread_id)
    [help_text] = await world.followups(help_used)
    assert "Threadbook" in help_text.content and "`reset`" in help_text.content
    assert deferred_in_time(fake, help_used)

    status = await fake.slash_command("status", channel_id=thread_id)
    [status_text] = await world.followups(status)
    assert status_text.content and deferred_in_time(fake, status)

    export = await fake.slash_command("export", channel_id=thread_id)
    [notebook] = await world.followups(export)
    assert deferred_in_time(fake, export)
    [file] = notebook.files
    assert file.name.endswith(".ipynb") and json.loads(file.data)["nbformat"] == 4

    page = await fake.slash_command("export", {"format": "html"}, channel_id=thread_id)
    [html] = await world.followups(page)
    assert deferred_in_time(fake, page)
    [file] = html.files
    assert file.name.endswith(".html") and b"<html" in file.data[:2000].lower()

    files = await fake.slash_command("files", channel_id=thread_id)
    await world.followups(files)
    reset = await fake.slash_command("reset", channel_id=thread_id)
    [reset_text] = await world.followups(reset)
    assert reset_text.content and deferred_in_time(fake, files) and deferred_in_time(fake, reset)
    # The commands went to the commands, not to the model; and all answers are in the thread.
    assert len(world.llm.requests) == requests_before
    assert all(
        s.channel_id == thread_id
        for i in (help_used, status, export, page, files, reset)
        for s in fake.interaction_messages(i["id"])
    )


async def test_usage_and_schedule_commands_answer_like_the_in_thread_words(world: World) -> None:
    fake = world.discord
    thread_id = await world.thread_with_session("count for me")
    requests_before = len(world.llm.requests)

    async def answered(options: tuple[str, dict[str, Any] | None], words: str) -> str:
        """Use the command; the text of its followup that holds ``words`` (a queue notice may come first)."""
        used = await fake.slash_command(options[0], options[1], channel_id=thread_id)
        found = await fake.wait_until(
            lambda: next(
                (s for s in fake.interaction_messages(used["id"]) if not s.original and words in s.content), None
            ),
            30,
        )
        assert deferred_in_time(fake, used)
        return str(found.content)

    usage = await answered(("usage", None), "This thread")
    assert "token" in usage.lower()
    assert "admins" in await answered(("usage", {"everyone": True}), "admins")  # `usage all`, refused to a non-admin
    added = await answered(("schedule", {"request": "every monday 9:00 revenue by region"}), "revenue by region")
    assert "monday" in added.lower()
    listing = await answered(("schedule", None), "revenue by region")  # `schedules`
    number = int(re.findall(r"#(\d+)", listing)[0])
    assert f"Schedule #{number} removed" in await answered(
        ("schedule", {"remove": number}), "removed"
    )  # `unschedule N`
    after = await answered(("schedule", None), "no schedules")
    assert after.startswith("This thread has no schedules.")
    assert len(world.llm.requests) == requests_before  # commands, not questions for the model


async def test_a_command_outside_a_thread_gets_one_sentence(world: World) -> None:
    fake = world.discord
    used = await fake.slash_command("help")  # in #general
    [told] = await world.followups(used)
    assert told.content == HELP_OUTSIDE_SESSION and deferred_in_time(fake, used)
    status = await fake.slash_command("status")
    [told] = await world.followups(status)
    assert "inside a Threadbook thread" in told.content
    assert not any(int(i) in fake.threads for i in (used["id"], status["id"]))


async def test_a_command_from_someone_outside_the_allow_list_is_refused_in_one_sentence(world: World) -> None:
    fake = world.discord
    thread_id = await world.thread_with_session()
    stranger = {**USER, "id": "1100000000000000099", "username": "mallory", "global_name": "Mallory"}
    used = await fake.slash_command("reset", channel_id=thread_id, user=stranger)
    [told] = await world.followups(used)
    assert "not enabled for you" in told.content and deferred_in_time(fake, used)


async def test_ask_opens_a_thread_and_answers_there_with_the_attachment(world: World) -> None:
    fake = world.discord
    world.llm.script(
        tool_call("import pandas as pd\nprint(pd.read_csv('sales.csv')['amount'].sum())"),
        lambda request: answer("The total is " + request["messages"][-1]["content"].strip()),
    )
    asked = await fake.slash_command(
        "ask", {"question": "What is the total amount?"}, files={"attachment": ("sales.csv", SALES_CSV)}
    )
    original = await fake.wait_until(
        lambda: next((s for s in fake.interaction_messages(asked["id"]) if s.original and "🧵" in s.content), None)
    )
    assert deferred_in_time(fake, asked)
    thread = fake.threads[original.id]  # opened from the command's answer, like from a mention
    assert thread["name"] == "What is the total amount?" and int(thread["parent_id"]) == CHANNEL_ID
    assert f"<#{thread['id']}>" in original.content and "What is the total amount?" in original.content
    assert await world.turn_done(original.id) == "✅"  # 👀 then ✅ on the question, as for a mention
    reply = await fake.wait_for_sent(thread["id"], lambda s: s.content.startswith("The total is"))
    assert "600" in reply.content
    assert "sales.csv" in fake.cdn_downloads
    asked_model = world.llm.requests[-2]["messages"]
    assert any("What is the total amount?" in str(m.get("content")) for m in asked_model if m["role"] == "user")


async def test_forum_posts_are_sessions_of_their_own(world: World) -> None:
    fake = world.discord

    def where_am_i() -> list[Any]:
        # The workspace's own folder name (the full path is a host path, which no post shows).
        return [
            tool_call("import os\nprint(os.path.basename(os.getcwd()))"),
            lambda request: answer("cwd: " + request["messages"][-1]["content"].strip()),
        ]

    # One post at a time: the scripted model answers requests in the order they come.
    posts, answers = [], []
    for title, text in (("Where do I run?", "tell me your folder"), ("Another question", "and yours?")):
        world.llm.script(*where_am_i())
        post, _ = await fake.forum_post(world.forum, title, text)  # no mention needed
        posts.append(post)
        answers.append(await fake.wait_for_sent(post, lambda s: s.content.startswith("cwd:"), 30))
    first = posts[0]
    folders = [a.content for a in answers]
    assert folders[0] != folders[1]  # two posts, two workspaces (two kernels)
    asked = [m["content"] for r in world.llm.requests[-4:] for m in r["messages"] if m["role"] == "user"]
    assert any("Where do I run?" in str(c) and "tell me your folder" in str(c) for c in asked)  # the title counts

    # A later message in the post continues its session without a mention.
    world.llm.script(*where_am_i())
    follow_up = await fake.user_message("again?", channel_id=first)
    assert await world.turn_done(follow_up["id"]) == "✅"
    again = [s.content for s in fake.sent[first] if s.content.startswith("cwd:")]
    assert again == [folders[0], folders[0]]


async def test_a_post_in_an_unlisted_forum_needs_a_mention(world: World) -> None:
    fake = world.discord
    requests_before = len(world.llm.requests)
    ignored, _ = await fake.forum_post(world.other_forum, "Just chatting", "nothing for the bot")
    world.llm.script(answer("Here to help."))
    mentioned, starter = await fake.forum_post(world.other_forum, "Need help", "please look", mention_bot=True)
    assert await world.turn_done(starter["id"]) == "✅"
    await fake.wait_for_sent(mentioned, lambda s: s.content == "Here to help.")
    assert ignored not in fake.sent and len(world.llm.requests) == requests_before + 1


async def test_feedback_click_reaches_the_store_with_the_question_id(world: World) -> None:
    fake = world.discord
    world.llm.script(answer("Forty-two."))
    message = await fake.user_message("what is the answer?", mention_bot=True)
    thread_id = int((await fake.wait_for_thread(message["id"]))["id"])
    answer_msg = await fake.wait_for_sent(thread_id, lambda s: s.content == "Forty-two.")
    assert answer_msg.custom_ids == [
        f"threadbook:feedback:good:{message['id']}",
        f"threadbook:feedback:bad:{message['id']}",
    ]
    click = await fake.press_button(answer_msg.id, f"threadbook:feedback:bad:{message['id']}")
    callback = await fake.wait_until(
        lambda: next((c for c in fake.callbacks if c.interaction_id == int(click["id"])), None)
    )
    assert (callback.type, callback.data.get("content"), callback.ephemeral) == (4, THANKS, True)
    assert callback.after_s < ANSWER_WINDOW_S
    key = f"discord:{GUILD_ID}:{CHANNEL_ID}:{thread_id}"
    await eventually(lambda: (key, str(message["id"]), str(USER_ID), 0) in world.feedback_rows())  # polls the file
    # Notices and command answers get no buttons; the status message lost its Stop button.
    # The status message is finished after the answer is posted, so its button goes a moment later.
    await eventually(
        lambda: [s.custom_ids for s in fake.sent[thread_id] if s.id != answer_msg.id and not s.ephemeral] == [[]]
    )


async def test_a_table_arrives_as_an_aligned_code_block(world: World) -> None:
    fake = world.discord
    world.llm.script(
        tool_call("print(100 + 2000)"),
        answer("Totals:\n\n| month | amount |\n|:--|--:|\n| Jan | 100 |\n| February | 2000 |\n\nDone."),
    )
    message = await fake.user_message("totals as a table", mention_bot=True)
    thread_id = int((await fake.wait_for_thread(message["id"]))["id"])
    reply = await fake.wait_for_sent(thread_id, lambda s: s.content.startswith("Totals:"))
    assert reply.content == (
        "Totals:\n\n```\nmonth    | amount\n---------+-------\nJan      |    100\nFebruary |   2000\n```\n\nDone."
    )


async def test_an_answer_with_a_chart_is_one_message(world: World) -> None:
    fake = world.discord
    world.llm.script(
        tool_call("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()"),
        answer("Here is the **chart**."),
    )
    message = await fake.user_message("draw a line", mention_bot=True)
    thread_id = int((await fake.wait_for_thread(message["id"]))["id"])
    assert await world.turn_done(message["id"]) == "✅"
    [reply] = [s for s in fake.sent[thread_id] if s.files or "chart" in s.text]
    assert reply.text == "Here is the **chart**." and [f.name.endswith(".png") for f in reply.files] == [True]
    assert Image.open(io.BytesIO(reply.files[0].data)).format == "PNG"
    assert len(reply.custom_ids) == 2  # 👍/👎 on the same message
    status, answered = fake.sent[thread_id]
    assert answered is reply and status.content == "✅ Done."


async def test_bot_id_is_the_application_id(world: World) -> None:
    assert world.adapter.client.application_id == BOT_ID
