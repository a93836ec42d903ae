"""👍 and 👎 on answers: one per person and answer, a later click replacing theirs."""

from __future__ import annotations

import time
from dataclasses import dataclass

import sqlalchemy as sa

from bot.database import Database
from bot.events import ThreadKey
from bot.schema import feedback


@dataclass(frozen=True, slots=True)
class FeedbackCounts:
    """How many 👍 and 👎 answers got."""

    good: int
    bad: int


class FeedbackBook:
    """The ``feedback`` table."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, key: ThreadKey, turn_id: str, user_id: str, *, good: bool) -> None:
        """Record a 👍 (``good``) or 👎 on the answer to ``turn_id``; a person's later click replaces theirs."""
        insert = self._db.upsert(feedback).values(
            thread=key, turn_id=turn_id, user_id=user_id, good=good, at=time.time()
        )
        statement = insert.on_conflict_do_update(
            index_elements=[feedback.c.thread, feedback.c.turn_id, feedback.c.user_id],
            set_={"good": insert.excluded.good, "at": insert.excluded.at},
        )
        await self._db.write(lambda conn: conn.execute(statement))

    async def counts(self, key: ThreadKey | None = None, *, since: float | None = None) -> FeedbackCounts:
        """👍 and 👎 on the thread's answers (every thread's when ``key`` is None), clicked
        since ``since`` when given."""
        good = sa.func.coalesce(sa.func.sum(sa.case((feedback.c.good, 1), else_=0)), 0)
        bad = sa.func.coalesce(sa.func.sum(sa.case((feedback.c.good, 0), else_=1)), 0)
        statement = sa.select(good, bad).select_from(feedback)
        if key is not None:
            statement = statement.where(feedback.c.thread == key)
        if since is not None:
            statement = statement.where(feedback.c.at >= since)
        row = await self._db.read(lambda conn: conn.execute(statement).first())
        return FeedbackCounts(int(row[0]), int(row[1])) if row else FeedbackCounts(0, 0)
