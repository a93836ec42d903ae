"""Workspace: hostile upload names, quotas while streaming, symlinks, retention."""

from __future__ import annotations

import os
import time
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernels import QuotaError, UnsafePathError, Workspace, WorkspaceManager, sanitize_name


async def _chunks(data: bytes, size: int = 4096) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.fixture
def manager(tmp_path: Path) -> WorkspaceManager:
    return WorkspaceManager(tmp_path / "ws", max_file_bytes=10_000, quota_bytes=25_000)


@pytest.fixture
def ws(manager: WorkspaceManager) -> Workspace:
    return manager.for_key("slack:T1:C1:1700.0001")


HOSTILE = [
    ("../../etc/passwd", "passwd"),
    ("/abs/path/data.csv", "data.csv"),
    ("..\\..\\windows\\win.ini", "win.ini"),
    ("..", "file"),
    (".", "file"),
    ("", "file"),
    ("a\x00b.txt", "ab.txt"),
    ("evil\nname\r\t.csv", "evilname.csv"),
    ("\x1b[31mred.txt", "[31mred.txt"),
    (".hidden", "hidden"),
    ("...env", "env"),
    ("CON", "_CON"),
    ("nul.txt", "_nul.txt"),
    ("lpt1", "_lpt1"),
    ('we<ird>:"|?*.txt', "we_ird______.txt"),
    ("report. ", "report"),
]


@pytest.mark.parametrize(("raw", "expected"), HOSTILE)
def test_sanitize_name_table(raw: str, expected: str) -> None:
    assert sanitize_name(raw) == expected


def test_sanitize_long_and_unicode() -> None:
    long = sanitize_name("a" * 500 + ".csv")
    assert long.endswith(".csv") and len(long.encode()) <= 180
    emoji = sanitize_name("é" * 300)  # two bytes each: never split a character
    assert len(emoji.encode()) <= 180 and emoji == "é" * len(emoji)
    nfd = unicodedata.normalize("NFD", "café.csv")
    assert sanitize_name(nfd) == unicodedata.normalize("NFC", "café.csv")


@pytest.mark.parametrize(("raw", "_"), HOSTILE + [("a" * 500, ""), ("\u202egnp.exe", "")])
async def test_hostile_uploads_land_inside(ws: Workspace, raw: str, _: str) -> None:
    saved = await ws.save_upload(raw, _chunks(b"x"))
    with saved.file:
        assert saved.file.read() == b"x"
    assert (ws.path / saved.name).read_bytes() == b"x"
    assert not saved.name.startswith(".") and "/" not in saved.name


async def test_collisions_get_a_suffix(ws: Workspace) -> None:
    names = [(await ws.save_upload("data.csv", _chunks(b"1"))).name for _ in range(3)]
    assert names == ["data.csv", "data-2.csv", "data-3.csv"]
    nfc, nfd = unicodedata.normalize("NFC", "café.txt"), unicodedata.normalize("NFD", "café.txt")
    assert (await ws.save_upload(nfc, _chunks(b"a"))).name == nfc
    assert (await ws.save_upload(nfd, _chunks(b"b"))).name == "café-2.txt"


async def test_planted_symlink_is_never_followed(ws: Workspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    os.symlink(outside, ws.path / "data.csv")
    saved = await ws.save_upload("data.csv", _chunks(b"new"))
    assert saved.name == "data-2.csv"
    assert outside.read_text() == "keep"
    saved.file.close()
    with pytest.raises(UnsafePathError):
        ws.open_file("data.csv")
    assert [f.name for f in await ws.list_files()] == ["data-2.csv"]


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../x", "a\x00b", ""])
def test_open_refuses_escapes(ws: Workspace, bad: str) -> None:
    with pytest.raises(UnsafePathError):
        ws.open_file(bad)


async def test_declared_size_refused_before_writing(ws: Workspace) -> None:
    with pytest.raises(QuotaError):
        await ws.save_upload("big.bin", _chunks(b"x"), declared_size=10_001)
    assert await ws.list_files() == []


async def test_per_file_limit_while_streaming_leaves_no_partial_file(ws: Workspace) -> None:
    with pytest.raises(QuotaError):
        await ws.save_upload("big.bin", _chunks(b"x" * 10_001, 1000))  # size not declared (lied)
    assert await ws.list_files() == []


async def test_workspace_quota(ws: Workspace) -> None:
    await ws.save_upload("a.bin", _chunks(b"x" * 9_000))
    await ws.save_upload("b.bin", _chunks(b"x" * 9_000))
    with pytest.raises(QuotaError):
        await ws.save_upload("c.bin", _chunks(b"x" * 9_000), declared_size=9_000)
    with pytest.raises(QuotaError):
        await ws.save_upload("c.bin", _chunks(b"x" * 9_000))
    assert [f.name for f in await ws.list_files()] == ["a.bin", "b.bin"]
    assert await ws.usage_bytes() == 18_000


async def test_failing_stream_removes_partial(ws: Workspace) -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield b"abc"
        raise ConnectionError("download dropped")

    with pytest.raises(ConnectionError):
        await ws.save_upload("part.csv", broken())
    assert await ws.list_files() == []


async def test_listing_and_reading(ws: Workspace) -> None:
    (ws.path / "sub").mkdir()
    (ws.path / "sub" / "r.txt").write_text("hello")
    assert [f.name for f in await ws.list_files()] == ["sub/r.txt"]
    with ws.open_file("sub/r.txt") as pinned:
        assert pinned.read(100) == b"hello"
        assert pinned.read(2) == b"he"


def test_folder_is_a_hash_of_the_key(manager: WorkspaceManager) -> None:
    a, b = manager.for_key("slack:T:C:1"), manager.for_key("../../etc")
    assert a.path.parent == b.path.parent == manager.root
    assert len(a.path.name) == 32 and a.path != b.path and a.path.is_dir()


async def test_delete_stale_spares_recent_and_kept(manager: WorkspaceManager) -> None:
    old, kept, fresh = (manager.for_key(k) for k in ("old", "kept", "fresh"))
    for ws in (old, kept):
        (ws.path / "f.txt").write_text("x")
        past = time.time() - 10 * 86_400
        for p in (ws.path / "f.txt", ws.path):
            os.utime(p, (past, past))
    deleted = await manager.delete_stale(86_400, keep={"kept"})
    assert deleted == [old.path]
    assert not old.path.exists() and kept.path.exists() and fresh.path.exists()
