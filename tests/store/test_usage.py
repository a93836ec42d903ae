"""Usage per turn in the store, on both backends: spent per person, channel and thread since a
time, reports grouped per channel and person, start times for the per-minute budget, and the
migration that fills the channel of rows from before."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlalchemy as sa

from bot.events import ThreadKey
from bot.store import SCHEMA_VERSION, Store, UsageRow

A = ThreadKey.parse("slack:T1:C1:1.1")
B = ThreadKey.parse("slack:T1:C1:2.2")
C = ThreadKey.parse("discord:G1:C9:7")


async def test_spent_and_reports(store_target: Path | str) -> None:
    async with await Store.open(store_target) as store:
        for key, user, model, at, tokens, kernel_s in (
            (A, "U1", "m1", 100.0, (10, 1), 0.5),
            (A, "U2", "m1", 200.0, (20, 2), 1.0),
            (B, "U1", "m2", 300.0, (30, 3), 0.0),
            (C, "U1", "m1", 400.0, (40, 4), 2.0),
        ):
            row = await store.usage.begin(key, model=model, user_id=user, at=at)
            await store.usage.add(row, prompt_tokens=tokens[0], completion_tokens=tokens[1], kernel_s=kernel_s)
        mine = sorted(await store.usage.spent(since=0, user_id="U1"), key=lambda r: r.model)
        assert mine == [UsageRow("", "m1", 50, 5, 2.5, 2), UsageRow("", "m2", 30, 3, 0.0, 1)]
        assert await store.usage.spent(since=250, channel_key="slack:C1") == [UsageRow("", "m2", 30, 3, 0.0, 1)]
        assert await store.usage.spent(since=0, thread=C) == [UsageRow("", "m1", 40, 4, 2.0, 1)]
        by_channel = {(r.group, r.model): r.tokens for r in await store.usage.report(since=0, by="channel_key")}
        assert by_channel == {("slack:C1", "m1"): 33, ("slack:C1", "m2"): 33, ("discord:C9", "m1"): 44}
        by_user = {(r.group, r.model): r.turns for r in await store.usage.report(since=150, by="user_id")}
        assert by_user == {("U2", "m1"): 1, ("U1", "m2"): 1, ("U1", "m1"): 1}
        assert sorted(await store.usage.turn_times(user_id="U1", since=250)) == [300.0, 400.0]
        assert await store.usage.thread_tokens(A) == (30, 3)


async def test_rows_from_before_get_their_channel(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with await Store.open(path) as store:
        pass
    with sqlite3.connect(path) as raw:  # back to revision 0003 with one old row
        raw.execute("DROP TABLE greetings")  # 0006
        raw.execute("ALTER TABLE threads DROP COLUMN viewed_channel")
        raw.execute("DROP TABLE schedules")
        raw.execute("DROP INDEX usage_user_at")
        raw.execute("DROP INDEX usage_channel_at")
        raw.execute("DROP INDEX usage_at")
        for column in ("kernel_s", "channel_key", "user_id"):
            raw.execute(f"ALTER TABLE usage DROP COLUMN {column}")
        raw.execute("UPDATE alembic_version SET version_num = '0003'")
        raw.execute(
            "INSERT INTO usage (thread, model, prompt_tokens, completion_tokens, at) VALUES (?, 'm', 5, 6, 1.0)",
            (str(A),),
        )
    raw.close()
    async with await Store.open(path) as store:
        assert await store.usage.spent(since=0, channel_key="slack:C1") == [UsageRow("", "m", 5, 6, 0.0, 1)]
        assert await store.schema_version() == SCHEMA_VERSION
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT user_id FROM usage")).scalar() is None
    engine.dispose()
