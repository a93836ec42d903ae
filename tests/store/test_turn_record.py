"""A turn's record on both backends: its end (messages, notice, usage) is one transaction,
and a thread once found is known without another trip to the database."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Connection

from bot.database import Operation
from bot.events import ThreadKey
from bot.record import TurnRecords
from bot.store import Store
from bot.transcript import MessageEntry

KEY = ThreadKey.parse("slack:T1:C1:1700000000.000100")
ANSWERED = [{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": "42"}]


async def test_a_turn_ends_with_its_messages_notice_and_usage_written_together(store_target: Path | str) -> None:
    async with await Store.open(store_target) as store:
        records = TurnRecords(store.transcripts, store.usage, store.write_all)
        record = await records.open(KEY, model="m", user_id="U1", at=100.0)
        await record.close(
            ANSWERED, notice="Stopped.", user_id="U1", prompt_tokens=7, completion_tokens=2, kernel_s=0.5
        )
        assert await store.transcripts.history(KEY) == ANSWERED  # the notice is kept, never replayed
        timeline = await store.transcripts.timeline(KEY)
        assert [e.message["role"] for e in timeline if isinstance(e, MessageEntry)] == ["user", "assistant", "notice"]
        assert len(timeline) == 3  # messages only: no cell ran
        assert await store.usage.thread_tokens(KEY) == (7, 2)

        failed = await records.open(KEY, model="m", user_id="U1", at=101.0)
        await failed.close(
            [], notice="The model did not answer.", user_id="U1", prompt_tokens=3, completion_tokens=0, kernel_s=0
        )
        assert (
            len(await store.transcripts.timeline(KEY)) == 3
        )  # a failed request leaves no message, not even its notice
        assert await store.usage.thread_tokens(KEY) == (10, 2)


async def test_a_failing_part_of_the_end_writes_none_of_it(store_target: Path | str) -> None:
    async with await Store.open(store_target) as store:

        def broken(conn: Connection) -> None:
            raise RuntimeError("the disk is full")

        async def write_then_fail(*operations: Operation) -> None:
            await store.write_all(*operations, broken)  # the store's own transaction, failing at its end

        record = await TurnRecords(store.transcripts, store.usage, write_then_fail).open(
            KEY, model="m", user_id="U1", at=1.0
        )
        with pytest.raises(RuntimeError):
            await record.close(ANSWERED, notice=None, user_id="U1", prompt_tokens=5, completion_tokens=5, kernel_s=0)
        assert await store.transcripts.history(KEY) == []
        assert await store.usage.thread_tokens(KEY) == (0, 0)


async def test_a_thread_found_once_is_known_after(store_target: Path | str) -> None:
    store = await Store.open(store_target)
    assert not await store.threads.exists(KEY)  # not remembered while missing
    await store.threads.touch(KEY)
    assert await store.threads.exists(KEY)
    await store.close()  # no database to ask now: the known thread is still found
    assert await store.threads.exists(KEY)
