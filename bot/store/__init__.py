"""The thread store: one implementation for SQLite (one bot process) and PostgreSQL (several
replicas), written with SQLAlchemy Core (run as :mod:`bot.database` says), its schema kept by
Alembic (:mod:`bot.store.migrate`, at :meth:`Store.open`).

:class:`Store` holds one repository per concept, each in its own module and each taking a
:class:`~bot.events.ThreadKey` where a thread is meant:

- :mod:`~bot.store.threads`: the threads seen, and the counters the other tables share;
- :mod:`~bot.store.transcripts`: a thread's OpenAI-format messages (what survives a restart)
  and executed cells (what ``export`` rebuilds), interleaved by one per-thread ``seq``;
- :mod:`~bot.store.turns`: the turns queued or running, one ticket per message, so a
  thread's turns run one at a time and in order across replicas;
- :mod:`~bot.store.replicas`: the bot processes alive, and those gone whose turns are
  reported interrupted;
- :mod:`~bot.store.owners`: which replica's kernel holds a thread's variables;
- :mod:`~bot.store.usage`, :mod:`~bot.store.feedback`, :mod:`~bot.store.processed` (platform
  message ids already handled), :mod:`~bot.store.schedules` and :mod:`~bot.store.greetings`.

What the store keeps is plain data: an executed cell arrives as nbformat outputs
(:class:`bot.transcript.NewCell`), so formatting for export lives outside it.
"""

from __future__ import annotations

from bot.store.feedback import FeedbackBook, FeedbackCounts
from bot.store.greetings import Greetings
from bot.store.migrate import SCHEMA_VERSION, StoreError
from bot.store.owners import KernelOwner, KernelOwners
from bot.store.processed import ProcessedMessages
from bot.store.replicas import Replicas
from bot.store.schedules import NewSchedule, Schedule, ScheduleBook, TooManySchedules
from bot.store.store import Store
from bot.store.threads import Threads
from bot.store.transcripts import NOTICE_ROLE, Transcripts
from bot.store.turns import InterruptedTurn, QueuedTurn, TurnCheck, TurnQueue
from bot.store.usage import UsageLedger, UsageRow

__all__ = [
    "NOTICE_ROLE",
    "SCHEMA_VERSION",
    "FeedbackBook",
    "FeedbackCounts",
    "Greetings",
    "InterruptedTurn",
    "KernelOwner",
    "KernelOwners",
    "NewSchedule",
    "ProcessedMessages",
    "QueuedTurn",
    "Replicas",
    "Schedule",
    "ScheduleBook",
    "Store",
    "StoreError",
    "Threads",
    "TooManySchedules",
    "Transcripts",
    "TurnCheck",
    "TurnQueue",
    "UsageLedger",
    "UsageRow",
]
