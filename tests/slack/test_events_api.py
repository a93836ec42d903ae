"""Slack over the HTTP Events API, end to end: real bolt + slack_sdk, Core, kernels; fake Slack and model."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest
import pytest_asyncio

from adapters.slack.format import MESSAGE_LIMIT
from tests.fakes.openai_server import answer, tool_call
from tests.slack.conftest import Bot, running_bot

pytestmark = pytest.mark.asyncio(loop_scope="module")

SALES_CSV = b"month,amount\nJan,100\nFeb,200\nMar,300\n"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bot]:
    async with running_bot(tmp_path_factory.mktemp("slack-http"), socket_mode=False) as running:
        yield running


def last_tool_output(request: dict[str, Any]) -> str:
    return next(m["content"] for m in reversed(request["messages"]) if m["role"] == "tool")


async def test_url_verification_challenge_is_answered(bot: Bot) -> None:
    status, body = await bot.slack.post_event(
        bot.events_url, {"type": "url_verification", "token": "t", "challenge": "c-123"}
    )
    assert status == 200 and "c-123" in body


async def test_bad_signature_is_rejected_and_not_handled(bot: Bot) -> None:
    event = bot.slack.mention("C_SIG", "hello")
    status, _ = await bot.slack.post_event(bot.events_url, event, secret="not-the-secret")
    assert status == 401
    await asyncio.sleep(0.2)
    await bot.adapter.wait_idle()
    assert bot.slack.bot_messages("C_SIG") == []
    assert ("C_SIG", event["ts"]) not in bot.slack.reactions


async def test_mention_with_csv_gets_chart_in_thread_and_follow_up_reuses_variable(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    file = slack.add_file("sales.csv", SALES_CSV, "text/csv")
    llm.script(
        tool_call("import pandas as pd, time\ndf = pd.read_csv('sales.csv')\ntime.sleep(1.1)\nprint(df.shape)"),
        tool_call("import matplotlib.pyplot as plt\ndf.plot(x='month', y='amount')\nplt.show()"),
        answer("Sales grew every month, peaking in **March**."),
    )
    event = slack.mention("C_CSV", "plot the sales", files=[file])
    status, _ = await slack.post_event(bot.events_url, event)
    assert status == 200

    assert await bot.finished(event) == {"white_check_mark"}  # :eyes: was swapped for ✅
    assert any(r.args.get("name") == "eyes" for r in slack.calls_to("reactions.add"))
    assert slack.downloads == [(file["id"], True)]
    assert "(3, 2)" in last_tool_output(llm.requests[1])  # the kernel read the downloaded CSV
    first_user = next(m for m in llm.requests[0]["messages"] if m["role"] == "user")["content"]
    assert first_user.startswith("plot the sales") and "<@" not in first_user and "sales.csv" in first_user
    assert bot.answers(event) == ["Sales grew every month, peaking in *March*."]
    [upload] = slack.uploads
    assert upload.data.startswith(PNG_MAGIC) and len(upload.data) > 1000
    assert upload.filename.endswith(".png") and upload.title
    assert (upload.channel, upload.thread_ts) == ("C_CSV", event["ts"])
    # The chart came in the answer's own message, with 👍/👎 under the answer.
    [answered] = [m for m in slack.messages if m.channel == "C_CSV" and m.files]
    assert answered.files == [upload.file_id] and answered.text == "Sales grew every month, peaking in *March*."
    assert [b["type"] for b in answered.blocks or []] == ["section", "context_actions"]

    # The status message had a Stop button, showed the steps, was edited at most once a second, then deleted.
    [status_msg] = [m for m in slack.messages if m.channel == "C_CSV" and m.blocks and not m.files]
    assert status_msg.deleted and status_msg.thread_ts == event["ts"]
    button = status_msg.blocks[1]["elements"][0]  # type: ignore[index]
    assert button["action_id"] == "threadbook_stop" and button["value"] == f"slack:T1:C_CSV:{event['ts']}"
    assert any(
        "Running step 1 (" in text and "s): `df = pd.read_csv('sales.csv')`" in text for text in status_msg.updates
    )
    edits = [c.at for c in slack.calls_to("chat.update") if c.args.get("ts") == status_msg.ts]
    assert all(later - earlier >= 0.9 for earlier, later in zip(edits, edits[1:]))

    llm.script(tool_call("print(df['amount'].sum())"), lambda req: answer("Total: " + last_tool_output(req)))
    follow_up = slack.message_event("C_CSV", "and the total?", thread_ts=event["ts"])
    await slack.post_event(bot.events_url, follow_up)
    assert await bot.finished(follow_up) == {"white_check_mark"}
    assert "600" in bot.answers(event)[-1]


async def test_own_echoes_other_bots_and_edits_get_no_answer(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    requests_before = len(llm.requests)
    mention = f"<@{slack.bot_user_id}> run this"
    ignored = [
        slack.message_event("C_BOTS", mention, user=slack.bot_user_id, bot_id=slack.bot_id),  # our own echo
        slack.message_event("C_BOTS", mention, user="U_OTHER_BOT", bot_id="B_OTHER"),
        slack.message_event("C_BOTS", mention, subtype="bot_message", bot_id="B_OTHER", user=None),
        slack.message_event("C_BOTS", mention, subtype="message_changed"),
        slack.message_event("C_BOTS", mention, subtype="message_deleted"),
    ]
    for event in ignored:
        status, _ = await slack.post_event(bot.events_url, event)
        assert status == 200  # acknowledged, so Slack does not retry
    llm.script(answer("Only this one."))
    real = slack.mention("C_BOTS", "hello")
    await slack.post_event(bot.events_url, real)
    await bot.finished(real)
    assert [m.text for m in slack.bot_messages("C_BOTS")] == ["Only this one."]
    assert len(llm.requests) == requests_before + 1
    assert all(("C_BOTS", e["ts"]) not in slack.reactions for e in ignored)


async def test_direct_message_without_mention_is_answered_in_its_thread(bot: Bot) -> None:
    bot.llm.script(answer("Hi from a DM."))
    event = bot.slack.message_event("D_DM", "hello there", channel_type="im")
    await bot.slack.post_event(bot.events_url, event)
    assert await bot.finished(event) == {"white_check_mark"}
    assert bot.answers(event) == ["Hi from a DM."]
    assert bot.slack.bot_messages("D_DM")[0].thread_ts == event["ts"]
    user_turn = next(m for m in bot.llm.requests[-1]["messages"] if m["role"] == "user")
    assert user_turn["content"] == "hello there"


async def test_same_message_delivered_several_times_is_answered_once(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    requests_before = len(llm.requests)
    llm.script(answer("Answered once."))
    mention = slack.mention("C_DUP", "hi")
    # One message yields app_mention + message; Slack then retries the app_mention.
    as_message = slack.message_event("C_DUP", mention["text"], ts=mention["ts"])
    payload = slack.event_callback(mention)
    await slack.post_event(bot.events_url, payload)
    await slack.post_event(bot.events_url, as_message)
    status, _ = await slack.post_event(bot.events_url, payload, retry_num=1)
    assert status == 200
    await bot.finished(mention)
    await asyncio.sleep(0.3)  # let any late duplicate run through the dispatcher
    await bot.adapter.wait_idle()
    assert bot.answers(mention) == ["Answered once."]
    assert len(llm.requests) == requests_before + 1


async def test_long_answer_is_split_without_breaking_code_blocks_and_attached_whole(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    code = "\n".join(f"row_{i} = compute({i})  # step {i}" for i in range(300))
    long_text = "# Report\n\n" + "Findings so far. " * 150 + f"\n\n```text\n{code}\n```\n\nThe end."
    llm.script(answer(long_text))
    slack.fail("chat.postMessage", "ratelimited")  # the first post is rate-limited and retried
    event = slack.mention("C_LONG", "write a long report")
    await slack.post_event(bot.events_url, event)
    assert await bot.finished(event, timeout=40) == {"white_check_mark"}
    parts = bot.answers(event)
    assert 2 <= len(parts) <= 3  # a few messages, however long the answer
    assert all(len(p) <= MESSAGE_LIMIT for p in parts)
    assert all(len(re.findall(r"^```", p, flags=re.M)) % 2 == 0 for p in parts)
    assert parts[0].startswith("*Report*") and "answer.md" in parts[-1]
    whole = [u for u in slack.uploads if u.filename == "answer.md"]
    assert len(whole) == 1 and whole[0].data.decode() == long_text
    # The last part came with the whole answer attached, in one message.
    [with_file] = [m for m in slack.bot_messages("C_LONG", event["ts"]) if m.files]
    assert with_file.text == parts[-1] and with_file.files == [whole[0].file_id]
    posts = [c for c in slack.calls_to("chat.postMessage") if c.args.get("channel") == "C_LONG"]
    assert len(posts) == 1 + len(parts) - 1 + 1  # status message + the parts before the last + the retried 429


async def test_stop_button_interrupts_a_sleeping_cell(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    requests_before = len(llm.requests)
    llm.script(tool_call("import time\ntime.sleep(60)"))
    event = slack.mention("C_STOP", "sleep a minute")
    await slack.post_event(bot.events_url, event)
    key = f"slack:T1:C_STOP:{event['ts']}"
    status_msg = await slack.wait_for(
        lambda: next((m for m in slack.messages if m.channel == "C_STOP" and m.blocks and m.updates), None)
    )
    await slack.wait_for(lambda: (s := bot.core.pool.get(key)) is not None and s.busy)
    await asyncio.sleep(0.3)

    started = asyncio.get_running_loop().time()
    status, _ = await slack.post_interactive(bot.events_url, slack.block_action(status_msg, "threadbook_stop", key))
    assert status == 200
    assert await bot.finished(event, timeout=15) == {"x"}
    assert asyncio.get_running_loop().time() - started < 10
    assert "stop" in bot.answers(event)[-1].lower()
    assert len(llm.requests) == requests_before + 1  # no further model call after Stop
    assert status_msg.deleted


async def test_unfetchable_file_and_failed_upload_are_reported_in_thread(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    missing = slack.add_file("lost.csv", b"a,b\n1,2\n", "text/csv")
    missing["url_private_download"] = missing["url_private_download"].replace(missing["id"], "F_GONE")
    slack.fail("files.completeUploadExternal", "internal_error")
    llm.script(tool_call("open('out.txt', 'w').write('hi')"), answer("Wrote **out.txt**."))
    event = slack.mention("C_FILES", "use my file", files=[missing])
    await slack.post_event(bot.events_url, event)
    await bot.finished(event)
    texts = bot.answers(event)
    assert any("lost.csv" in t and "could not be downloaded" in t for t in texts)
    assert "Wrote *out.txt*." in texts
    assert any("could not upload" in t and "out.txt" in t and "internal_error" in t for t in texts)
    assert not [u for u in slack.uploads if u.channel == "C_FILES"]


async def test_not_in_channel_is_explained_to_the_user_directly(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    slack.not_in_channel.add("C_PRIVATE")
    llm.script(answer("hello"))
    event = slack.mention("C_PRIVATE", "hi", user="U_ASKER")
    await slack.post_event(bot.events_url, event)
    [dm] = await slack.wait_for(lambda: slack.bot_messages("U_ASKER"))
    assert "not_in_channel" in dm.text and "/invite" in dm.text
    await bot.finished(event)
    assert len(slack.bot_messages("U_ASKER")) == 1  # told once, not once per failed post


async def test_result_file_over_the_upload_cap_stays_in_the_workspace(
    bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    import adapters.slack.outbox as outbox

    monkeypatch.setattr(outbox, "MAX_UPLOAD_BYTES", 1024)
    slack, llm = bot.slack, bot.llm
    llm.script(
        tool_call("open('small.txt', 'w').write('ok')\nopen('big.bin', 'wb').write(b'x' * 4096)"),
        answer("Made two files."),
    )
    event = slack.mention("C_BIG", "make files")
    await slack.post_event(bot.events_url, event)
    await bot.finished(event)
    assert any("big.bin" in t and "stays in" in t for t in bot.answers(event))
    uploaded = [u.filename for u in slack.uploads if u.channel == "C_BIG"]
    assert uploaded == ["small.txt"]


async def test_a_top_level_channel_message_without_a_mention_reaches_nothing_but_a_thread_reply_does(
    bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    slack = bot.slack
    spawned: list[str] = []
    real_spawn = bot.adapter._tasks.spawn

    def recording_spawn(work: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        spawned.append(name)
        return real_spawn(work, name=name)

    monkeypatch.setattr(bot.adapter._tasks, "spawn", recording_spawn)
    # A top-level message continues no thread: without a mention, outside a DM, no turn is even asked about.
    chatter = slack.message_event("C_CHATTER", "lunch anyone?")
    await slack.post_event(bot.events_url, chatter)
    bot.llm.script(answer("Hello."))
    event = slack.mention("C_CHATTER", "hello")
    await slack.post_event(bot.events_url, event)
    assert await bot.finished(event) == {"white_check_mark"}
    # The unmentioned reply in the thread the bot answered is a turn (slack.reply_without_mention).
    bot.llm.script(answer("Still here."))
    reply = slack.message_event("C_CHATTER", "still there?", thread_ts=event["ts"])
    await slack.post_event(bot.events_url, reply)
    assert await bot.finished(reply) == {"white_check_mark"}
    assert bot.answers(event)[-1] == "Still here."
    turns = [name for name in spawned if name.startswith("slack turn ")]
    assert turns == [f"slack turn C_CHATTER:{event['ts']}", f"slack turn C_CHATTER:{reply['ts']}"]
    assert ("C_CHATTER", chatter["ts"]) not in slack.reactions
    assert not slack.bot_messages("C_CHATTER", chatter["ts"])
