"""Discord adapter pieces that need no network: thread names, mentions, upload planning, endpoints."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from adapters.discord import endpoints
from adapters.discord.inbound import strip_mention, thread_name
from adapters.discord.uploads import MAX_FILES_PER_MESSAGE, plan_uploads
from bot.events import FileOut, ImageOut


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
    plan = await plan_uploads(
        (ImageOut(b"\x89PNG" + b"0" * 60_000, "chart"),),
        (FileOut(small, "small.csv"), FileOut(text, "log.txt"), FileOut(noise, "noise.bin"),
         FileOut(tmp_path / "gone.txt", "gone.txt")),
        limit,
    )
    names = [[u.name for u in batch] for batch in plan.batches]
    assert sorted(n for batch in names for n in batch) == ["chart.png", "log.txt.zip", "small.csv"]
    assert all(sum(u.size for u in batch) <= limit for batch in plan.batches)
    zipped = next(u for batch in plan.batches for u in batch if u.name == "log.txt.zip")
    assert zipped.data is not None
    assert zipfile.ZipFile(io.BytesIO(zipped.data)).read("log.txt") == text.read_bytes()
    assert any("noise.bin" in note and "upload limit" in note for note in plan.notes)
    assert any("gone.txt" in note for note in plan.notes)


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
