"""Tokens and kernel seconds, one row per turn: what budgets count and ``usage`` reports."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from bot.database import Database, Operation
from bot.events import ThreadKey
from bot.schema import usage

# Every turn runs these: built once (see bot.database).
_BEGIN = sa.insert(usage).returning(usage.c.id)
_ADD = (
    sa.update(usage)
    .where(usage.c.id == sa.bindparam("b_id", type_=sa.Integer))
    .values(
        prompt_tokens=usage.c.prompt_tokens + sa.bindparam("b_prompt", type_=sa.Integer),
        completion_tokens=usage.c.completion_tokens + sa.bindparam("b_completion", type_=sa.Integer),
        kernel_s=usage.c.kernel_s + sa.bindparam("b_kernel", type_=sa.Float),
    )
)


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Turns counted together: their group (a channel, a person; "" when not grouped), model,
    tokens, kernel seconds and number."""

    group: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    kernel_s: float
    turns: int

    @property
    def tokens(self) -> int:
        """Prompt and completion tokens together."""
        return self.prompt_tokens + self.completion_tokens


class UsageLedger:
    """The ``usage`` table: a row per turn, summed on demand."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def begin(self, key: ThreadKey, *, model: str, user_id: str | None, at: float | None = None) -> int:
        """Start counting a turn of ``user_id`` in thread ``key`` (it counts for the per-minute
        budget from now); returns its row for :meth:`add`."""
        row = {
            "thread": key,
            "channel_key": key.channel_key,
            "user_id": user_id,
            "model": model,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "kernel_s": 0.0,
            "at": time.time() if at is None else at,
        }
        return int(await self._db.write(lambda conn: conn.execute(_BEGIN, row).scalar_one()))

    async def add(self, row: int, *, prompt_tokens: int, completion_tokens: int, kernel_s: float = 0.0) -> None:
        """Add tokens and kernel seconds to the turn counted by ``row``."""
        await self._db.write(
            self.adding(row, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, kernel_s=kernel_s)
        )

    def adding(self, row: int, *, prompt_tokens: int, completion_tokens: int, kernel_s: float = 0.0) -> Operation:
        """:meth:`add` as an operation, to write in one transaction with others."""
        values = {"b_id": row, "b_prompt": prompt_tokens, "b_completion": completion_tokens, "b_kernel": kernel_s}
        return lambda conn: conn.execute(_ADD, values)

    async def spent(
        self,
        *,
        since: float,
        user_id: str | None = None,
        channel_key: str | None = None,
        thread: ThreadKey | None = None,
    ) -> list[UsageRow]:
        """Turns since ``since`` (of a person, a channel or a thread when given), per model."""
        statement = _totals(usage.c.model).where(usage.c.at >= since)
        wanted = (
            (usage.c.user_id, user_id),
            (usage.c.channel_key, channel_key),
            (usage.c.thread, thread),
        )
        for column, value in wanted:
            if value is not None:
                statement = statement.where(column == value)
        rows = await self._db.read(lambda conn: conn.execute(statement).all())
        return [UsageRow("", *row) for row in rows]

    async def turn_times(self, *, user_id: str, since: float) -> list[float]:
        """When ``user_id``'s turns since ``since`` started."""
        statement = sa.select(usage.c.at).where(usage.c.user_id == user_id, usage.c.at >= since)
        return [float(at) for at in await self._db.read(lambda conn: conn.execute(statement).scalars().all())]

    async def report(self, *, since: float, by: Literal["channel_key", "user_id"]) -> list[UsageRow]:
        """Turns since ``since`` per channel or per person (``by``), and per model."""
        group = usage.c[by]
        statement = _totals(group, usage.c.model).where(usage.c.at >= since)
        rows = await self._db.read(lambda conn: conn.execute(statement).all())
        return [UsageRow(str(row[0] or "?"), *row[1:]) for row in rows]

    async def thread_tokens(self, key: ThreadKey) -> tuple[int, int]:
        """Total (prompt, completion) tokens used by the thread."""
        statement = sa.select(
            sa.func.coalesce(sa.func.sum(usage.c.prompt_tokens), 0),
            sa.func.coalesce(sa.func.sum(usage.c.completion_tokens), 0),
        ).where(usage.c.thread == key)
        row = await self._db.read(lambda conn: conn.execute(statement).first())
        return (int(row[0]), int(row[1])) if row else (0, 0)


def _totals(*groups: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """Sums of the usage columns, grouped by ``groups`` (which come first in each row)."""
    return sa.select(
        *groups,
        sa.func.coalesce(sa.func.sum(usage.c.prompt_tokens), 0),
        sa.func.coalesce(sa.func.sum(usage.c.completion_tokens), 0),
        sa.func.coalesce(sa.func.sum(usage.c.kernel_s), 0.0),
        sa.func.count(),
    ).group_by(*groups)
