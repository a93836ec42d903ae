"""Which replica's kernel holds a thread's variables (and, on a Jupyter gateway, which kernel),
so a replica taking a thread over knows whether its kernel was left behind by a gone one."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bot.database import Database
from bot.events import ThreadKey
from bot.schema import threads
from bot.store.replicas import Replicas


@dataclass(frozen=True, slots=True)
class KernelOwner:
    """The replica whose kernel last held a thread's variables."""

    run: str
    #: Its kernel's id on a Jupyter gateway (None: a local kernel, or not known yet).
    remote_id: str | None
    #: That replica is gone (killed, crashed): its gateway kernel has nobody driving it.
    gone: bool


class KernelOwners:
    """The ``kernel_run``/``kernel_id`` of each thread."""

    def __init__(self, db: Database, replicas: Replicas) -> None:
        self._db = db
        self._replicas = replicas

    async def claim(self, key: ThreadKey) -> KernelOwner | None:
        """Record that this replica's kernel now holds thread ``key``'s variables; returns the
        owner before (None when none was recorded)."""
        me = self._replicas.run

        def write(conn: Connection) -> KernelOwner | None:
            row = conn.execute(
                sa.select(threads.c.kernel_run, threads.c.kernel_id).where(threads.c.key == key).with_for_update()
            ).first()
            before = None
            if row is not None and row.kernel_run is not None:
                run = str(row.kernel_run)
                before = KernelOwner(run, row.kernel_id, self._replicas.is_gone(conn, run))
            if before is None or before.run != me:
                conn.execute(sa.update(threads).where(threads.c.key == key).values(kernel_run=me, kernel_id=None))
            return before

        return await self._db.write(write)

    async def record(self, key: ThreadKey, remote_id: str | None) -> None:
        """Record the gateway id of the kernel this replica holds thread ``key``'s variables in."""
        statement = (
            sa.update(threads)
            .where(threads.c.key == key, threads.c.kernel_run == self._replicas.run)
            .values(kernel_id=remote_id)
        )
        await self._db.write(lambda conn: conn.execute(statement))
