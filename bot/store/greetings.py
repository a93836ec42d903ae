"""Whom a platform's bot home has greeted: each person at most once, on every replica and
across restarts (Slack's Messages tab is opened again and again)."""

from __future__ import annotations

import time

from bot.database import Database
from bot.schema import greetings


class Greetings:
    """The ``greetings`` table."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def claim(self, platform: str, workspace: str, user_id: str) -> bool:
        """Record that ``user_id`` is greeted; True the first time only (whichever replica asks)."""
        statement = (
            self._db.upsert(greetings)
            .values(platform=platform, workspace=workspace, user_id=user_id, at=time.time())
            .on_conflict_do_nothing(index_elements=[greetings.c.platform, greetings.c.workspace, greetings.c.user_id])
            .returning(greetings.c.user_id)
        )
        return await self._db.write(lambda conn: conn.execute(statement).first() is not None)
