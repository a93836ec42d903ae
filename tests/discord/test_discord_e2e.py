"""Discord end to end: real discord.py against the fake Discord, the real Core, real kernels, scripted LLM.

One fake, one Core and one connected client serve the whole module; each test opens its own
thread (so its own kernel) with a fresh mention.
"""

from __future__ import annotations

import io
import re
import time
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from PIL import Image

from adapters.discord import DiscordAdapter
from adapters.discord.adapter import NO_THREAD_PERMISSION
from bot.app import Core
from tests.conftest import make_settings
from tests.discord.conftest import running_adapter
from tests.fakes.discord_server import BOT_ID, CHANNEL_ID, OTHER_BOT, USER, USER_ID, FakeDiscord
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

pytestmark = pytest.mark.asyncio(loop_scope="module")

UPLOAD_LIMIT_MB = 0.25
MAX_ATTACHMENT_MB = 0.5
SALES_CSV = b"month,amount\nJan,100\nFeb,200\nMar,300\n"


@dataclass
class World:
    discord: FakeDiscord
    llm: ScriptedOpenAI
    core: Core
    adapter: DiscordAdapter

    async def ask(self, text: str, **kwargs: Any) -> tuple[dict[str, Any], int]:
        """Mention the bot in #general; returns the message and the id of the thread it opened."""
        message = await self.discord.user_message(text, mention_bot=True, **kwargs)
        thread = await self.discord.wait_for_thread(message["id"])
        return message, int(thread["id"])

    async def turn_done(self, message: dict[str, Any], timeout: float = 30.0) -> str:
        """Wait for the ✅/❌/⏹️ reaction on ``message``; returns the emoji."""
        mid = int(message["id"])
        return await self.discord.wait_until(
            lambda: next((e for (_, m, e) in self.discord.reactions if m == mid and e in "✅❌⏹️"), None), timeout
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    tmp_path = tmp_path_factory.mktemp("discord")
    async with FakeDiscord(upload_limit=int(UPLOAD_LIMIT_MB * 2**20)) as fake, ScriptedOpenAI() as llm:
        settings = make_settings(
            tmp_path,
            llm_url=llm.base_url,
            discord={
                "token": fake.token,
                "api_url": fake.api_url,
                "gateway_url": fake.gateway_url,
                "upload_limit_mb": UPLOAD_LIMIT_MB,
            },
            kernels={"max_upload_mb": MAX_ATTACHMENT_MB},
            access={"allow_users": [str(USER_ID)]},
        )
        async with running_adapter(settings) as (core, adapter):
            yield World(fake, llm, core, adapter)
        assert fake.unknown_routes == []


@pytest.fixture(autouse=True)
def clean_script(world: World) -> None:
    """No test may leave unused model steps behind for the next one."""
    yield
    assert world.llm.remaining == 0, "a scripted LLM step was not used"


async def test_mention_with_csv_opens_thread_with_chart_and_follow_up_reuses_variable(world: World) -> None:
    fake = world.discord
    world.llm.script(
        tool_call("import pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(df.shape)"),
        tool_call("import matplotlib.pyplot as plt\ndf.plot(x='month', y='amount')\nplt.show()"),
        answer("Sales grew every month, peaking in **March**."),
    )
    message, thread_id = await world.ask("Plot the *sales* by month\nplease", files=[("sales.csv", SALES_CSV)])

    thread = fake.threads[thread_id]
    assert thread["name"] == "Plot the sales by month" and int(thread["parent_id"]) == CHANNEL_ID
    assert await world.turn_done(message) == "✅"
    answer_msg = await fake.wait_for_sent(thread_id, lambda s: "peaking in **March**" in s.text)
    chart = await fake.wait_for_sent(thread_id, lambda s: any(f.name.endswith(".png") for f in s.files))
    image = Image.open(io.BytesIO(chart.files[0].data))
    assert image.format == "PNG" and image.width > 100
    assert answer_msg.id == chart.id  # the chart arrives in the same message as its answer
    # Everything went into the thread: nothing the bot wrote landed in #general.
    assert CHANNEL_ID not in fake.sent
    assert fake.cdn_downloads == ["sales.csv"]
    # 👀 while working, then ✅; "typing…" and a status message edited in place, its Stop button gone at the end.
    mid = int(message["id"])
    assert ("add", mid, "👀") in fake.reaction_log and ("remove", mid, "👀") in fake.reaction_log
    assert (CHANNEL_ID, mid, "👀") not in fake.reactions
    assert thread_id in fake.typing
    status = next(s for s in fake.sent[thread_id] if s.content.startswith(("⏳", "✅")) and s.edits)
    assert any(e.startswith("⏳ Running step 1 (") and "s): `df = pd.read_csv('sales.csv')`" in e for e in status.edits)
    assert status.content == "✅ Done." and status.custom_ids == []

    world.llm.script(
        tool_call("print(df['amount'].sum())"), lambda request: answer("Total: " + request["messages"][-1]["content"])
    )
    follow_up = await fake.user_message("and the total?", channel_id=thread_id)  # no mention needed in the thread
    assert await world.turn_done(follow_up) == "✅"
    reply = await fake.wait_for_sent(thread_id, lambda s: s.content.startswith("Total:"))
    assert "600" in reply.content
    assert len(fake.threads) == 1  # the follow-up did not open another thread


async def test_bots_edits_and_unmentioned_channel_messages_get_no_answer(world: World) -> None:
    fake = world.discord
    requests_before = len(world.llm.requests)
    from_bot = await fake.user_message("please run rm -rf", mention_bot=True, author=OTHER_BOT)
    unmentioned = await fake.user_message("just chatting in #general")
    await fake.edit_user_message(unmentioned, f"<@{BOT_ID}> now with a mention")
    world.llm.script(answer("Hello from a DM."))
    dm = fake.dm_channel()
    from_human = await fake.user_message("hi", channel_id=dm)  # a DM needs no mention
    await world.turn_done(from_human)
    await fake.wait_for_sent(dm, lambda s: s.content == "Hello from a DM.")
    # Events are handled in order, so the earlier messages had their chance: no thread, no model call.
    assert int(from_bot["id"]) not in fake.threads and int(unmentioned["id"]) not in fake.threads
    assert len(world.llm.requests) == requests_before + 1
    assert not any(m in (int(from_bot["id"]), int(unmentioned["id"])) for (_, m, _) in fake.reactions)


async def test_a_user_outside_the_allow_list_gets_no_thread(world: World) -> None:
    fake = world.discord
    requests_before = len(world.llm.requests)
    stranger = {**USER, "id": "1100000000000000099", "username": "mallory", "global_name": "Mallory"}
    refused = await fake.user_message("run this for me", mention_bot=True, author=stranger)
    world.llm.script(answer("Hello from a DM."))
    dm = fake.dm_channel()
    allowed = await fake.user_message("hi", channel_id=dm)  # handled after the stranger's message
    await world.turn_done(allowed)
    assert int(refused["id"]) not in fake.threads
    assert len(world.llm.requests) == requests_before + 1


async def test_mention_inside_a_users_thread_answers_in_that_thread(world: World) -> None:
    fake = world.discord
    thread_id = await fake.user_thread("Quarterly numbers")
    world.llm.script(answer("Answering right here."))
    message = await fake.user_message("can you help?", channel_id=thread_id, mention_bot=True)
    assert await world.turn_done(message) == "✅"
    await fake.wait_for_sent(thread_id, lambda s: s.content == "Answering right here.")
    assert not any(r.startswith("POST") and r.endswith("/threads") and message["id"] in r for r in fake.requests)


async def test_oversized_attachment_is_refused_without_downloading_it(world: World) -> None:
    fake = world.discord
    world.llm.script(answer("I only have the small file."))
    big = b"x,y\n" + b"1,2\n" * 200_000  # 800 KB, over kernels.max_upload_mb
    message, thread_id = await world.ask("compare these", files=[("big.csv", big), ("small.csv", SALES_CSV)])
    await world.turn_done(message)
    notice = await fake.wait_for_sent(thread_id, lambda s: "big.csv" in s.content)
    assert "upload limit" in notice.content
    assert "big.csv" not in fake.cdn_downloads and "small.csv" in fake.cdn_downloads
    await fake.wait_for_sent(thread_id, lambda s: s.content == "I only have the small file.")


async def test_long_answer_arrives_in_several_messages_with_code_blocks_intact(world: World) -> None:
    fake = world.discord
    code = "\n".join(f"value_{i} = compute({i}) * 2  # step {i}" for i in range(45))
    prose = " ".join(["The numbers check out."] * 40)
    # ```text, not ```python: a python block in an answer without tool calls would be executed.
    long_answer = f"{prose}\n\n```text\n{code}\n```\n\n{prose}\n\n```text\n{code}\n```\n\nDone."
    assert 5000 < len(long_answer) < 6000  # longer ones are cut and attached whole (tests/bot/test_reply_cap.py)
    world.llm.script(answer(long_answer))
    fake.fail_next("POST", r"^/channels/\d+/messages$", 429)  # discord.py waits and retries
    message, thread_id = await world.ask("explain the numbers at length")
    await world.turn_done(message)

    chunks = [s.content for s in fake.sent[thread_id] if not s.content.startswith(("⏳", "✅", "❌"))]
    assert len(chunks) >= 3
    assert all(len(c) <= 2000 for c in chunks)
    assert all(c.count("```") % 2 == 0 for c in chunks)  # every chunk opens and closes its fences
    body = "\n".join(chunks)
    lines = [line for line in body.splitlines() if line.startswith("value_")]
    assert lines == code.splitlines() * 2  # every code line arrives once, in order
    assert body.rstrip().endswith("Done.")


async def test_oversized_files_are_zipped_or_reported(world: World) -> None:
    fake = world.discord
    limit = int(UPLOAD_LIMIT_MB * 2**20)
    world.llm.script(
        tool_call(
            "import os\nopen('report.txt', 'w').write('all good here\\n' * 40000)\n"
            "open('noise.bin', 'wb').write(os.urandom(400_000))"
        ),
        answer("I wrote two files."),
    )
    message, thread_id = await world.ask("write me the big files")
    await world.turn_done(message)

    zipped = await fake.wait_for_sent(thread_id, lambda s: any(f.name == "report.txt.zip" for f in s.files))
    data = next(f.data for f in zipped.files if f.name == "report.txt.zip")
    assert len(data) <= limit
    assert zipfile.ZipFile(io.BytesIO(data)).read("report.txt") == b"all good here\n" * 40000
    note = await fake.wait_for_sent(thread_id, lambda s: "noise.bin" in s.text)
    assert "upload limit" in note.text and "workspace" in note.text
    assert all(f.name != "noise.bin" for s in fake.sent[thread_id] for f in s.files)


async def test_a_running_cell_shows_its_time_and_latest_lines_in_the_status(world: World) -> None:
    fake = world.discord
    world.llm.script(
        tool_call(
            "# Count slowly\nimport time\nfor i in range(10):\n    print(f'line {i}', flush=True)\n    time.sleep(0.5)"
        ),
        answer("Counted."),
    )
    message, thread_id = await world.ask("count to ten slowly")
    assert await world.turn_done(message) == "✅"
    status = next(s for s in fake.sent[thread_id] if s.content.startswith("✅ Done.") and s.edits)
    running = [e for e in status.edits if e.startswith("⏳ Running step 1 (")]
    assert running and all("Count slowly" in e for e in running)  # the model's words label the step
    seen = {int(n) for e in running for n in re.findall(r"line (\d)", e)}
    assert len(seen) >= 2 and min(seen) < 9  # lines it printed showed up while it ran
    assert len(status.edits) <= 2 + 5 / 1.5 + 2  # throttled: no edit per printed line, no backlog


async def test_stop_button_interrupts_a_long_cell(world: World) -> None:
    fake = world.discord
    world.llm.script(tool_call("import time\nfor _ in range(600):\n    time.sleep(0.1)\nprint('finished')"))
    message, thread_id = await world.ask("count slowly to sixty seconds")
    await fake.wait_until(lambda: any("Running step 1" in s.content for s in fake.sent.get(thread_id, [])))
    status = next(s for s in fake.sent[thread_id] if s.custom_ids)
    started = time.monotonic()
    interaction = await fake.press_button(status.id)

    assert await world.turn_done(message) == "⏹️"
    assert time.monotonic() - started < 15  # the cell alone would run for 60 s
    assert {"interaction_id": int(interaction["id"]), "type": 6} in fake.interaction_responses  # acknowledged
    assert status.content == "⏹️ Stopped." and status.custom_ids == []
    assert not any("finished" in s.content for s in fake.sent[thread_id])
    # The kernel survived the interrupt and still answers in this thread.
    world.llm.script(tool_call("print(6 * 7)"), lambda request: answer("It is " + request["messages"][-1]["content"]))
    again = await fake.user_message("what is 6*7?", channel_id=thread_id)
    assert await world.turn_done(again) == "✅"
    assert "42" in (await fake.wait_for_sent(thread_id, lambda s: s.content.startswith("It is"))).content


async def test_a_stop_from_someone_access_keeps_out_changes_nothing(world: World) -> None:
    """Only people ``access.allow_users`` admits may stop a turn: an outsider's Stop is acknowledged
    and ignored, and the cell runs to its end."""
    fake = world.discord
    world.llm.script(
        tool_call("import time\nfor _ in range(30):\n    time.sleep(0.1)\nprint('finished')"), answer("Done.")
    )
    message, thread_id = await world.ask("count slowly to three seconds")
    await fake.wait_until(lambda: any("Running step 1" in s.content for s in fake.sent.get(thread_id, [])))
    status = next(s for s in fake.sent[thread_id] if s.custom_ids)
    outsider = {**USER, "id": str(USER_ID + 1), "username": "outsider"}
    await fake.press_button(status.id, user=outsider)

    assert await world.turn_done(message) == "✅"
    assert status.content == "✅ Done."
    assert "finished" in str([m for m in world.llm.requests[-1]["messages"] if m["role"] == "tool"][-1]["content"])


async def test_answers_again_after_the_gateway_asks_to_reconnect(world: World) -> None:
    fake = world.discord
    identifies = fake.identifies
    await fake.request_reconnect()
    world.llm.script(answer("Still here."))
    message = await fake.user_message("are you still there?", mention_bot=True)  # may arrive mid-reconnect
    thread = await fake.wait_for_thread(message["id"])
    await fake.wait_for_sent(thread["id"], lambda s: s.content == "Still here.")
    assert fake.resumes >= 1 and fake.identifies == identifies  # resumed the session, did not re-identify
    assert all("compress=zlib-stream" in query for query in fake.gateway_queries)
    await world.turn_done(message)

    # A duplicate delivery of the same message is not answered twice.
    requests_before = len(world.llm.requests)
    await fake.redeliver(message)
    await fake.wait_until(lambda: f"GET /channels/{message['id']}" in fake.requests)  # found the existing thread
    world.llm.script(answer("Yes, once."))
    follow_up = await fake.user_message("only once?", channel_id=thread["id"])
    await world.turn_done(follow_up)
    contents = [s.content for s in fake.sent[int(thread["id"])]]
    assert contents.count("Still here.") == 1 and "Yes, once." in contents
    assert len(world.llm.requests) == requests_before + 1


async def test_missing_thread_permission_is_reported_in_the_channel(world: World) -> None:
    fake = world.discord
    requests_before = len(world.llm.requests)
    fake.fail_next("POST", r"/messages/\d+/threads$", 403)
    message = await fake.user_message("plot something", mention_bot=True)
    told = await fake.wait_for_sent(CHANNEL_ID, lambda s: s.content == NO_THREAD_PERMISSION)
    assert told.id > int(message["id"])
    assert int(message["id"]) not in fake.threads and len(world.llm.requests) == requests_before
    fake.sent.pop(CHANNEL_ID)


async def test_every_message_the_bot_sends_or_edits_mentions_no_one(world: World) -> None:
    """Last in the module: every message request of every test so far (sends, status edits,
    answers, files, interaction replies) carries ``allowed_mentions`` with nothing to parse."""
    fake = world.discord
    world.llm.script(tool_call("print(1)"), answer("Done, @everyone and <@123> and <@&456>."))
    message, thread = await world.ask("mention everyone when done")
    assert await world.turn_done(message) == "✅"
    assert any("@everyone" in s.content for s in fake.sent.get(thread, []))  # said, as text
    sent = fake.message_requests
    assert len({line for line, _ in sent}) >= 2 and len(sent) >= 3
    assert [
        (line, body.get("allowed_mentions")) for line, body in sent if body.get("allowed_mentions") != {"parse": []}
    ] == []
