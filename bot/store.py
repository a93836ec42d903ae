"""The thread store: SQLite through aiosqlite.

It keeps what a thread needs to survive a bot restart (its OpenAI-format message
history), what ``export`` needs to rebuild it as a notebook (executed cells with their
nbformat outputs, interleaved with the messages by one per-thread ``seq`` counter), the
platform message ids already handled (dedupe of retries), token usage, and the turns
in flight (so that a start after ``kill -9`` can tell those threads their message was lost).

One connection serves every caller. An :class:`asyncio.Lock` around each operation keeps
the statements of one operation together in one transaction even when several threads
write at once (aiosqlite runs all statements of a connection on one worker thread, but
tasks awaiting it would otherwise interleave inside each other's transactions).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiosqlite

from bot.events import ThreadKey
from bot.notebook import CellEntry, MessageEntry, TimelineEntry, result_to_outputs
from kernels.result import ExecutionResult

__all__ = ["SCHEMA_VERSION", "CellEntry", "InterruptedTurn", "MessageEntry", "Store", "StoreError", "TimelineEntry"]

#: Each migration is a list of statements; migration ``i`` brings the schema to version ``i + 1``.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE threads (
            key TEXT PRIMARY KEY,
            channel_key TEXT NOT NULL,
            created_at REAL NOT NULL,
            last_active_at REAL NOT NULL,
            last_seq INTEGER NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            thread TEXT NOT NULL REFERENCES threads(key) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            user_id TEXT,
            created_at REAL NOT NULL,
            UNIQUE (thread, seq)
        )""",
        """CREATE TABLE cells (
            id INTEGER PRIMARY KEY,
            thread TEXT NOT NULL REFERENCES threads(key) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            code TEXT NOT NULL,
            outputs TEXT NOT NULL,
            execution_count INTEGER,
            outcome TEXT NOT NULL,
            duration_s REAL NOT NULL,
            created_at REAL NOT NULL,
            UNIQUE (thread, seq)
        )""",
        """CREATE TABLE processed (
            message_id TEXT PRIMARY KEY,
            at REAL NOT NULL
        )""",
        "CREATE INDEX processed_at ON processed (at)",
        """CREATE TABLE usage (
            id INTEGER PRIMARY KEY,
            thread TEXT NOT NULL,
            model TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            at REAL NOT NULL
        )""",
        "CREATE INDEX usage_thread ON usage (thread)",
    ),
    (
        # Turns running now, so that a start after an unclean stop can tell their threads.
        # ``run`` names the Store instance (one bot process) that began the turn.
        """CREATE TABLE turns_in_flight (
            thread TEXT NOT NULL,
            message_id TEXT NOT NULL,
            run TEXT NOT NULL,
            started_at REAL NOT NULL,
            PRIMARY KEY (thread, message_id)
        )""",
    ),
    (
        # Our own notices (LLM error sentences, stop and limit notes) were stored as assistant
        # messages and replayed as the model's words; they become ``notice`` rows, which
        # ``history()`` never returns. A note appended to a model's summary stays with it.
        """UPDATE messages SET role = 'notice', content = json_set(content, '$.role', 'notice')
        WHERE role = 'assistant' AND json_extract(content, '$.tool_calls') IS NULL AND (
            (json_extract(content, '$.content') LIKE 'The language model %' AND (
                json_extract(content, '$.content') LIKE '%please try again.'
                OR json_extract(content, '$.content') LIKE '%please try again later.'
                OR json_extract(content, '$.content') LIKE '%please try again in a minute.'
                OR json_extract(content, '$.content') LIKE '%should check llm.%'
                OR json_extract(content, '$.content') LIKE 'The language model refused the request (HTTP %).'))
            OR json_extract(content, '$.content') LIKE 'The Python kernel for this thread failed: %'
            OR json_extract(content, '$.content') LIKE '!_Stopped on request after %' ESCAPE '!'
            OR json_extract(content, '$.content') LIKE '!_Stopped after %, the limit for one message.%' ESCAPE '!'
            OR json_extract(content, '$.content') = '_(The model gave an empty answer.)_'
        )""",
    ),
)

#: The ``role`` of stored notices: shown in the timeline, never replayed to the model.
NOTICE_ROLE = "notice"

#: The schema version this code writes.
SCHEMA_VERSION = len(_MIGRATIONS)

#: Processed message ids older than this are forgotten (platforms retry within minutes).
_DEDUPE_KEEP_S = 7 * 24 * 3600.0
#: Prune the processed ids once every this many claims (and at open).
_PRUNE_EVERY = 1000
#: An interrupted turn nobody could be told about within this long is dropped: a notice
#: that late would only confuse (its platform was off, or a console thread never resumed).
_INTERRUPTED_KEEP_S = 7 * 24 * 3600.0


class StoreError(Exception):
    """The database cannot be used by this version of the bot."""


@dataclass(frozen=True, slots=True)
class InterruptedTurn:
    """A turn an earlier bot process began and never ended (it was killed or crashed)."""

    thread: str
    message_id: str
    started_at: float


class Store:
    """Async SQLite store; open with :meth:`open` (or ``async with await Store.open(p)``)."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db
        self._lock = asyncio.Lock()
        self._claims = 0
        #: Marks the turns this instance begins: they are live, never "interrupted" for it.
        self._run = uuid.uuid4().hex

    @classmethod
    async def open(cls, path: Path | str) -> Store:
        """Open (creating it and its parent folders if needed) and migrate the database."""
        path = Path(path)
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; every write opens its own.
        db = await aiosqlite.connect(path, isolation_level=None)
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=NORMAL")
            await db.execute("PRAGMA foreign_keys=ON")
            await db.execute("PRAGMA busy_timeout=5000")
            store = cls(db)
            await store._migrate()
            await store._prune_processed()
        except BaseException:
            await db.close()
            raise
        return store

    async def close(self) -> None:
        """Close the connection (waits for a running operation to finish)."""
        async with self._lock:
            await self._db.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def schema_version(self) -> int:
        """The schema version of the open database."""
        async with self._lock:
            return await self._user_version()

    async def claim_message(self, message_id: str) -> bool:
        """Record a platform message id; True the first time, False for a duplicate."""
        now = time.time()
        async with self._transaction():
            cursor = await self._db.execute(
                "INSERT OR IGNORE INTO processed (message_id, at) VALUES (?, ?)", (message_id, now)
            )
            claimed = cursor.rowcount == 1
        self._claims += 1
        if self._claims % _PRUNE_EVERY == 0:
            await self._prune_processed()
        return claimed

    async def touch_thread(self, key: str, channel_key: str) -> None:
        """Create the thread if new and mark it active now."""
        async with self._transaction():
            await self._upsert_thread(key, channel_key, time.time())

    async def thread_exists(self, key: str) -> bool:
        """True when the thread has been seen before (touched or written to)."""
        async with self._lock:
            async with self._db.execute("SELECT 1 FROM threads WHERE key = ?", (key,)) as cursor:
                return await cursor.fetchone() is not None

    async def add_messages(self, key: str, messages: Sequence[dict[str, Any]], *, user_id: str | None = None) -> None:
        """Append OpenAI-format messages (in order, in one transaction)."""
        if not messages:
            return
        now = time.time()
        async with self._transaction():
            first = await self._reserve_seq(key, len(messages), now)
            await self._db.executemany(
                "INSERT INTO messages (thread, seq, role, content, user_id, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (key, first + i, str(message.get("role", "")), json.dumps(message), user_id, now)
                    for i, message in enumerate(messages)
                ],
            )

    async def history(self, key: str) -> list[dict[str, Any]]:
        """The thread's OpenAI-format messages, oldest first (notices left out)."""
        async with self._lock:
            async with self._db.execute(
                "SELECT content FROM messages WHERE thread = ? AND role != ? ORDER BY seq", (key, NOTICE_ROLE)
            ) as cursor:
                rows = await cursor.fetchall()  # one hop to the database thread, not one per batch
        return [json.loads(row[0]) for row in rows]

    async def add_cell(self, key: str, code: str, result: ExecutionResult) -> None:
        """Record an executed cell with its outputs converted to nbformat v4."""
        outputs = json.dumps(result_to_outputs(result))
        now = time.time()
        async with self._transaction():
            seq = await self._reserve_seq(key, 1, now)
            await self._db.execute(
                "INSERT INTO cells (thread, seq, code, outputs, execution_count, outcome, duration_s, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key, seq, code, outputs, result.execution_count, result.outcome.value, result.duration_s, now),
            )

    async def cell_count(self, key: str) -> int:
        """How many cells the thread has executed."""
        async with self._lock:
            async with self._db.execute("SELECT COUNT(*) FROM cells WHERE thread = ?", (key,)) as cursor:
                row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def add_usage(self, key: str, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Record the tokens one LLM call used."""
        async with self._transaction():
            await self._db.execute(
                "INSERT INTO usage (thread, model, prompt_tokens, completion_tokens, at) VALUES (?, ?, ?, ?, ?)",
                (key, model, prompt_tokens, completion_tokens, time.time()),
            )

    async def usage(self, key: str) -> tuple[int, int]:
        """Total (prompt, completion) tokens used by the thread."""
        async with self._lock:
            async with self._db.execute(
                "SELECT COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0)"
                " FROM usage WHERE thread = ?",
                (key,),
            ) as cursor:
                row = await cursor.fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    async def timeline(self, key: str) -> list[TimelineEntry]:
        """Messages and cells of the thread interleaved in the order they were written."""
        async with self._lock:
            async with self._db.execute(
                "SELECT seq, 'm', content, user_id, NULL, NULL, NULL, NULL, created_at FROM messages WHERE thread = ?"
                " UNION ALL"
                " SELECT seq, 'c', code, NULL, outputs, execution_count, outcome, duration_s, created_at"
                " FROM cells WHERE thread = ? ORDER BY 1",
                (key, key),
            ) as cursor:
                rows = await cursor.fetchall()
        entries: list[TimelineEntry] = []
        for seq, kind, text, user_id, outputs, count, outcome, duration, created in rows:
            if kind == "m":
                entries.append(MessageEntry(seq, json.loads(text), user_id, created))
            else:
                entries.append(CellEntry(seq, text, json.loads(outputs), count, outcome, duration, created))
        return entries

    async def begin_turn(self, key: str, message_id: str) -> None:
        """Mark the turn for ``message_id`` in thread ``key`` as running (until :meth:`end_turn`)."""
        async with self._transaction():
            await self._db.execute(
                "INSERT OR REPLACE INTO turns_in_flight (thread, message_id, run, started_at) VALUES (?, ?, ?, ?)",
                (key, message_id, self._run, time.time()),
            )

    async def end_turn(self, key: str, message_id: str) -> None:
        """Clear the mark of :meth:`begin_turn` (the turn ended, or its thread was told it did not)."""
        async with self._transaction():
            await self._db.execute(
                "DELETE FROM turns_in_flight WHERE thread = ? AND message_id = ?", (key, message_id)
            )

    async def take_interrupted_turns(self, reachable: Callable[[str], bool] | None = None) -> list[InterruptedTurn]:
        """Remove and return the turns earlier bot processes began and never ended, oldest first.

        Only turns whose thread key ``reachable`` accepts are taken (all when it is None); the
        rest stay for a later start, e.g. when their platform is not enabled now. Turns begun
        through this instance are running and never taken. Leftovers older than seven days are
        dropped unreported. Selecting and deleting happen in one transaction, so each turn is
        returned once, even to two starts racing on one database.
        """
        now = time.time()
        async with self._transaction():
            await self._db.execute(
                "DELETE FROM turns_in_flight WHERE run != ? AND started_at < ?", (self._run, now - _INTERRUPTED_KEEP_S)
            )
            async with self._db.execute(
                "SELECT thread, message_id, started_at FROM turns_in_flight WHERE run != ? ORDER BY started_at",
                (self._run,),
            ) as cursor:
                rows = await cursor.fetchall()
            taken = [
                InterruptedTurn(str(thread), str(message_id), float(started))
                for thread, message_id, started in rows
                if reachable is None or reachable(str(thread))
            ]
            await self._db.executemany(
                "DELETE FROM turns_in_flight WHERE thread = ? AND message_id = ?",
                [(turn.thread, turn.message_id) for turn in taken],
            )
        return taken

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        async with self._lock:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise
            await self._db.execute("COMMIT")

    async def _upsert_thread(self, key: str, channel_key: str, now: float) -> None:
        await self._db.execute(
            "INSERT INTO threads (key, channel_key, created_at, last_active_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET channel_key = excluded.channel_key,"
            " last_active_at = excluded.last_active_at",
            (key, channel_key, now, now),
        )

    async def _reserve_seq(self, key: str, count: int, now: float) -> int:
        """Take ``count`` consecutive seq numbers of the thread (creating it); returns the first."""
        await self._db.execute(
            "INSERT OR IGNORE INTO threads (key, channel_key, created_at, last_active_at) VALUES (?, ?, ?, ?)",
            (key, _channel_key_of(key), now, now),
        )
        async with self._db.execute(
            "UPDATE threads SET last_seq = last_seq + ?, last_active_at = ? WHERE key = ? RETURNING last_seq",
            (count, now, key),
        ) as cursor:
            row = await cursor.fetchone()
        assert row is not None  # the insert above guarantees the row
        return int(row[0]) - count + 1

    async def _user_version(self) -> int:
        async with self._db.execute("PRAGMA user_version") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def _migrate(self) -> None:
        async with self._transaction():
            version = await self._user_version()
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the database has schema version {version}, newer than this bot knows ({SCHEMA_VERSION})"
                )
            for number, statements in enumerate(_MIGRATIONS[version:], start=version + 1):
                for statement in statements:
                    await self._db.execute(statement)
                await self._db.execute(f"PRAGMA user_version = {number}")

    async def _prune_processed(self) -> None:
        async with self._transaction():
            await self._db.execute("DELETE FROM processed WHERE at < ?", (time.time() - _DEDUPE_KEEP_S,))


def _channel_key_of(key: str) -> str:
    """``platform:channel`` of a thread key string; empty when the key is not a ThreadKey."""
    try:
        return ThreadKey.parse(key).channel_key
    except ValueError:
        return ""
