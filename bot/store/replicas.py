"""The bot processes sharing the database: every replica marks itself alive in ``replicas``
every third of ``storage.replica_timeout_s``; one silent past the timeout is gone, and what it
held (queued turns, a thread's kernel) is taken over. With SQLite the store belongs to one bot
process, so every other process is a gone one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from bot.database import Database
from bot.schema import replicas

log = logging.getLogger(__name__)

#: Rows of replicas gone this long are deleted.
_FORGET_REPLICA_S = 24 * 3600.0


class Replicas:
    """This process among the replicas, and who else is alive."""

    def __init__(self, db: Database, *, timeout_s: float) -> None:
        self._db = db
        self.timeout_s = timeout_s
        #: This process's id among the replicas.
        self.run = uuid.uuid4().hex
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def shared(self) -> bool:
        """True when several bot processes may share this database (PostgreSQL)."""
        return self._db.dialect != "sqlite"

    async def join(self) -> None:
        """Register this process (forgetting replicas gone a day); :meth:`keep_alive` next."""
        now = time.time()

        def write(conn: Connection) -> None:
            conn.execute(sa.delete(replicas).where(replicas.c.seen_at < now - _FORGET_REPLICA_S))
            self._insert_self(conn, now)

        await self._db.write(write)

    def keep_alive(self) -> None:
        """Mark this replica alive every third of the timeout until :meth:`leave`."""
        self._heartbeat = asyncio.create_task(self._beat(), name="store-heartbeat")

    async def leave(self) -> None:
        """Stop the heartbeat and sign off (the turns still held are left for others to report)."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        try:
            await self._db.write(lambda conn: conn.execute(sa.delete(replicas).where(replicas.c.run == self.run)))
        except SQLAlchemyError as exc:
            log.warning("could not sign this replica off: %s", exc)

    async def live(self) -> list[str]:
        """The runs of the replicas that showed signs of life within the timeout, this one included."""
        statement = sa.select(replicas.c.run).where(self._seen_lately()).order_by(replicas.c.run)
        return [str(run) for run in await self._db.read(lambda conn: conn.execute(statement).scalars().all())]

    def gone(self, run: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
        """Whether the replica named by the column ``run`` is gone (never this one)."""
        if not self.shared:
            return run != self.run  # SQLite: one bot process at a time
        live = sa.select(replicas.c.run).where(self._seen_lately())
        return sa.and_(run != self.run, run.not_in(live))

    def is_gone(self, conn: Connection, run: str) -> bool:
        """Whether replica ``run`` is gone, read in ``conn``'s transaction."""
        if not self.shared:
            return run != self.run
        alive = conn.scalar(
            sa.select(sa.func.count()).select_from(replicas).where(replicas.c.run == run, self._seen_lately())
        )
        return not alive

    def _seen_lately(self) -> sa.ColumnElement[bool]:
        return replicas.c.seen_at >= time.time() - self.timeout_s

    def _insert_self(self, conn: Connection, now: float) -> None:
        conn.execute(sa.insert(replicas).values(run=self.run, host=socket.gethostname(), started_at=now, seen_at=now))

    async def _beat(self) -> None:
        """Mark this replica alive every third of the timeout, for as long as the store is open."""

        def write(conn: Connection) -> None:
            now = time.time()
            seen = conn.execute(sa.update(replicas).where(replicas.c.run == self.run).values(seen_at=now))
            if seen.rowcount == 0:  # deleted as long gone (the database was out of reach for a day)
                self._insert_self(conn, now)

        while True:
            await asyncio.sleep(self.timeout_s / 3)
            try:
                await self._db.write(write)
            except (SQLAlchemyError, OSError) as exc:
                log.warning("could not mark this replica alive: %s", exc)
