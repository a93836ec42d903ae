"""The store's tables as the latest migration (``bot/migrations/versions``) leaves them, for
building queries. Migrations never import this: each revision spells out its own change.

Every column that holds a thread key has the type :class:`ThreadKeyText`: the store passes and
gets :class:`~bot.events.ThreadKey` objects, the database holds their text (``TEXT``, as the
migrations made it)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from bot.events import ThreadKey

metadata = sa.MetaData()


class ThreadKeyText(sa.types.TypeDecorator[ThreadKey]):
    """A :class:`~bot.events.ThreadKey` stored as its text (``slack:T1:C1:1700000000.000100``).

    Only a ``ThreadKey`` is written (anything else is a TypeError, so no other string slips in).
    A stored text that is no thread key (a row this version never wrote) reads as None: only
    reads that name no thread meet one, and they drop the row with a log line."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any | None, dialect: sa.Dialect) -> str | None:
        """The text stored for ``value``."""
        if value is None:
            return None
        if not isinstance(value, ThreadKey):
            raise TypeError(f"a thread key column takes a ThreadKey, not {type(value).__name__}")
        return str(value)

    def process_result_value(self, value: Any | None, dialect: sa.Dialect) -> ThreadKey | None:
        """The key the stored text says, None when it says none."""
        if value is None:
            return None
        try:
            return ThreadKey.parse(str(value))
        except ValueError:
            return None


threads = sa.Table(
    "threads",
    metadata,
    sa.Column("key", ThreadKeyText, primary_key=True),
    sa.Column("channel_key", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("last_active_at", sa.Float, nullable=False),
    #: The per-thread counter that orders messages and cells (``seq``).
    sa.Column("last_seq", sa.Integer, nullable=False, server_default="0"),
    #: The per-thread counter that orders turns across replicas (``turns_in_flight.ticket``).
    sa.Column("last_ticket", sa.Integer, nullable=False, server_default="0"),
    #: The replica (``replicas.run``) whose kernel holds the thread's live variables.
    sa.Column("kernel_run", sa.Text),
    #: That kernel's id on a Jupyter gateway, which another replica can attach to (None: local).
    sa.Column("kernel_id", sa.Text),
    #: A direct-message thread: the ``platform:channel`` whose policy it took from the channel
    #: its author viewed as it started ("" for its own; None while undecided).
    sa.Column("viewed_channel", sa.Text),
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("thread", ThreadKeyText, sa.ForeignKey("threads.key", ondelete="CASCADE"), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("user_id", sa.Text),
    sa.Column("created_at", sa.Float, nullable=False),
)

cells = sa.Table(
    "cells",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("thread", ThreadKeyText, sa.ForeignKey("threads.key", ondelete="CASCADE"), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("code", sa.Text, nullable=False),
    sa.Column("outputs", sa.Text, nullable=False),
    sa.Column("execution_count", sa.Integer),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("duration_s", sa.Float, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

processed = sa.Table(
    "processed",
    metadata,
    sa.Column("message_id", sa.Text, primary_key=True),
    sa.Column("at", sa.Float, nullable=False),
)

#: The people a platform's bot home (Slack's Messages tab) has greeted: once each.
greetings = sa.Table(
    "greetings",
    metadata,
    sa.Column("platform", sa.Text, primary_key=True),
    sa.Column("workspace", sa.Text, primary_key=True),
    sa.Column("user_id", sa.Text, primary_key=True),
    sa.Column("at", sa.Float, nullable=False),
)

#: One row per turn (made as it starts, its tokens and kernel time added as it ends).
usage = sa.Table(
    "usage",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("thread", ThreadKeyText, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("completion_tokens", sa.Integer, nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("user_id", sa.Text),
    sa.Column("channel_key", sa.Text),
    sa.Column("kernel_s", sa.Float, nullable=False, server_default="0"),
)

turns_in_flight = sa.Table(
    "turns_in_flight",
    metadata,
    sa.Column("thread", ThreadKeyText, primary_key=True),
    sa.Column("message_id", sa.Text, primary_key=True),
    sa.Column("run", sa.Text, nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    #: Turns of a thread run in ticket order (``threads.last_ticket`` hands them out).
    sa.Column("ticket", sa.Integer, nullable=False, server_default="0"),
    #: Stop was pressed, maybe on another replica than the one running the turn.
    sa.Column("stop_requested", sa.Boolean, nullable=False, server_default=sa.false()),
)

replicas = sa.Table(
    "replicas",
    metadata,
    sa.Column("run", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("seen_at", sa.Float, nullable=False),
)

feedback = sa.Table(
    "feedback",
    metadata,
    sa.Column("thread", ThreadKeyText, primary_key=True),
    #: The platform message id of the question whose answer was rated.
    sa.Column("turn_id", sa.Text, primary_key=True),
    sa.Column("user_id", sa.Text, primary_key=True),
    sa.Column("good", sa.Boolean, nullable=False),
    sa.Column("at", sa.Float, nullable=False),
)

#: Scheduled analyses; ``next_run_at`` is None once a schedule is disabled (its thread is gone).
schedules = sa.Table(
    "schedules",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("thread", ThreadKeyText, nullable=False),
    #: Its number among the thread's schedules (what ``unschedule N`` names).
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("creator", sa.Text, nullable=False),
    sa.Column("creator_name", sa.Text, nullable=False),
    sa.Column("question", sa.Text, nullable=False),
    #: Five-field cron rule (day of week as names) in ``timezone``; ``described`` says it in words.
    sa.Column("cron", sa.Text, nullable=False),
    sa.Column("timezone", sa.Text, nullable=False),
    sa.Column("described", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("next_run_at", sa.Float),
    sa.Column("last_run_at", sa.Float),
    sa.Column("disabled_reason", sa.Text),
    sa.UniqueConstraint("thread", "number", name="schedules_thread_number"),
)
