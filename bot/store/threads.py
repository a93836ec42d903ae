"""The threads the bot has seen: one row each, with the counters the other tables share (the
``seq`` that orders a thread's messages and cells, the last turn ticket handed out)."""

from __future__ import annotations

import functools
import time
from collections import OrderedDict

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bot.database import Database, upsert
from bot.events import ThreadKey
from bot.schema import threads

#: How many threads :meth:`Threads.exists` remembers having found.
_KNOWN_THREADS = 4096


class Threads:
    """Which threads exist, and when each was last active."""

    def __init__(self, db: Database) -> None:
        self._db = db
        # Threads found to exist, most recent last: a thread's row is never deleted, so a
        # follow-up in a known thread needs no trip to the database to be admitted.
        self._known: OrderedDict[ThreadKey, None] = OrderedDict()

    async def touch(self, key: ThreadKey) -> None:
        """Create the thread if new and mark it active now."""
        now = time.time()
        insert = self._db.upsert(threads).values(
            key=key, channel_key=key.channel_key, created_at=now, last_active_at=now
        )
        statement = insert.on_conflict_do_update(
            index_elements=[threads.c.key],
            set_={"channel_key": insert.excluded.channel_key, "last_active_at": insert.excluded.last_active_at},
        )
        await self._db.write(lambda conn: conn.execute(statement))

    async def viewed_channel(self, key: ThreadKey) -> str | None:
        """The channel a direct-message thread took its policy from (``""``: its own); None
        while undecided (a new thread)."""
        statement = sa.select(threads.c.viewed_channel).where(threads.c.key == key)
        return await self._db.read(lambda conn: conn.execute(statement).scalar())

    async def decide_viewed_channel(self, key: ThreadKey, channel_key: str) -> str:
        """Set the thread's viewed channel unless it is decided already; the one in force."""
        now = time.time()

        def decide(conn: Connection) -> str:
            ensure_thread(self._db, conn, key, now)
            conn.execute(
                sa.update(threads)
                .where(threads.c.key == key, threads.c.viewed_channel.is_(None))
                .values(viewed_channel=channel_key)
            )
            decided = conn.execute(sa.select(threads.c.viewed_channel).where(threads.c.key == key)).scalar()
            return str(decided or "")

        return await self._db.write(decide)

    async def forget_viewed_channel(self, key: ThreadKey) -> None:
        """The thread no longer takes a viewed channel's policy (its author left the channel)."""
        statement = sa.update(threads).where(threads.c.key == key).values(viewed_channel="")
        await self._db.write(lambda conn: conn.execute(statement))

    async def exists(self, key: ThreadKey) -> bool:
        """True when the thread has been seen before (touched or written to)."""
        if key in self._known:
            self._known.move_to_end(key)
            return True
        statement = sa.select(threads.c.key).where(threads.c.key == key)
        found = await self._db.read(lambda conn: conn.execute(statement).first() is not None)
        if found:
            self._known[key] = None
            if len(self._known) > _KNOWN_THREADS:
                self._known.popitem(last=False)
        return found


def ensure_thread(db: Database, conn: Connection, key: ThreadKey, now: float) -> None:
    """Create the thread's row in ``conn``'s transaction unless it exists."""
    conn.execute(_ensure_statement(db.dialect), {"b_key": key, "b_channel": key.channel_key, "b_now": now})


def take_counter(
    db: Database, conn: Connection, key: ThreadKey, counter: sa.Column[int], count: int, now: float
) -> int:
    """Add ``count`` to the thread's ``counter`` (creating the thread) and mark it active, in
    ``conn``'s transaction; returns the counter's new value. The row stays locked until the
    transaction ends, so numbers are handed out in the order transactions commit."""
    take = _take_statement(counter.name)
    values = {"b_key": key, "b_count": count, "b_now": now}
    value = conn.execute(take, values).scalar()
    if value is None:  # a new thread
        ensure_thread(db, conn, key, now)
        value = conn.execute(take, values).scalar_one()
    return int(value)


# Every turn takes counters two to four times: built once per dialect (see bot.database).


@functools.cache
def _ensure_statement(dialect: str) -> sa.Insert:
    key = sa.bindparam("b_key", type_=threads.c.key.type)
    now = sa.bindparam("b_now", type_=sa.Float)
    insert = upsert(dialect, threads)
    return insert.values(
        key=key, channel_key=sa.bindparam("b_channel", type_=sa.Text), created_at=now, last_active_at=now
    ).on_conflict_do_nothing(index_elements=[threads.c.key])


@functools.cache
def _take_statement(counter_name: str) -> sa.Update:
    counter = threads.c[counter_name]
    return (
        sa.update(threads)
        .where(threads.c.key == sa.bindparam("b_key", type_=threads.c.key.type))
        .values(
            {
                counter: counter + sa.bindparam("b_count", type_=sa.Integer),
                threads.c.last_active_at: sa.bindparam("b_now", type_=sa.Float),
            }
        )
        .returning(counter)
    )
