"""The store: opened once, migrated, and holding one repository per concept."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from sqlalchemy.exc import SQLAlchemyError

from bot.database import Database, Operation, database_url, open_database
from bot.store.feedback import FeedbackBook
from bot.store.greetings import Greetings
from bot.store.migrate import StoreError, current_revision, migrate
from bot.store.owners import KernelOwners
from bot.store.processed import ProcessedMessages
from bot.store.replicas import Replicas
from bot.store.schedules import ScheduleBook
from bot.store.threads import Threads
from bot.store.transcripts import Transcripts
from bot.store.turns import TurnQueue
from bot.store.usage import UsageLedger


class Store:
    """The async store; open with :meth:`open` (or ``async with await Store.open(url)``).

    Its repositories, each about one concept and each taking a :class:`~bot.events.ThreadKey`
    where a thread is meant: :attr:`threads`, :attr:`transcripts`, :attr:`turns`,
    :attr:`replicas`, :attr:`kernel_owners`, :attr:`usage`, :attr:`feedback`,
    :attr:`processed`, :attr:`schedules` and :attr:`greetings`.
    """

    def __init__(self, db: Database, *, replica_timeout_s: float) -> None:
        self._db = db
        #: This process among the bot processes sharing the database.
        self.replicas = Replicas(db, timeout_s=replica_timeout_s)
        #: Which threads exist.
        self.threads = Threads(db)
        #: Each thread's messages and executed cells.
        self.transcripts = Transcripts(db)
        #: Each thread's line of turns, across replicas.
        self.turns = TurnQueue(db, self.replicas)
        #: Which replica's kernel holds each thread's variables.
        self.kernel_owners = KernelOwners(db, self.replicas)
        #: Tokens and kernel seconds per turn.
        self.usage = UsageLedger(db)
        #: 👍 and 👎 on answers.
        self.feedback = FeedbackBook(db)
        #: Platform message ids already handled.
        self.processed = ProcessedMessages(db)
        #: Scheduled analyses (``schedule`` in a thread).
        self.schedules = ScheduleBook(db)
        #: Whom a bot home has greeted.
        self.greetings = Greetings(db)

    @classmethod
    async def open(cls, target: Path | str, *, replica_timeout_s: float = 15.0) -> Store:
        """Open the database at ``target`` (a path or URL; an SQLite file and its folders are
        created), migrate it to :data:`~bot.store.SCHEMA_VERSION` and register this process as a replica."""
        try:
            url = database_url(target)
        except ValueError as exc:
            raise StoreError(f"storage.url: {exc}") from None
        db = await open_database(url)
        store = cls(db, replica_timeout_s=replica_timeout_s)
        try:
            await db.write(migrate)
            await store.replicas.join()
            await store.processed.prune()
        except (SQLAlchemyError, OSError) as exc:
            await db.close()
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"cannot open the store {db.shown}: {reason}") from None
        except BaseException:
            await db.close()
            raise
        store.replicas.keep_alive()
        return store

    @property
    def shared(self) -> bool:
        """True when several bot processes may share this database (PostgreSQL)."""
        return self.replicas.shared

    async def close(self) -> None:
        """Leave the replicas (the turns still held are left for others to report) and close."""
        await self.replicas.leave()
        await self._db.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def write_all(self, *operations: Operation) -> None:
        """Run repositories' operations (their ``adding…`` methods) in one transaction."""
        await self._db.write_all(*operations)

    async def schema_version(self) -> str:
        """The Alembic revision of the open database."""
        return await self._db.read(current_revision)
