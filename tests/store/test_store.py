"""The store on SQLite and on PostgreSQL: round trip, restart, schema version, dedupe, concurrency, order."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from bot.events import ThreadKey
from bot.store import SCHEMA_VERSION, Store, StoreError
from bot.transcript import CellEntry, MessageEntry, NewCell
from kernels.seam.result import ErrorInfo, ExecutionResult, Outcome, StreamChunk

KEY = ThreadKey.parse("slack:T1:C1:1700000000.000100")
OTHER = ThreadKey.parse("discord:G1:C2:99")


def _tool_call(call_id: str, code: str) -> dict[str, object]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "python", "arguments": f'{{"code": "{code}"}}'},
    }


CONVERSATION = [
    {"role": "user", "content": "what is 6*7?"},
    {"role": "assistant", "content": None, "tool_calls": [_tool_call("call_1", "6*7")]},
    {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    {"role": "assistant", "content": "It is **42**."},
]


async def test_round_trip_survives_restart(store_target: Path | str) -> None:
    async with await Store.open(store_target) as store:
        assert not await store.threads.exists(KEY)
        await store.threads.touch(KEY)
        await store.transcripts.add_messages(KEY, CONVERSATION[:1], user_id="U1")
        await store.transcripts.add_messages(KEY, CONVERSATION[1:])
        await store.transcripts.add_cell(
            KEY, NewCell.of("6*7", ExecutionResult(result="42", execution_count=1, duration_s=0.01))
        )
        for prompt, completion in ((100, 20), (50, 5)):
            row = await store.usage.begin(KEY, model="gpt-test", user_id="U1")
            await store.usage.add(row, prompt_tokens=prompt, completion_tokens=completion, kernel_s=0.5)

    async with await Store.open(store_target) as store:
        assert await store.schema_version() == SCHEMA_VERSION
        assert await store.threads.exists(KEY)
        assert not await store.threads.exists(OTHER)
        assert await store.transcripts.history(KEY) == CONVERSATION
        assert await store.transcripts.history(OTHER) == []
        assert await store.transcripts.cell_count(KEY) == 1
        assert await store.usage.thread_tokens(KEY) == (150, 25)
        assert await store.usage.thread_tokens(OTHER) == (0, 0)
        assert [e.user_id for e in await store.transcripts.timeline(KEY) if isinstance(e, MessageEntry)] == [
            "U1",
            None,
            None,
            None,
        ]


async def test_sqlite_file_settings(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "threadbook.db"
    async with await Store.open(path) as store:
        await store.threads.touch(KEY)
    assert path.exists()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("SELECT version_num FROM alembic_version").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute("SELECT channel_key FROM threads WHERE key = ?", (str(KEY),)).fetchone()[0] == "slack:C1"


async def test_writing_creates_the_thread_with_its_channel(store_target: Path | str) -> None:
    async with await Store.open(store_target) as store:
        await store.transcripts.add_messages(OTHER, [{"role": "user", "content": "hi"}])
        assert await store.threads.exists(OTHER)
        await store.turns.begin(OTHER, "m1")  # the channel comes from the key, as it did when written
        assert await store.kernel_owners.claim(OTHER) is None


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    await (await Store.open(path)).close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    raw.close()
    with pytest.raises(StoreError, match="does not know"):
        await Store.open(path)


async def test_newer_pre_alembic_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE threads (key TEXT PRIMARY KEY)")
        raw.execute("PRAGMA user_version = 4")
    raw.close()
    with pytest.raises(StoreError, match="newer"):
        await Store.open(path)


async def test_claim_message_dedupes_across_restart_and_forgets_old_ids(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    async with await Store.open(path) as store:
        assert await store.processed.claim("C1:1700.1") is True
        assert await store.processed.claim("C1:1700.1") is False
        assert await store.processed.claim("C1:1700.2") is True
        claims = await asyncio.gather(*(store.processed.claim("C1:1700.3") for _ in range(5)))
        assert sorted(claims) == [False, False, False, False, True]
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE processed SET at = ? WHERE message_id = 'C1:1700.2'", (time.time() - 8 * 24 * 3600,))
    async with await Store.open(path) as store:
        assert await store.processed.claim("C1:1700.1") is False  # still remembered after restart
        assert await store.processed.claim("C1:1700.2") is True  # older than a week: pruned at open


async def test_concurrent_writes_from_two_threads(store_target: Path | str) -> None:
    rounds = 40

    async def converse(store: Store, key: ThreadKey) -> None:
        for i in range(rounds):
            await store.transcripts.add_messages(
                key, [{"role": "user", "content": f"{key} q{i}"}, {"role": "assistant", "content": f"{key} a{i}"}]
            )
            await store.transcripts.add_cell(
                key, NewCell.of(f"print({i})", ExecutionResult(streams=[StreamChunk("stdout", f"{i}\n")]))
            )
            await store.usage.add(
                await store.usage.begin(key, model="m", user_id="U1"), prompt_tokens=1, completion_tokens=2
            )

    async with await Store.open(store_target) as store:
        await asyncio.gather(converse(store, KEY), converse(store, OTHER))
        for key in (KEY, OTHER):
            timeline = await store.transcripts.timeline(key)
            assert [entry.seq for entry in timeline] == list(range(1, 3 * rounds + 1))
            texts = [m["content"] for m in await store.transcripts.history(key)]
            assert texts == [f"{key} {kind}{i}" for i in range(rounds) for kind in ("q", "a")]
            assert await store.transcripts.cell_count(key) == rounds
            assert await store.usage.thread_tokens(key) == (rounds, 2 * rounds)


async def test_concurrent_batches_in_one_thread_stay_contiguous(store_target: Path | str) -> None:
    async with await Store.open(store_target) as store:
        batches = [[{"role": "user", "content": f"{b}-{i}"} for i in range(3)] for b in range(20)]
        await asyncio.gather(*(store.transcripts.add_messages(KEY, batch) for batch in batches))
        texts = [m["content"] for m in await store.transcripts.history(KEY)]
    assert len(texts) == 60
    for start in range(0, 60, 3):
        batch, _ = texts[start].split("-")
        assert texts[start : start + 3] == [f"{batch}-{i}" for i in range(3)]


async def test_timeline_interleaves_messages_and_cells_in_order(store_target: Path | str) -> None:
    failing = ExecutionResult(
        outcome=Outcome.ERROR,
        error=ErrorInfo("NameError", "name 'x' is not defined", "Traceback...\nNameError: name 'x' is not defined"),
        execution_count=3,
        duration_s=0.5,
    )
    async with await Store.open(store_target) as store:
        await store.transcripts.add_messages(KEY, CONVERSATION[:2], user_id="U1")
        await store.transcripts.add_cell(KEY, NewCell.of("x", failing))
        await store.transcripts.add_messages(KEY, CONVERSATION[2:])
        timeline = await store.transcripts.timeline(KEY)

    assert [type(entry) for entry in timeline] == [MessageEntry, MessageEntry, CellEntry, MessageEntry, MessageEntry]
    assert [entry.seq for entry in timeline] == [1, 2, 3, 4, 5]
    first, cell = timeline[0], timeline[2]
    assert isinstance(first, MessageEntry) and first.user_id == "U1" and first.role == "user"
    assert isinstance(cell, CellEntry)
    assert (cell.code, cell.outcome, cell.execution_count, cell.duration_s) == ("x", "error", 3, 0.5)
    assert cell.outputs == [
        {
            "output_type": "error",
            "ename": "NameError",
            "evalue": "name 'x' is not defined",
            "traceback": ["Traceback...", "NameError: name 'x' is not defined"],
        }
    ]


async def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    with pytest.raises(StoreError) as caught:
        await Store.open("postgresql://bot:pw-secret-4711@127.0.0.1:1/threadbook")
    message = str(caught.value)
    assert message.startswith("cannot open the store postgresql://bot:***@127.0.0.1:1/threadbook: ")
    assert "pw-secret-4711" not in message and "\n" not in message
