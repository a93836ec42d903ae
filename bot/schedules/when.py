"""When a schedule runs: a plain phrase or a cron expression, read into one cron rule.

Accepted at the start of ``schedule <when> <question>`` (case does not matter)::

    every monday 9:00        every mon, thu at 6pm     mondays 9
    daily 18:30              every day at noon          weekdays 8:15
    every hour               hourly                     every 2 hours
    every 30 minutes         weekly                     monthly on the 1st at 7:00
    0 9 * * 1                (cron: minute hour day-of-month month day-of-week)

A time zone may follow the time (``every monday 9:00 Europe/Paris``); otherwise the author's,
else ``schedules.timezone``. Fire times come from apscheduler's :class:`CronTrigger` with the
day-of-week field written as names: its numbers start at Monday, cron's at Sunday.

Time zones: the trigger is always asked from a UTC instant (so the repeated hour of a
fall-back keeps its fold) and each answer is checked to be later than the instant asked about.
A wall-clock time that a fall-back repeats runs once, at its first pass, unless the rule runs
every hour (then each real hour has its run); a time a spring-forward skips runs once, just
after the change (apscheduler's choice, as cron's).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from apscheduler.triggers.cron import CronTrigger

#: Runs closer together than this are refused (a model turn each time costs tokens).
MIN_INTERVAL_S = 5 * 60

_TOO_OFTEN = f"that is too often (scheduled runs must be at least {MIN_INTERVAL_S // 60} minutes apart)"

DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")  # cron's numbering: 0 (and 7) is Sunday
_DAY_NAMES = {
    "sunday": "sun",
    "monday": "mon",
    "tuesday": "tue",
    "wednesday": "wed",
    "thursday": "thu",
    "friday": "fri",
    "saturday": "sat",
    "tues": "tue",
    "thur": "thu",
    "thurs": "thu",
    **{day: day for day in DAYS},
}
_SHOWN_DAYS = {
    "sun": "Sunday",
    "mon": "Monday",
    "tue": "Tuesday",
    "wed": "Wednesday",
    "thu": "Thursday",
    "fri": "Friday",
    "sat": "Saturday",
}

_TIME = r"(?P<time>noon|midnight|\d{1,2}(?::\d{2})?\s*(?:am|pm)?)(?![\w:])"
_AT_TIME = rf"(?:\s+(?:at\s+)?{_TIME})?"
_DAY = r"(?:sun|mon|tues?|wed(?:nes)?|thu(?:rs?)?|fri|sat(?:ur)?)(?:days?|s)?\b"
_DAY_LIST = rf"(?P<days>{_DAY}(?:\s*(?:,|and|&)\s*{_DAY})*)"
_PHRASES = (
    ("seconds", re.compile(r"every\s+(?:\d+\s+)?(?:seconds?|secs?)\b")),
    ("minute", re.compile(r"(?:every\s+minute|each\s+minute|minutely)\b")),
    ("minutes", re.compile(r"every\s+(?P<n>\d+)\s+(?:minutes?|mins?)\b")),
    ("hours", re.compile(r"every\s+(?P<n>\d+)\s+hours?\b")),
    ("hourly", re.compile(r"(?:hourly|every\s+hour)\b")),
    ("weekdays", re.compile(rf"(?:weekdays|every\s+weekday|every\s+work\s*day)\b{_AT_TIME}")),
    ("daily", re.compile(rf"(?:daily|every\s+day|every\s+night)\b{_AT_TIME}")),
    ("weekly", re.compile(rf"weekly(?:\s+on\s+{_DAY_LIST})?\b{_AT_TIME}")),
    ("monthly", re.compile(rf"monthly(?:\s+on\s+(?:the\s+)?(?P<dom>\d{{1,2}})(?:st|nd|rd|th)?)?\b{_AT_TIME}")),
    ("days", re.compile(rf"(?:every\s+(?:week\s+on\s+)?|on\s+)?{_DAY_LIST}\b{_AT_TIME}")),
)
_CRON_FIELD = r"[0-9a-z*/,\-?]+"
_CRON = re.compile(rf"(?P<cron>{_CRON_FIELD}(?:\s+{_CRON_FIELD}){{4}})(?=\s|$)")


class WhenError(ValueError):
    """The schedule's time could not be read; ``str()`` is one sentence for the person."""


@dataclass(frozen=True, slots=True)
class When:
    """A schedule's rule: a five-field cron expression in a time zone, and how to say it."""

    cron: str
    timezone: str
    described: str

    def next_after(self, moment: float) -> float:
        """The first run strictly after ``moment`` (a Unix time); see the module docstring on
        daylight-saving changes."""
        trigger = _trigger(self.cron, self.timezone)
        every_hour = self.cron.split()[1] == "*"
        after = moment
        for _ in range(_MAX_SKIPS):
            start = datetime.fromtimestamp(math.floor(after) + 1, UTC)
            fire = trigger.get_next_fire_time(None, start)
            if fire is None:  # a cron rule with no future run (e.g. February 30th)
                break
            at = float(fire.timestamp())
            if at > moment and (every_hour or not _second_pass(fire)):
                return at
            after = max(at, after + 1)
        raise WhenError("that time never comes")


@dataclass(frozen=True, slots=True)
class Parsed:
    """A ``<when> <question>`` message taken apart."""

    when: When
    question: str


def parse_schedule(text: str, *, default_timezone: str) -> Parsed:
    """Read ``<when> <question>``; raises :class:`WhenError` naming what is wrong."""
    text = text.strip()
    # Lower case, letter for letter (str.lower() may lengthen a few letters; positions must hold).
    lowered = "".join(c.lower() if len(c.lower()) == 1 else c for c in text)
    cron_match = _CRON.match(lowered)
    if cron_match is not None and _looks_like_cron(cron_match["cron"]):
        cron = _normal_cron(cron_match["cron"])
        described, end = f"on cron `{' '.join(cron_match['cron'].split())}`", cron_match.end()
    else:
        cron, described, end = _phrase(lowered)
    timezone, end = _timezone_at(text, end, default_timezone)
    question = text[end:].strip().lstrip(":,;-–—").strip()
    if not question:
        raise WhenError("say what to ask after the time, e.g. `schedule every monday 9:00 revenue by region`")
    when = When(cron=cron, timezone=timezone, described=described)
    _check_interval(when)
    return Parsed(when=when, question=question)


def _phrase(lowered: str) -> tuple[str, str, int]:
    """The cron rule, description and end of the phrase at the start of ``lowered``."""
    for kind, pattern in _PHRASES:
        match = pattern.match(lowered)
        if match is None:
            continue
        groups = match.groupdict()
        if kind in ("seconds", "minute"):
            raise WhenError(_TOO_OFTEN)
        if kind == "minutes":
            n = int(groups["n"])
            if n * 60 < MIN_INTERVAL_S:
                raise WhenError(_TOO_OFTEN)
            if not 1 <= n <= 59 or 60 % n:
                raise WhenError("minutes must divide the hour (5, 10, 15, 20, 30)")
            return f"*/{n} * * * *", f"every {n} minutes", match.end()
        if kind == "hours":
            n = int(groups["n"])
            if not 1 <= n <= 23:
                raise WhenError("say between 1 and 23 hours, or `daily`")
            return (f"0 */{n} * * *", "every hour" if n == 1 else f"every {n} hours", match.end())
        if kind == "hourly":
            return "0 * * * *", "every hour", match.end()
        hour, minute = _time(groups.get("time"))
        at = f"at {hour:02d}:{minute:02d}"
        if kind == "weekdays":
            return f"{minute} {hour} * * mon-fri", f"every weekday {at}", match.end()
        if kind == "daily":
            return f"{minute} {hour} * * *", f"every day {at}", match.end()
        if kind == "monthly":
            dom = int(groups.get("dom") or 1)
            if not 1 <= dom <= 28:
                raise WhenError("a monthly run takes a day from the 1st to the 28th (every month has those)")
            return f"{minute} {hour} {dom} * *", f"every month on day {dom} {at}", match.end()
        days = _days(groups.get("days") or "mon")
        shown = " and ".join(_SHOWN_DAYS[d] for d in days)
        return f"{minute} {hour} * * {','.join(days)}", f"every {shown} {at}", match.end()
    raise WhenError(
        "I could not read when to run it (start with e.g. `every monday 9:00`, `daily 18:30`, `every hour` "
        "or a cron expression like `0 9 * * 1`)"
    )


def _time(text: str | None) -> tuple[int, int]:
    """(hour, minute) of ``9``, ``9:30``, ``6pm``, ``6:30 pm``, ``noon``, ``midnight``; 09:00 when absent."""
    if text is None:
        return 9, 0
    text = text.replace(" ", "")
    if text in ("noon", "midnight"):
        return (12 if text == "noon" else 0), 0
    match = re.fullmatch(r"(\d{1,2})(?::(\d{2}))?(am|pm)?", text)
    if match is None:
        raise WhenError(f"I could not read the time {text!r}")
    hour, minute, half = int(match[1]), int(match[2] or 0), match[3]
    if half is not None:
        if not 1 <= hour <= 12:
            raise WhenError(f"{text!r} is not a time")
        hour = hour % 12 + (12 if half == "pm" else 0)
    if hour > 23 or minute > 59:
        raise WhenError(f"{text!r} is not a time (use 0:00 to 23:59)")
    return hour, minute


def _days(text: str) -> list[str]:
    """Cron day names, in week order, for ``mon, thu`` / ``mondays and fridays``."""
    found: set[str] = set()
    for word in re.split(r"\s*(?:,|and|&)\s*", text):
        word = word.strip()
        name = _DAY_NAMES.get(word) or _DAY_NAMES.get(word.removesuffix("s"))
        if name is None:
            raise WhenError(f"{word!r} is not a day of the week")
        found.add(name)
    # Monday first, as people read a week.
    return sorted(found, key=lambda d: (DAYS.index(d) + 6) % 7)


def _timezone_at(text: str, start: int, default: str) -> tuple[str, int]:
    """A time zone name right after the time (``Europe/Paris``, ``UTC``), else ``default``."""
    match = re.compile(r"\s+(?:in\s+)?([A-Za-z_]+(?:/[A-Za-z0-9_+\-]+)+|UTC|utc|GMT|gmt)(?=\s|$)").match(text, start)
    if match is None:
        return default, start
    name = match[1]
    zone = "UTC" if name.lower() in ("utc", "gmt") else _zone_named(name)
    if zone is None:
        raise WhenError(f"{name!r} is not a time zone I know (an IANA name such as Europe/Paris)")
    return zone, match.end()


def _zone_named(name: str) -> str | None:
    """The IANA zone ``name`` (any case), or None."""
    return _zones_by_lower_name().get(name.lower())


@cache
def _zones_by_lower_name() -> dict[str, str]:
    """(Reads the time zone database once) every IANA zone by its lower-case name."""
    return {zone.lower(): zone for zone in available_timezones()}


def _looks_like_cron(text: str) -> bool:
    """Five fields that each hold a digit, ``*`` or ``?`` (a phrase never does in all five)."""
    return all(re.search(r"[\d*?]", field) for field in text.split())


def _normal_cron(text: str) -> str:
    """A valid cron expression with its day-of-week field in names; :class:`WhenError` if not."""
    minute, hour, dom, month, dow = text.replace("?", "*").split()
    if dom != "*" and dow != "*":
        # cron runs when either matches, apscheduler when both do: ask for one, so both agree.
        raise WhenError("give a day of the month or days of the week, not both")
    cron = f"{minute} {hour} {dom} {month} {_dow_names(dow)}"
    try:
        _trigger(cron, "UTC")
    except ValueError as exc:
        raise WhenError(f"that is not a cron expression I can use ({exc})") from None
    return cron


def _dow_names(field: str) -> str:
    """Cron's day-of-week field (0 or 7 = Sunday; names; ranges, lists, steps) as a list of names."""
    if field == "*":
        return "*"
    days: set[int] = set()
    for part in field.split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else None
        if step_text and step is None:
            raise WhenError(f"{part!r} is not a day-of-week step")
        if base == "*":
            first, last = 0, 6
        else:
            low, _, high = base.partition("-")
            first = _day_number(low)
            last = _day_number(high) if high else (6 if step else first)
        if last == 0 and first > 0:  # a range ending on Sunday written as 7
            last = 7
        days.update(day % 7 for day in range(first, last + 1, step or 1))
    return ",".join(DAYS[day] for day in sorted(days, key=lambda d: (d + 6) % 7))


def _day_number(text: str) -> int:
    """0..7 for a cron day-of-week value (a number or a name)."""
    if text.isdigit() and 0 <= int(text) <= 7:
        return int(text)
    name = _DAY_NAMES.get(text)
    if name is None:
        raise WhenError(f"{text!r} is not a day of the week (0-7 or mon-sun)")
    return DAYS.index(name)


#: Fire times skipped at most before giving up (the second passes of one fall-back).
_MAX_SKIPS = 120


def _second_pass(fire: datetime) -> bool:
    """True for a wall-clock time's second pass in a fall-back (the repeated hour)."""
    return fire.fold == 1 and fire.replace(fold=0).utcoffset() != fire.utcoffset()


@cache
def _trigger(cron: str, timezone: str) -> CronTrigger:
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise WhenError(f"{timezone!r} is not a time zone I know") from None
    return CronTrigger.from_crontab(cron, timezone=zone)


def _check_interval(when: When) -> None:
    """Refuse rules that run more often than :data:`MIN_INTERVAL_S` (judged over a day's runs)."""
    moment = datetime(2026, 1, 5, tzinfo=ZoneInfo("UTC")).timestamp()  # any Monday
    fires = [when.next_after(moment)]
    for _ in range(24):
        fires.append(when.next_after(fires[-1]))
    if min(b - a for a, b in zip(fires, fires[1:])) < MIN_INTERVAL_S:
        raise WhenError(_TOO_OFTEN)
