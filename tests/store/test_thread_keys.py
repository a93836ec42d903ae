"""Thread keys in the store: every column that holds one stores a ThreadKey through one type
(TEXT in the database); only a ThreadKey is written, and a stored text that is no key is
dropped, with one log line, by the reads that name no thread (interrupted turns, due schedules)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import StatementError

from bot.database import database_url, open_database
from bot.events import ThreadKey
from bot.schema import ThreadKeyText, metadata
from bot.store import NewSchedule, Store
from bot.store.schedules import UNREADABLE_THREAD

KEY = ThreadKey("slack", "T1", "C1", "1700000000.000100")

#: Every column that holds a thread key.
KEY_COLUMNS = {
    "threads.key",
    "messages.thread",
    "cells.thread",
    "usage.thread",
    "turns_in_flight.thread",
    "feedback.thread",
    "schedules.thread",
}


def test_every_thread_key_column_has_the_key_type_and_stays_text() -> None:
    typed = {
        f"{t.name}.{c.name}" for t in metadata.tables.values() for c in t.columns if isinstance(c.type, ThreadKeyText)
    }
    assert typed == KEY_COLUMNS
    assert isinstance(ThreadKeyText().impl, sa.Text)  # the same TEXT column: no migration


async def test_only_a_thread_key_is_written(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "t.db") as store:
        with pytest.raises(StatementError, match="takes a ThreadKey, not str"):
            await store.usage.spent(since=0.0, thread=str(KEY))  # type: ignore[arg-type]
        await store.feedback.add(KEY, "m1", "U1", good=True)
        assert (await store.feedback.counts(KEY)).good == 1


def _schedule(thread: ThreadKey, at: float) -> NewSchedule:
    return NewSchedule(
        thread=thread,
        creator="U1",
        creator_name="u1",
        question="q",
        cron="0 * * * *",
        timezone="UTC",
        described="every hour",
        created_at=at,
        next_run_at=at,
    )


async def test_rows_whose_key_does_not_read_are_dropped_with_one_line(
    store_target: Path | str, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time()
    async with await Store.open(store_target) as store:
        good = await store.schedules.add(_schedule(KEY, now - 60), max_per_thread=5)
        db = await open_database(database_url(store_target))
        try:
            await db.write(
                lambda conn: (
                    conn.execute(
                        sa.text(
                            "INSERT INTO schedules (thread, number, creator, creator_name, question, cron, timezone,"
                            " described, created_at, next_run_at) VALUES ('not a key', 1, 'U1', 'u1', 'q',"
                            " '0 * * * *', 'UTC', 'every hour', :at, :at)"
                        ),
                        {"at": now - 120},
                    ),
                    conn.execute(
                        sa.text(
                            "INSERT INTO turns_in_flight (thread, message_id, run, started_at)"
                            " VALUES ('not a key', 'm5', 'gone', :at)"
                        ),
                        {"at": now},
                    ),
                )
            )
            with caplog.at_level(logging.WARNING):
                assert [s.id for s in await store.schedules.due(now)] == [good.id]
                assert [s.id for s in await store.schedules.due(now)] == [good.id]
                assert await store.turns.take_interrupted() == []
            lines = [r.getMessage() for r in caplog.records]
            assert [line for line in lines if UNREADABLE_THREAD in line] == [
                f"schedule #1 (id {good.id + 1}) disabled: {UNREADABLE_THREAD}"
            ]
            assert lines.count("dropped an interrupted turn with a bad thread key 'not a key'") == 1
            left = await db.read(lambda conn: conn.execute(sa.text("SELECT count(*) FROM turns_in_flight")).scalar())
            assert left == 0
        finally:
            await db.close()
