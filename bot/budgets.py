"""Budgets (``limits`` in the config, a channel's own ``limits`` over them): whether a turn may
start, and whether it may go on spending tokens.

Everything is counted in the store (one row per turn: :meth:`bot.store.UsageLedger.begin`), so
budgets hold across restarts and replicas. Days are calendar days in UTC; the per-minute
budget is a sliding minute. A refusal is one sentence saying what ran out and when it comes
back. Turns running at the same time in other threads are not seen by each other's
between-rounds check, so a person can overshoot a token budget by what those turns spend.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from bot.config import Limits, Settings
from bot.events import InboundMessage
from bot.store import UsageLedger, UsageRow

DAY_S = 86_400
MINUTE_S = 60.0

#: The clock budgets count with (tests pass a controllable one).
Clock = Callable[[], float]


def day_start(now: float) -> float:
    """The start of ``now``'s calendar day in UTC."""
    return now - now % DAY_S


def in_words(seconds: float) -> str:
    """``3 h 12 min``, ``4 min``, ``35 s``."""
    seconds = max(1, math.ceil(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = math.ceil(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min" if minutes % 60 else f"{minutes // 60} h"


@dataclass(frozen=True, slots=True)
class TokenAllowance:
    """What a turn found spent when it started, to check its own tokens against as it goes."""

    limits: Limits
    user_tokens: int
    channel_tokens: int
    resets_at: float

    def exceeded(self, turn_tokens: int, now: float) -> str | None:
        """The sentence for a token budget this turn's ``turn_tokens`` used up; None while within."""
        if self.limits.tokens_per_user_day and self.user_tokens + turn_tokens >= self.limits.tokens_per_user_day:
            who = f"your {self.limits.tokens_per_user_day:,} tokens for today"
        elif (
            self.limits.tokens_per_channel_day
            and self.channel_tokens + turn_tokens >= self.limits.tokens_per_channel_day
        ):
            who = f"this channel's {self.limits.tokens_per_channel_day:,} tokens for today"
        else:
            return None
        return f"🪫 Stopped here: {who} ran out during this answer. {_resets(self.resets_at, now)}"


class Budgets:
    """Applies the limits of a message's channel (see the module docstring)."""

    def __init__(self, settings: Settings, usage: UsageLedger, *, clock: Clock = time.time) -> None:
        self._settings = settings
        self._usage = usage
        self.clock = clock

    def limits_for(self, message: InboundMessage) -> Limits:
        """The global limits, with the keys the message's channel sets replaced."""
        return self._settings.limits.over(self._settings.policy_for(message.key.channel_key).limits)

    async def admit(self, message: InboundMessage) -> tuple[str | None, TokenAllowance]:
        """``(refusal, allowance)``: a sentence when a budget is spent (the turn must not
        start), and what the turn's tokens are checked against as it goes."""
        limits = self.limits_for(message)
        now = self.clock()
        today = day_start(now)
        resets_at = today + DAY_S
        user, channel = message.user_id, message.key.channel_key
        mine = _total(await self._usage.spent(since=today, user_id=user)) if _per_user(limits) else None
        theirs = (
            _total(await self._usage.spent(since=today, channel_key=channel)) if limits.tokens_per_channel_day else None
        )
        allowance = TokenAllowance(limits, mine.tokens if mine else 0, theirs.tokens if theirs else 0, resets_at)
        if limits.turns_per_user_minute:
            recent = await self._usage.turn_times(user_id=user, since=now - MINUTE_S)
            if len(recent) >= limits.turns_per_user_minute:
                wait = min(recent) + MINUTE_S - now
                return (
                    f"⏱️ You have asked {len(recent)} questions in the last minute, the most allowed here; "
                    f"please ask again in {in_words(wait)}.",
                    allowance,
                )
        if mine is not None and limits.tokens_per_user_day and mine.tokens >= limits.tokens_per_user_day:
            return (
                f"🪫 You have used your {limits.tokens_per_user_day:,} tokens for today. {_resets(resets_at, now)}",
                allowance,
            )
        if theirs is not None and limits.tokens_per_channel_day and theirs.tokens >= limits.tokens_per_channel_day:
            return (
                f"🪫 This channel has used its {limits.tokens_per_channel_day:,} tokens for today. {_resets(resets_at, now)}",
                allowance,
            )
        if (
            mine is not None
            and limits.kernel_seconds_per_user_day
            and mine.kernel_s >= limits.kernel_seconds_per_user_day
        ):
            return (
                f"🪫 You have used your {limits.kernel_seconds_per_user_day:g} s of Python time for today. "
                f"{_resets(resets_at, now)}",
                allowance,
            )
        return None, allowance


def _per_user(limits: Limits) -> bool:
    return bool(limits.tokens_per_user_day or limits.kernel_seconds_per_user_day)


def _total(rows: list[UsageRow]) -> UsageRow:
    return UsageRow(
        "",
        "",
        sum(r.prompt_tokens for r in rows),
        sum(r.completion_tokens for r in rows),
        sum(r.kernel_s for r in rows),
        sum(r.turns for r in rows),
    )


def _resets(at: float, now: float) -> str:
    return f"It resets at 00:00 UTC, in {in_words(at - now)}."
