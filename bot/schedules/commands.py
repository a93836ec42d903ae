"""``schedule <when> <question>``, ``schedules`` and ``unschedule N`` in a thread."""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.budgets import Clock
from bot.config import Settings
from bot.events import InboundMessage, Reply
from bot.safetext import shown
from bot.schedules.when import WhenError, parse_schedule
from bot.store import NewSchedule, Schedule, ScheduleBook, TooManySchedules

log = logging.getLogger(__name__)

#: The words that start a schedule command.
WORDS = frozenset({"schedule", "schedules", "unschedule"})
#: How long ``schedule`` waits for the platform to say the author's time zone.
TIMEZONE_LOOKUP_S = 5.0

SCHEDULE_HELP = (
    "To ask a question again at set times, send `schedule <when> <question>`, e.g. "
    "`schedule every monday 9:00 revenue by region as a bar chart`. <when> can be `every monday 9:00`, "
    "`daily 18:30`, `weekdays 8:00`, `every hour`, `every 30 minutes`, `monthly on the 1st at 7:00`, "
    "or a cron expression (`0 9 * * 1`); a time zone may follow the time (`every monday 9:00 Europe/Paris`). "
    "`schedules` lists this thread's schedules, `unschedule N` removes one."
)
DISABLED = "Scheduled runs are turned off on this bot (`schedules.enabled`)."


def is_schedule_command(text: str) -> bool:
    """Whether ``text`` (a message, after the mention) is one of the schedule commands:
    ``schedule …``, or ``schedules`` / ``unschedule [N]`` as the whole message (a question
    such as "schedules for next week: which are late?" is a question)."""
    words = text.strip().lstrip("!/").split()
    if not words or (first := words[0].lower()) not in WORDS:
        return False
    return first == "schedule" or len(words) <= (1 if first == "schedules" else 2)


class ScheduleCommands:
    """Answers the schedule commands of a thread."""

    def __init__(self, *, book: ScheduleBook, settings: Settings, clock: Clock) -> None:
        self._book = book
        self._settings = settings
        self._clock = clock

    async def run(self, message: InboundMessage) -> Reply:
        """The reply to a message for which :func:`is_schedule_command` holds."""
        word, _, rest = message.text.strip().lstrip("!/").partition(" ")
        word, rest = word.lower(), rest.strip()
        if not self._settings.schedules.enabled:
            return Reply(text=DISABLED)
        if word == "schedules":
            return Reply(text=await self._list(message))
        if word == "unschedule":
            return Reply(text=await self._remove(message, rest))
        if not rest or rest.lower() in ("help", "?"):
            return Reply(text=SCHEDULE_HELP)
        return Reply(text=await self._add(message, rest))

    async def _add(self, message: InboundMessage, rest: str) -> str:
        default = await self._author_timezone(message) or self._settings.schedules.timezone
        try:
            parsed = parse_schedule(rest, default_timezone=default)
            now = self._clock()
            first_run = parsed.when.next_after(now)
        except WhenError as exc:  # one line with the reason; the help is one `schedule help` away
            return f"⚠️ Not scheduled: {exc}. `schedule help` shows how to write it."
        limit = self._settings.schedules.max_per_thread
        new = NewSchedule(
            thread=message.key,
            creator=message.user_id,
            creator_name=message.user_name,
            question=parsed.question,
            cron=parsed.when.cron,
            timezone=parsed.when.timezone,
            described=parsed.when.described,
            created_at=now,
            next_run_at=first_run,
        )
        try:
            schedule = await self._book.add(new, max_per_thread=limit)
        except TooManySchedules:
            return (
                f"⚠️ This thread already has {limit} schedules, the most it may hold (`schedules.max_per_thread`); "
                "`unschedule N` removes one."
            )
        log.info(
            "schedule #%d of %s: %s (%s) by %s",
            schedule.number,
            message.key,
            schedule.cron,
            schedule.timezone,
            message.user_id,
        )
        return (
            f"⏰ Scheduled #{schedule.number}: {schedule.described} ({schedule.timezone}). "
            f"Next run: {_moment(first_run, schedule.timezone)}. Each run asks: “{shown(schedule.question)}”, "
            f"and posts the answer here.\n`schedules` lists this thread's schedules; `unschedule {schedule.number}` removes it."
        )

    async def _list(self, message: InboundMessage) -> str:
        found = await self._book.of_thread(message.key)
        if not found:
            return "This thread has no schedules. " + SCHEDULE_HELP
        return f"Schedules of this thread ({len(found)}):\n" + "\n".join(_line(s) for s in found)

    async def _remove(self, message: InboundMessage, rest: str) -> str:
        match = re.fullmatch(r"#?(\d{1,6})", rest)
        if match is None:
            return "Say which one: `unschedule N`, with N from `schedules`."
        number = int(match[1])
        key = message.key
        schedule = next((s for s in await self._book.of_thread(key) if s.number == number), None)
        if schedule is None:
            return f"There is no schedule #{number} in this thread; `schedules` lists them."
        admin = self._settings.access.is_admin(message.key.platform, message.user_id)
        if schedule.creator != message.user_id and not admin:
            return f"Only {shown(schedule.creator_name)}, who made schedule #{number}, or an admin can remove it."
        await self._book.remove(key, number)
        log.info("schedule #%d of %s removed by %s", number, key, message.user_id)
        return f"🗑️ Schedule #{number} removed; it will not run again."

    async def _author_timezone(self, message: InboundMessage) -> str | None:
        """The author's time zone as the platform tells it, if it is one we know."""
        if message.timezone is None:
            return None
        try:
            name = await asyncio.wait_for(message.timezone(), TIMEZONE_LOOKUP_S)
        except Exception:  # the platform's lookup failed or hung: the default serves
            log.warning("could not look up the time zone of %s", message.user_id, exc_info=True)
            return None
        if not name:
            return None
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            return None
        return name


def _moment(at: float, timezone: str) -> str:
    """``Mon 30 Nov 2026 09:00 CET`` in ``timezone``."""
    return datetime.fromtimestamp(at, ZoneInfo(timezone)).strftime("%a %d %b %Y %H:%M %Z")


def _line(schedule: Schedule) -> str:
    """One schedule in the ``schedules`` list."""
    if schedule.next_run_at is None or not schedule.enabled:
        state = f"stopped: {schedule.disabled_reason}"
    else:
        state = f"next {_moment(schedule.next_run_at, schedule.timezone)}"
    return (
        f"• #{schedule.number} {schedule.described} ({schedule.timezone}) — {state} — “{shown(schedule.question)}” "
        f"— by {shown(schedule.creator_name)}"
    )
