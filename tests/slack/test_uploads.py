"""Slack uploads through the real slack_sdk client against the fake Slack: streamed, safe names, failures."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import adapters.slack.outbox as outbox_module
from adapters.slack.api import make_client
from adapters.slack.outbox import MAX_UPLOAD_BYTES, SlackOutbox
from bot.events import FileOut, ImageOut, Reply, ThreadKey
from bot.safetext import shown
from tests.fakes.outputs import PeakRss, big_random_file, file_out
from tests.fakes.slack_server import FakeSlack

THREAD_TS = "1700000000.000100"
#: Streaming keeps a few 1 MiB chunks in flight; reading the file whole would add ~100 MiB.
MAX_GROWTH_BYTES = 40 * 2**20


@pytest_asyncio.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


def outbox_for(slack: FakeSlack, channel: str) -> SlackOutbox:
    client = make_client(slack.bot_token, slack.api_url)
    return SlackOutbox(client, key=ThreadKey("slack", "T1", channel, THREAD_TS), message_ts=THREAD_TS, user_id="U1")


def texts(slack: FakeSlack, channel: str) -> list[str]:
    return [m.text for m in slack.bot_messages(channel, THREAD_TS)]


async def test_a_100_mb_file_streams_to_slack_byte_identical_without_growing_memory(
    slack: FakeSlack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.bin"
    digest = big_random_file(path, MAX_UPLOAD_BYTES)  # 100 MiB: the largest file that is still uploaded
    outbox = outbox_for(slack, "C_BIG")
    with file_out(path) as big:
        with PeakRss() as memory:
            await asyncio.wait_for(outbox.post(Reply(text="Here it is.", files=(big,))), 120)
    [upload] = slack.uploads
    assert (upload.size, upload.sha256) == (MAX_UPLOAD_BYTES, digest)
    assert upload.length == upload.content_length == MAX_UPLOAD_BYTES  # declared up front, not chunked
    assert (upload.filename, upload.title, upload.channel, upload.thread_ts) == (
        "big.bin",
        "big.bin",
        "C_BIG",
        THREAD_TS,
    )
    assert texts(slack, "C_BIG") == ["Here it is."]
    with capsys.disabled():
        print(f"\nslack upload of 100 MiB: peak RSS growth {memory.growth / 2**20:.1f} MiB")
    assert memory.growth < MAX_GROWTH_BYTES, f"peak RSS grew by {memory.growth / 2**20:.1f} MiB"


async def test_images_and_files_share_in_one_message_with_escaped_names(slack: FakeSlack, tmp_path: Path) -> None:
    (tmp_path / "plain.csv").write_bytes(b"a,b\n1,2\n")
    (tmp_path / "evil.bin").write_bytes(b"MZ payload")
    outbox = outbox_for(slack, "C_NAMES")
    chart = ImageOut(b"\x89PNG fake", shown("chart\u202egnp"))  # the core escapes titles
    with file_out(tmp_path / "plain.csv") as plain, file_out(tmp_path / "evil.bin", "report\u202etxt.exe") as evil:
        await outbox.post(Reply(text="Done.", images=(chart,), files=(plain, evil)))
    assert len(slack.calls_to("files.completeUploadExternal")) == 1  # one shared message for the reply
    by_name = {u.filename: u for u in slack.uploads}
    assert set(by_name) == {"chart\\u202egnp.png", "plain.csv", "report\\u202etxt.exe"}
    assert by_name["report\\u202etxt.exe"].data == b"MZ payload"
    assert by_name["report\\u202etxt.exe"].title == "report\\u202etxt.exe"
    assert by_name["chart\\u202egnp.png"].title == "chart\\u202egnp"
    assert by_name["plain.csv"].data == b"a,b\n1,2\n"
    assert all("\u202e" not in c.args.get("filename", "") for c in slack.calls_to("files.getUploadURLExternal"))


async def test_a_file_over_the_cap_is_announced_with_an_escaped_name(
    slack: FakeSlack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_module, "MAX_UPLOAD_BYTES", 1024)
    (tmp_path / "big").write_bytes(b"x" * 4096)
    outbox = outbox_for(slack, "C_CAP")
    with file_out(tmp_path / "big", "big\nfake line.bin") as big:
        await outbox.post(Reply(text="Made it.", files=(big,)))
    [_, note] = texts(slack, "C_CAP")
    assert "`big\\nfake line.bin` is over 1.0 KB" in note and "\n" not in note.split("`")[1]
    assert slack.uploads == []


async def test_unreadable_short_and_refused_files_are_reported_and_the_rest_still_shared(
    slack: FakeSlack, tmp_path: Path
) -> None:
    def gone() -> io.BufferedReader:
        raise FileNotFoundError("gone")

    (tmp_path / "ok.txt").write_bytes(b"fine")
    outbox = outbox_for(slack, "C_MIXED")
    missing = FileOut(name="missing.txt", size=10, open_reader=gone)
    short = FileOut(name="short.txt", size=1000, open_reader=lambda: io.BytesIO(b"only this"))
    refused = FileOut(name="refused.txt", size=3, open_reader=lambda: io.BytesIO(b"abc"))
    slack.fail("files.getUploadURLExternal", "invalid_arguments")  # the first file asked for is refused
    with file_out(tmp_path / "ok.txt") as ok:
        await asyncio.wait_for(outbox.post(Reply(text="Files:", files=(refused, missing, short, ok))), 30)
    notes = texts(slack, "C_MIXED")[1:]
    assert any("could not read `missing.txt`" in t for t in notes)
    assert any("could not read `short.txt`" in t for t in notes)  # a cut body is never shared as the file
    assert any("could not upload `refused.txt`" in t and "invalid_arguments" in t for t in notes)
    assert [(u.filename, u.data) for u in slack.uploads] == [("ok.txt", b"fine")]


async def test_a_refused_share_names_every_file(slack: FakeSlack, tmp_path: Path) -> None:
    slack.fail("files.completeUploadExternal", "internal_error")
    outbox = outbox_for(slack, "C_SHARE")
    one = FileOut(name="one.txt", size=1, open_reader=lambda: io.BytesIO(b"1"))
    two = FileOut(name="two.txt", size=1, open_reader=lambda: io.BytesIO(b"2"))
    await outbox.post(Reply(text="Two files.", files=(one, two)))
    [_, note] = texts(slack, "C_SHARE")
    assert "could not upload `one.txt`, `two.txt`" in note and "internal_error" in note
    assert slack.uploads == []
