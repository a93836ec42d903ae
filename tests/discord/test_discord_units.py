"""Discord adapter pieces: thread names, mentions, upload planning, endpoints; uploads against the fake."""

from __future__ import annotations

import asyncio
import io
import os
import zipfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import discord
import pytest
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from adapters.discord import endpoints
from adapters.discord.inbound import strip_mention, thread_name
from adapters.discord.outbox import Conversation, DiscordOutbox
from adapters.discord.uploads import MAX_FILES_PER_MESSAGE, plan_uploads
from bot.events import FileOut, ImageOut, Reply, ThreadKey
from tests.fakes.discord_server import CHANNEL_ID, FakeDiscord
from tests.fakes.outputs import file_out


def test_thread_name_comes_from_the_first_line_without_markdown() -> None:
    assert thread_name("  **Plot** the `sales`\nby month please") == "Plot the sales"
    assert thread_name("", ["sales.csv"]) == "sales.csv"
    assert thread_name("   ") == "Threadbook session"
    long = thread_name("why " * 60)
    assert len(long) <= 100 and long.endswith("…") and not long.startswith(" ")


def test_strip_mention_removes_only_the_bot() -> None:
    assert strip_mention("<@42> plot <@7> this <@!42>", 42) == "plot <@7> this"


async def test_uploads_fit_the_limit_zip_or_are_reported(tmp_path: Path) -> None:
    limit = 100_000
    small = tmp_path / "small.csv"
    small.write_text("a,b\n1,2\n")
    text = tmp_path / "log.txt"
    text.write_text("same line again\n" * 20_000)  # 320 KB, zips to a few KB
    noise = tmp_path / "noise.bin"
    noise.write_bytes(os.urandom(150_000))

    def gone() -> io.BufferedReader:
        raise FileNotFoundError("gone")

    with file_out(small) as small_out, file_out(text) as text_out, file_out(noise) as noise_out:
        plan = await plan_uploads(
            (ImageOut(b"\x89PNG" + b"0" * 60_000, "chart"),),
            (small_out, text_out, noise_out, FileOut("gone.txt", 200_000, gone)),
            limit,
        )
        try:
            names = [[u.name for u in batch] for batch in plan.batches]
            assert sorted(n for batch in names for n in batch) == ["chart.png", "log.txt.zip", "small.csv"]
            assert all(sum(u.size for u in batch) <= limit for batch in plan.batches)
            zipped = next(u for batch in plan.batches for u in batch if u.name == "log.txt.zip")
            for _ in range(2):  # each reader starts at the beginning of the archive
                with zipped.open_reader() as reader:
                    data = reader.read()
                assert len(data) == zipped.size
                assert zipfile.ZipFile(io.BytesIO(data)).read("log.txt") == text.read_bytes()
            plain = next(u for batch in plan.batches for u in batch if u.name == "small.csv")
            with plain.open_reader() as reader:
                assert reader.read() == b"a,b\n1,2\n"
            assert any("noise.bin" in note and "upload limit" in note for note in plan.notes)
            assert any("gone.txt" in note and "could not be read" in note for note in plan.notes)
        finally:
            plan.close()


async def test_uploads_go_at_most_ten_per_message(tmp_path: Path) -> None:
    images = tuple(ImageOut(b"png", f"plot{i}") for i in range(13))
    plan = await plan_uploads(images, (), 10 * 2**20)
    assert [len(batch) for batch in plan.batches] == [MAX_FILES_PER_MESSAGE, 3]


def test_endpoints_are_installed_and_restored() -> None:
    original = (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)
    undo = endpoints.install("http://127.0.0.1:9/api/v10/", "ws://127.0.0.1:9/gateway")
    try:
        assert Route("GET", "/users/@me").url == "http://127.0.0.1:9/api/v10/users/@me"
        assert DiscordWebSocket.DEFAULT_GATEWAY == yarl.URL("ws://127.0.0.1:9/gateway")
        with pytest.raises(RuntimeError, match="one Discord API"):
            endpoints.install("http://127.0.0.1:10/api/v10", None)
        endpoints.install("http://127.0.0.1:9/api/v10", "ws://127.0.0.1:9/gateway")()  # same target: shared
        assert Route.BASE == "http://127.0.0.1:9/api/v10"
    finally:
        undo()
    assert (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY) == original


async def _channel(stack: AsyncExitStack, fake: FakeDiscord) -> discord.abc.Messageable:
    """#general as a connected discord.py client sees it (the fake echoes posts on the gateway)."""
    stack.callback(endpoints.install(fake.api_url, fake.gateway_url))
    intents = discord.Intents.none()
    intents.guilds = True
    client = discord.Client(intents=intents, chunk_guilds_at_startup=False, guild_ready_timeout=0.05)
    await client.login(fake.token)
    connection = asyncio.create_task(client.connect(reconnect=False))

    async def close() -> None:
        await client.close()
        await asyncio.gather(connection, return_exceptions=True)

    stack.push_async_callback(close)
    await asyncio.wait_for(client.wait_until_ready(), 10)
    channel = client.get_channel(CHANNEL_ID) or await client.fetch_channel(CHANNEL_ID)
    assert isinstance(channel, discord.abc.Messageable)
    return channel


def _outbox(channel: discord.abc.Messageable, limit: int) -> DiscordOutbox:
    async def no_stop(key: ThreadKey) -> bool:
        return False

    source: Any = None  # post() only writes to the channel
    conversation = Conversation(channel, source, discord.Object(1), ThreadKey("discord", "g", "c", "t"), no_stop)
    return DiscordOutbox(conversation, upload_limit=limit)


@pytest.fixture
async def fake_discord() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(upload_limit=300_000) as fake:
        yield fake


async def test_files_stream_from_readers_with_a_length_and_big_ones_zip_from_readers(
    fake_discord: FakeDiscord, tmp_path: Path
) -> None:
    fake = fake_discord
    plain = tmp_path / "data.bin"
    plain.write_bytes(os.urandom(200_000))
    text = tmp_path / "log.txt"
    text.write_bytes(b"the same line, many times\n" * 40_000)  # ~1 MB, zips to a few KB
    async with AsyncExitStack() as stack:
        outbox = _outbox(await _channel(stack, fake), fake.upload_limit)
        with file_out(plain) as plain_out, file_out(text, "log\u202e.txt") as text_out:
            await outbox.post(Reply(text="Two files.", files=(plain_out, text_out)))
    sent = fake.sent[CHANNEL_ID]
    with_files = [s for s in sent if s.files]
    received = {f.name: f.data for s in with_files for f in s.files}
    assert received["data.bin"] == plain.read_bytes()
    [zip_name] = [n for n in received if n.endswith(".zip")]
    archive = zipfile.ZipFile(io.BytesIO(received[zip_name]))
    [entry] = archive.namelist()
    assert archive.read(entry) == text.read_bytes()
    assert "\u202e" not in zip_name + entry  # the name went through shown() (Discord may clean it further)
    assert all(s.content_length is not None for s in with_files)  # a length up front, not chunked
    [note] = [s.content for s in sent if "zipped" in s.content]
    assert "`log\\u202e.txt` is" in note and "\u202e" not in note


async def test_a_file_that_shrinks_mid_upload_is_reported_not_hung(fake_discord: FakeDiscord) -> None:
    fake = fake_discord
    short = FileOut(name="short.bin", size=100_000, open_reader=lambda: io.BytesIO(b"x" * 10))
    async with AsyncExitStack() as stack:
        outbox = _outbox(await _channel(stack, fake), fake.upload_limit)
        await outbox.post(Reply(text="A file.", files=(short,)))
    contents = [s.content for s in fake.sent[CHANNEL_ID]]
    assert any("short.bin" in c and "Could not upload" in c for c in contents)
    assert not any(s.files for s in fake.sent[CHANNEL_ID])


def test_thread_name_shows_bidi_and_control_characters_escaped() -> None:
    name = thread_name("invoice \u202egnp.exe\u202c for\x07 Q3")
    assert "\u202e" not in name and "\u202c" not in name and "\x07" not in name
    assert name == "invoice \\u202egnp.exe\\u202c for\\x07 Q3"
    from_file = thread_name("", ["report\u202efdp.exe"])
    assert "\u202e" not in from_file and from_file.startswith("report\\u202e")
    long = thread_name("\u202e" * 200)
    assert len(long) <= 100 and "\u202e" not in long
