"""A thread's transcript: its OpenAI-format messages (what survives a restart and is replayed to
the model) and its executed cells (what ``export`` rebuilds as a notebook), interleaved by the
thread's one ``seq`` counter."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bot.database import Database, Operation
from bot.events import ThreadKey
from bot.schema import cells, messages, threads
from bot.store.threads import take_counter
from bot.transcript import CellEntry, MessageEntry, NewCell, TimelineEntry

#: The ``role`` of stored notices: shown in the timeline, never replayed to the model.
NOTICE_ROLE = "notice"


class Transcripts:
    """Messages and cells, per thread."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def add_messages(
        self, key: ThreadKey, messages_: Sequence[dict[str, Any]], *, user_id: str | None = None
    ) -> None:
        """Append OpenAI-format messages (in order, in one transaction)."""
        if messages_:
            await self._db.write(self.adding_messages(key, messages_, user_id=user_id))

    def adding_messages(
        self, key: ThreadKey, messages_: Sequence[dict[str, Any]], *, user_id: str | None = None
    ) -> Operation:
        """:meth:`add_messages` as an operation, to write in one transaction with others."""
        now = time.time()
        rows = [
            {"role": str(m.get("role", "")), "content": json.dumps(m), "user_id": user_id, "created_at": now}
            for m in messages_
        ]

        def write(conn: Connection) -> None:
            if not rows:
                return
            first = self._reserve_seq(conn, key, len(rows), now)
            conn.execute(sa.insert(messages), [{**row, "thread": key, "seq": first + i} for i, row in enumerate(rows)])

        return write

    async def history(self, key: ThreadKey) -> list[dict[str, Any]]:
        """The thread's OpenAI-format messages, oldest first (notices left out)."""
        # Decoded in the store's thread too: a long thread's history is most of a turn's JSON.
        return await self._db.read(
            lambda conn: [json.loads(content) for content in conn.execute(_HISTORY, {"b_thread": key}).scalars()]
        )

    async def add_cell(self, key: ThreadKey, cell: NewCell) -> None:
        """Record an executed cell (its outputs already nbformat v4)."""
        now = time.time()
        row = {
            "thread": key,
            "code": cell.code,
            "outputs": json.dumps(cell.outputs),
            "execution_count": cell.execution_count,
            "outcome": cell.outcome,
            "duration_s": cell.duration_s,
            "created_at": now,
        }

        def write(conn: Connection) -> None:
            conn.execute(sa.insert(cells), {**row, "seq": self._reserve_seq(conn, key, 1, now)})

        await self._db.write(write)

    async def cell_count(self, key: ThreadKey) -> int:
        """How many cells the thread has executed."""
        statement = sa.select(sa.func.count()).select_from(cells).where(cells.c.thread == key)
        count: int | None = await self._db.read(lambda conn: conn.scalar(statement))
        return int(count or 0)

    async def timeline(self, key: ThreadKey) -> list[TimelineEntry]:
        """Messages and cells of the thread interleaved in the order they were written."""

        def read(conn: Connection) -> list[TimelineEntry]:
            entries: list[TimelineEntry] = [
                MessageEntry(seq, json.loads(content), user_id, created)
                for seq, content, user_id, created in conn.execute(
                    sa.select(messages.c.seq, messages.c.content, messages.c.user_id, messages.c.created_at).where(
                        messages.c.thread == key
                    )
                )
            ]
            entries += [
                CellEntry(seq, code, json.loads(outputs), count, outcome, duration, created)
                for seq, code, outputs, count, outcome, duration, created in conn.execute(
                    sa.select(
                        cells.c.seq,
                        cells.c.code,
                        cells.c.outputs,
                        cells.c.execution_count,
                        cells.c.outcome,
                        cells.c.duration_s,
                        cells.c.created_at,
                    ).where(cells.c.thread == key)
                )
            ]
            return entries

        return sorted(await self._db.read(read), key=lambda entry: entry.seq)

    def _reserve_seq(self, conn: Connection, key: ThreadKey, count: int, now: float) -> int:
        """Take ``count`` consecutive seq numbers of the thread (creating it); returns the first."""
        return take_counter(self._db, conn, key, threads.c.last_seq, count, now) - count + 1


#: A thread's (``b_thread``) messages for the model, oldest first: built once, every turn reads it.
_HISTORY = (
    sa.select(messages.c.content)
    .where(messages.c.thread == sa.bindparam("b_thread", type_=messages.c.thread.type), messages.c.role != NOTICE_ROLE)
    .order_by(messages.c.seq)
)
