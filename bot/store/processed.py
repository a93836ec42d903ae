"""Platform message ids already handled: each message is answered once, whichever replica got
it, however often its platform retries."""

from __future__ import annotations

import functools
import time

import sqlalchemy as sa

from bot.database import Database, upsert
from bot.schema import processed

#: Processed message ids older than this are forgotten (platforms retry within minutes).
_DEDUPE_KEEP_S = 7 * 24 * 3600.0
#: Prune the processed ids once every this many claims (and at open).
_PRUNE_EVERY = 1000


class ProcessedMessages:
    """The ``processed`` table."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._claims = 0

    async def claim(self, message_id: str) -> bool:
        """Record a platform message id; True the first time, False for a duplicate (on any replica)."""
        statement, values = _claim_statement(self._db.dialect), {"b_id": message_id, "b_at": time.time()}
        first = await self._db.write(lambda conn: conn.execute(statement, values).first() is not None)
        self._claims += 1
        if self._claims % _PRUNE_EVERY == 0:
            await self.prune()
        return first

    async def prune(self) -> None:
        """Forget the ids handled more than a week ago."""
        statement = sa.delete(processed).where(processed.c.at < time.time() - _DEDUPE_KEEP_S)
        await self._db.write(lambda conn: conn.execute(statement))


@functools.cache
def _claim_statement(dialect: str) -> sa.Insert:
    """Record ``b_id`` (at ``b_at``) unless it is there; returns it when it was not (built once
    per dialect: see :mod:`bot.database`)."""
    insert = upsert(dialect, processed)
    return (
        insert.values(message_id=sa.bindparam("b_id", type_=sa.Text), at=sa.bindparam("b_at", type_=sa.Float))
        .on_conflict_do_nothing(index_elements=[processed.c.message_id])
        .returning(processed.c.message_id)
    )
