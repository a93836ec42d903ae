"""Notices: stored in the timeline, never in the history; schema 3 repairs threads stored before."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from bot.events import ThreadKey
from bot.migrations.legacy import MIGRATIONS as _MIGRATIONS
from bot.store import NOTICE_ROLE, SCHEMA_VERSION, Store

KEY = ThreadKey.parse("slack:T1:C1:1700000000.000100")
CALL = {"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "1"}'}}
#: A thread as schema 2 stored it after a failed model request: the error sentence as the model's words.
V2_THREAD = [
    {"role": "user", "content": "sum it"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "1"},
    {"role": "assistant", "content": "The language model had a server error (HTTP 500); please try again."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "The language model refused the request (HTTP 400: bad)."},
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": "_Stopped on request after 1 code run._"},
    {"role": "user", "content": "more"},
    {
        "role": "assistant",
        "content": "_Stopped after 8 code runs, the limit for one message. Reply “continue” to let me go on._",
    },
    {"role": "user", "content": "what is the language model?"},
    {"role": "assistant", "content": "The language model is a program; it has no state."},
]


def make_v2_database(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as raw:
        for statements in _MIGRATIONS[:2]:
            for statement in statements:
                raw.execute(statement)
        raw.execute("PRAGMA user_version = 2")
        raw.execute(
            "INSERT INTO threads (key, channel_key, created_at, last_active_at, last_seq) VALUES (?, ?, 1, 1, ?)",
            (str(KEY), "slack:C1", len(V2_THREAD)),
        )
        raw.executemany(
            "INSERT INTO messages (thread, seq, role, content, user_id, created_at) VALUES (?, ?, ?, ?, NULL, 1)",
            [(str(KEY), seq, m["role"], json.dumps(m)) for seq, m in enumerate(V2_THREAD, start=1)],
        )
    raw.close()


async def test_notices_are_in_the_timeline_not_the_history(store_target: Path | str) -> None:
    async with await Store.open(store_target) as store:
        await store.transcripts.add_messages(
            KEY, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        )
        await store.transcripts.add_messages(
            KEY, [{"role": NOTICE_ROLE, "content": "_(answer cut off at the length limit)_"}]
        )
        assert await store.transcripts.history(KEY) == [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
        ]
        timeline = await store.transcripts.timeline(KEY)
        assert [e.message["role"] for e in timeline] == ["user", "assistant", "notice"]  # type: ignore[union-attr]


async def test_schema_3_turns_stored_notices_into_notices_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    make_v2_database(path)
    async with await Store.open(path) as store:
        assert await store.schema_version() == SCHEMA_VERSION
        history = await store.transcripts.history(KEY)
        assert [m["content"] for m in history if m["role"] == "assistant" and not m.get("tool_calls")] == [
            "The language model is a program; it has no state."
        ]
        assert len(history) == len(V2_THREAD) - 4
        assert len(await store.transcripts.timeline(KEY)) == len(V2_THREAD)  # nothing deleted
