"""Turns in flight in the store: the migration from schema 1, begin/end, and take-once semantics."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import pytest

from bot.events import ThreadKey
from bot.migrations.legacy import MIGRATIONS as _MIGRATIONS
from bot.store import SCHEMA_VERSION, InterruptedTurn, Store

SLACK = ThreadKey.parse("slack:T1:C1:1700000000.000100")
SLACK_2 = ThreadKey.parse("slack:T1:C2:1700000000.000200")
DISCORD = ThreadKey.parse("discord:G1:C2:99")


def make_v1_database(path: Path) -> None:
    """A database as the first release left it: schema 1 with a thread, its messages and a handled id."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as raw:
        for statement in _MIGRATIONS[0]:
            raw.execute(statement)
        raw.execute("PRAGMA user_version = 1")
        raw.execute(
            "INSERT INTO threads (key, channel_key, created_at, last_active_at, last_seq) VALUES (?, ?, ?, ?, ?)",
            (str(SLACK), "slack:C1", 1.0, 2.0, 1),
        )
        raw.execute(
            "INSERT INTO messages (thread, seq, role, content, user_id, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (str(SLACK), 1, "user", json.dumps({"role": "user", "content": "hello from v1"}), "U1", 1.0),
        )
        raw.execute("INSERT INTO processed (message_id, at) VALUES (?, ?)", ("slack:C1:1.0", time.time()))
    raw.close()


def in_flight_rows(path: Path) -> list[tuple[ThreadKey, str]]:
    """(thread, message id) of every mark, read beside the store (WAL allows a second reader)."""
    with sqlite3.connect(path) as raw:
        rows = raw.execute("SELECT thread, message_id FROM turns_in_flight ORDER BY started_at").fetchall()
    raw.close()
    return [(ThreadKey.parse(t), str(m)) for t, m in rows]


async def test_schema_1_database_migrates_in_place_and_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "data" / "threadbook.db"
    make_v1_database(path)

    async with await Store.open(path) as store:
        assert await store.schema_version() == SCHEMA_VERSION
        assert await store.transcripts.history(SLACK) == [{"role": "user", "content": "hello from v1"}]
        assert not await store.processed.claim("slack:C1:1.0")  # the handled id survived
        await store.transcripts.add_messages(SLACK, [{"role": "assistant", "content": "hi"}])  # seq continues after 1
        await store.turns.begin(SLACK, "C1:2.0")
    assert in_flight_rows(path) == [(SLACK, "C1:2.0")]

    async with await Store.open(path) as store:  # a second open runs no migration again
        assert await store.schema_version() == SCHEMA_VERSION
        assert [m["content"] for m in await store.transcripts.history(SLACK)] == ["hello from v1", "hi"]
        assert [t.message_id for t in await store.turns.take_interrupted()] == ["C1:2.0"]


async def test_begin_end_and_take_once(tmp_path: Path) -> None:
    path = tmp_path / "tb.db"
    async with await Store.open(path) as first:
        await first.turns.begin(SLACK, "m1")
        await first.turns.begin(SLACK_2, "m2")
        await first.turns.begin(DISCORD, "m3")
        await first.turns.end(SLACK_2, "m2")
        await first.turns.end(SLACK_2, "m2")  # ending twice is harmless
        # The process that began them is still running them: none is interrupted for it.
        assert await first.turns.take_interrupted() == []
        assert in_flight_rows(path) == [(SLACK, "m1"), (DISCORD, "m3")]
    # `first` closed without ending m1 and m3: what kill -9 leaves behind.

    async with await Store.open(path) as second:
        await second.turns.begin(SLACK_2, "m4")  # a turn of this new process
        taken = await second.turns.take_interrupted(lambda thread: thread.platform == "slack")
        assert [(t.thread, t.message_id) for t in taken] == [(SLACK, "m1")]
        assert isinstance(taken[0], InterruptedTurn) and taken[0].started_at <= time.time()
        # Taken once: not again, whatever the filter; the Discord one waits for its platform.
        assert await second.turns.take_interrupted(lambda thread: thread.platform == "slack") == []
        assert in_flight_rows(path) == [(DISCORD, "m3"), (SLACK_2, "m4")]

    async with await Store.open(path) as third:
        taken = await third.turns.take_interrupted()
        assert sorted((str(t.thread), t.message_id) for t in taken) == [(str(DISCORD), "m3"), (str(SLACK_2), "m4")]
        assert await third.turns.take_interrupted() == []
    assert in_flight_rows(path) == []


async def test_two_starts_racing_take_each_turn_once(store_target: Path | str) -> None:
    path = store_target  # PostgreSQL too: a process that signed off is gone at once
    async with await Store.open(path) as old:
        for i in range(50):
            await old.turns.begin(ThreadKey("slack", "T1", f"C{i}", "1.0"), f"m{i}")
    async with await Store.open(path) as a, await Store.open(path) as b:
        got_a, got_b = await asyncio.gather(a.turns.take_interrupted(), b.turns.take_interrupted())
    ids = [t.message_id for t in got_a + got_b]
    assert sorted(ids) == sorted(f"m{i}" for i in range(50))  # every one, none twice


async def test_a_failing_filter_takes_nothing(store_target: Path | str) -> None:
    path = store_target
    async with await Store.open(path) as old:
        await old.turns.begin(SLACK, "m1")

    def broken(thread: ThreadKey) -> bool:
        raise RuntimeError("boom")

    async with await Store.open(path) as store:
        with pytest.raises(RuntimeError):
            await store.turns.take_interrupted(broken)
        assert [t.message_id for t in await store.turns.take_interrupted()] == ["m1"]


async def test_week_old_leftovers_are_dropped_unreported(tmp_path: Path) -> None:
    path = tmp_path / "tb.db"
    async with await Store.open(path) as old:
        await old.turns.begin(SLACK, "old")
        await old.turns.begin(DISCORD, "recent")
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE turns_in_flight SET started_at = ? WHERE message_id = 'old'", (time.time() - 8 * 86400,))
    raw.close()
    async with await Store.open(path) as store:
        assert await store.turns.take_interrupted(lambda thread: False) == []
        assert in_flight_rows(path) == [(DISCORD, "recent")]
