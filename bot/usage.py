"""The ``usage`` reports: tokens, Python time and estimated cost, today and this month (UTC).

``usage`` shows the thread's and the asking person's; ``usage all`` (``access.admins`` only)
every channel's and person's, most tokens first, with the 👍/👎 answers got. Costs come from
``llm.prices`` (US dollars per million input and output tokens, per model); a model without a
price is named instead of guessed.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from bot.budgets import day_start
from bot.config import ModelPrice
from bot.events import ThreadKey
from bot.store import FeedbackBook, UsageLedger, UsageRow

TOP = 10


def month_start(now: float) -> float:
    """The start of ``now``'s calendar month in UTC."""
    day = dt.datetime.fromtimestamp(now, dt.UTC)
    return day.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


@dataclass(frozen=True, slots=True)
class Totals:
    """Turns added up: tokens, Python seconds, turns, and the cost of the priced models."""

    tokens: int = 0
    kernel_s: float = 0.0
    turns: int = 0
    cost: float = 0.0
    unpriced: frozenset[str] = frozenset()

    def line(self) -> str:
        """``12,345 tokens · 4.2 s of Python · 3 turns · $0.0123``."""
        parts = [f"{self.tokens:,} tokens", f"{self.kernel_s:,.1f} s of Python", f"{self.turns} turns"]
        if self.cost or not self.unpriced:
            parts.append(f"${self.cost:,.4f}")
        if self.unpriced:
            parts.append(f"no price for {', '.join(sorted(self.unpriced))}")
        return " · ".join(parts)


def add_up(rows: Iterable[UsageRow], prices: dict[str, ModelPrice]) -> Totals:
    """The totals of ``rows``, priced with ``prices``."""
    tokens = turns = 0
    kernel_s = cost = 0.0
    unpriced: set[str] = set()
    for row in rows:
        tokens += row.tokens
        kernel_s += row.kernel_s
        turns += row.turns
        price = prices.get(row.model)
        if price is None:
            if row.tokens:
                unpriced.add(row.model)
            continue
        cost += (row.prompt_tokens * price.input + row.completion_tokens * price.output) / 1_000_000
    return Totals(tokens, kernel_s, turns, cost, frozenset(unpriced))


class UsageReport:
    """Builds the texts of ``usage`` and ``usage all``."""

    def __init__(self, usage: UsageLedger, feedback: FeedbackBook, prices: dict[str, ModelPrice]) -> None:
        self._usage = usage
        self._feedback = feedback
        self._prices = prices

    async def mine(self, thread: ThreadKey, user_id: str, now: float) -> str:
        """The thread's and the person's usage, today and this month."""
        lines = ["**Usage** (UTC)"]
        of_thread = functools.partial(self._usage.spent, thread=thread)
        of_person = functools.partial(self._usage.spent, user_id=user_id)
        for title, spent in (("This thread", of_thread), ("You", of_person)):
            today = add_up(await spent(since=day_start(now)), self._prices)
            month = add_up(await spent(since=month_start(now)), self._prices)
            lines += [f"**{title}**", f"• today: {today.line()}", f"• this month: {month.line()}"]
        return "\n".join(lines)

    async def everyone(self, now: float) -> str:
        """Every channel's and person's usage this month, most tokens first, and the feedback."""
        since = month_start(now)
        lines = ["**Usage this month** (UTC)"]
        groupings: tuple[tuple[str, Literal["channel_key", "user_id"]], ...] = (
            ("Channels", "channel_key"),
            ("People", "user_id"),
        )
        for title, by in groupings:
            groups: dict[str, list[UsageRow]] = {}
            for row in await self._usage.report(since=since, by=by):
                groups.setdefault(row.group, []).append(row)
            totals = sorted(
                ((add_up(rows, self._prices), group) for group, rows in groups.items()),
                key=lambda item: (-item[0].tokens, item[1]),
            )
            lines.append(f"**{title}** ({len(totals)})")
            lines += [f"{i}. `{group}` — {total.line()}" for i, (total, group) in enumerate(totals[:TOP], start=1)]
            if len(totals) > TOP:
                lines.append(f"… and {len(totals) - TOP} more")
            if not totals:
                lines.append("• none yet")
        everything = add_up(await self._usage.spent(since=since), self._prices)
        feedback = await self._feedback.counts(since=since)
        lines += [
            f"**All together:** {everything.line()}",
            f"**Feedback on answers:** 👍 {feedback.good} · 👎 {feedback.bad}",
        ]
        return "\n".join(lines)
