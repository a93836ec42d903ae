"""Scheduled analyses through the real core (store, kernels, scripted model) on a clock the test
moves: the phrases and cron read right; a schedule fires into its thread as a normal turn with
its chart; a restart keeps it and a missed slot runs once; two schedulers on one store run a
slot once; removal rights; the most a thread may hold; a gone thread stops its schedule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from bot.app import Core
from bot.events import ThreadKey
from bot.schedules.commands import is_schedule_command
from bot.schedules.runner import THREAD_GONE, Scheduler
from bot.schedules.when import WhenError, parse_schedule
from bot.store import NewSchedule, Store
from bot.turn import SCHEDULED_RUN_NOTE
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat, MemoryOutbox
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

#: Tuesday 2026-11-24 10:00 UTC.
TUESDAY = datetime(2026, 11, 24, 10, 0, tzinfo=ZoneInfo("UTC")).timestamp()
CHART = "import matplotlib.pyplot as plt\nplt.bar(['north', 'south'], [3, 5])\nplt.title('Revenue')\nplt.show()"


class Clock:
    """A clock the test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class MemoryReach:
    """Reaches the test platform's threads, recording what each scheduled run said."""

    def __init__(self) -> None:
        self.outboxes: dict[ThreadKey, list[MemoryOutbox]] = {}
        self.gone: set[ThreadKey] = set()

    def outbox_for(self, key: ThreadKey) -> MemoryOutbox | None:
        if key.platform != "test":
            return None
        outbox = MemoryOutbox()
        self.outboxes.setdefault(key, []).append(outbox)
        return outbox

    async def thread_open(self, key: ThreadKey) -> bool:
        return key not in self.gone

    def runs(self, key: ThreadKey) -> list[MemoryOutbox]:
        """The outboxes scheduled runs posted into (those the scheduler only probed with are empty)."""
        return [o for o in self.outboxes.get(key, []) if o.notices or o.replies]


@asynccontextmanager
async def running(tmp_path: Path, llm: ScriptedOpenAI, clock: Clock, **sections: dict[str, Any]) -> AsyncIterator[Core]:
    async with Core.open(make_settings(tmp_path, llm_url=llm.base_url, **sections), clock=clock) as core:
        yield core


def scheduler_of(core: Core, reach: MemoryReach, clock: Clock) -> Scheduler:
    """The scheduler ``start_schedules`` builds, polled by the test's hand."""
    return Scheduler(
        book=core.store.schedules, handle=core.dispatcher.handle, reaches=core.reaching([reach]), clock=clock
    )


async def tick(scheduler: Scheduler) -> int:
    """One poll; wait for the runs it started; how many there were."""
    runs = await scheduler.tick()
    await asyncio.gather(*runs)
    return len(runs)


@pytest.mark.parametrize(
    ("text", "cron", "described", "first_run"),
    [
        ("every monday 9:00 revenue by region", "0 9 * * mon", "every Monday at 09:00", "Mon 30 09:00"),
        ("daily 18:30 sales", "30 18 * * *", "every day at 18:30", "Tue 24 18:30"),
        ("every hour check", "0 * * * *", "every hour", "Tue 24 11:00"),
        ("weekdays at 8:15am report", "15 8 * * mon-fri", "every weekday at 08:15", "Wed 25 08:15"),
        ("every mon, thu at 6pm q", "0 18 * * mon,thu", "every Monday and Thursday at 18:00", "Thu 26 18:00"),
        ("fridays noon q", "0 12 * * fri", "every Friday at 12:00", "Fri 27 12:00"),
        ("every 30 minutes q", "*/30 * * * *", "every 30 minutes", "Tue 24 10:30"),
        ("monthly on the 1st at 7:00 q", "0 7 1 * *", "every month on day 1 at 07:00", "Tue 01 07:00"),
        # cron numbers Sunday 0 (and 7); apscheduler Monday 0: stored as names, so 1 is Monday.
        ("0 9 * * 1 q", "0 9 * * mon", "on cron `0 9 * * 1`", "Mon 30 09:00"),
        ("30 8 * * 5-7 q", "30 8 * * fri,sat,sun", "on cron `30 8 * * 5-7`", "Fri 27 08:30"),
    ],
)
def test_phrases_and_cron_become_cron_rules(text: str, cron: str, described: str, first_run: str) -> None:
    parsed = parse_schedule(text, default_timezone="UTC")
    assert (parsed.when.cron, parsed.when.described, parsed.when.timezone) == (cron, described, "UTC")
    assert f"{datetime.fromtimestamp(parsed.when.next_after(TUESDAY), ZoneInfo('UTC')):%a %d %H:%M}" == first_run
    assert parsed.question in text and parsed.question


def test_a_time_zone_after_the_time_is_the_schedules() -> None:
    parsed = parse_schedule("every monday 9:00 Europe/Paris revenue", default_timezone="UTC")
    assert (parsed.when.timezone, parsed.question) == ("Europe/Paris", "revenue")
    nine_in_paris = datetime(2026, 11, 30, 9, 0, tzinfo=ZoneInfo("Europe/Paris")).timestamp()
    assert parsed.when.next_after(TUESDAY) == nine_in_paris  # 08:00 UTC in winter


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tomorrow please", "could not read when"),
        ("every monday", "say what to ask"),
        ("daily 25:00 q", "is not a time"),
        ("* * * * * q", "at least 5 minutes apart"),
        ("every 7 minutes q", "divide the hour"),
        ("0 9 1 * 1 q", "not both"),
        ("every monday 9:00 Mars/Olympus q", "not a time zone"),
    ],
)
def test_unreadable_times_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(WhenError, match=says):
        parse_schedule(text, default_timezone="UTC")


async def test_a_schedule_runs_as_a_turn_with_its_chart_and_a_missed_slot_runs_once(
    tmp_path: Path, llm: ScriptedOpenAI
) -> None:
    clock, reach = Clock(TUESDAY), MemoryReach()
    async with running(tmp_path, llm, clock) as core:
        chat = MemoryChat(core.dispatcher)
        confirmed = (await chat.say("schedule every hour revenue by region as a chart")).reply.text
        assert confirmed.startswith("⏰ Scheduled #1: every hour (UTC). Next run: Tue 24 Nov 2026 11:00 UTC.")
        scheduler = scheduler_of(core, reach, clock)
        assert await tick(scheduler) == 0  # not due yet
        clock.now += 3600
        llm.script(tool_call(CHART), answer("North 3, south 5."))
        assert await tick(scheduler) == 1
        (run,) = reach.runs(chat.key())
        assert run.notices == ["⏰ Scheduled run #1 (every hour, UTC): “revenue by region as a chart”"]
        assert run.reply.text == "North 3, south 5." and len(run.reply.images) == 1
        asked = llm.requests[-2]["messages"][-1]["content"]
        assert asked.startswith(SCHEDULED_RUN_NOTE.format(when="every hour")[:40]) and asked.endswith(
            "revenue by region as a chart"
        )
        assert await tick(scheduler) == 0  # that slot is done

    clock.now += 5 * 3600 + 600  # down over five slots: it runs once when back, then on the hour
    async with running(tmp_path, llm, clock) as core:
        scheduler = scheduler_of(core, reach, clock)
        llm.script(answer("again"))
        assert await tick(scheduler) == 1 and await tick(scheduler) == 0
        assert reach.runs(chat.key())[-1].reply.text == "again"
        listed = (await MemoryChat(core.dispatcher).say("schedules")).reply.text
        assert "#1 every hour (UTC) — next Tue 24 Nov 2026 17:00 UTC — “revenue by region as a chart” — by u1" in listed


async def test_the_run_header_shows_no_host_path(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    clock, reach = Clock(TUESDAY), MemoryReach()
    workspaces = str(tmp_path / "workspaces")
    async with running(tmp_path, llm, clock) as core:
        chat = MemoryChat(core.dispatcher)
        await chat.say(f"schedule every hour list {workspaces}/other-thread")
        clock.now += 3600
        llm.script(answer("Nothing there."))
        assert await tick(scheduler_of(core, reach, clock)) == 1
        (run,) = reach.runs(chat.key())
        assert run.notices[0].startswith("⏰ Scheduled run #1") and "list " in run.notices[0]
        assert workspaces not in run.notices[0]  # the question is quoted as a person may see it


async def test_removal_rights_and_the_most_a_thread_holds(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    sections: dict[str, Any] = {"access": {"admins": ["test:U_BOSS"]}, "schedules": {"max_per_thread": 2}}
    async with running(tmp_path, llm, Clock(TUESDAY), **sections) as core:
        chat = MemoryChat(core.dispatcher)
        assert "#1" in (await chat.say("schedule daily 9:00 one")).reply.text
        assert "#2" in (await chat.say("schedule daily 10:00 two", user="U2")).reply.text
        full = (await chat.say("schedule daily 11:00 three")).reply.text
        assert full.startswith("⚠️ This thread already has 2 schedules")
        refused = (await chat.say("unschedule 1", user="U2")).reply.text
        assert refused == "Only u1, who made schedule #1, or an admin can remove it."
        assert (await chat.say("unschedule #2", user="U_BOSS")).reply.text.startswith("🗑️ Schedule #2 removed")
        assert (await chat.say("unschedule 1")).reply.text.startswith("🗑️ Schedule #1 removed")
        assert (
            await chat.say("unschedule 1")
        ).reply.text == "There is no schedule #1 in this thread; `schedules` lists them."
        assert (await chat.say("schedules")).reply.text.startswith("This thread has no schedules.")
        assert llm.requests == []  # commands, never turns


async def test_the_authors_time_zone_and_a_disabled_bot(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    async def new_york() -> str | None:
        return "America/New_York"

    async with running(tmp_path, llm, Clock(TUESDAY)) as core:
        chat = MemoryChat(core.dispatcher)
        text = (await chat.send(chat.message("schedule daily 9:00 report", timezone=new_york))).reply.text
        assert "every day at 09:00 (America/New_York). Next run: Tue 24 Nov 2026 09:00 EST." in text
    async with running(tmp_path, llm, Clock(TUESDAY), schedules={"enabled": False}) as core:
        text = (await MemoryChat(core.dispatcher).say("schedule daily 9:00 report")).reply.text
        assert text == "Scheduled runs are turned off on this bot (`schedules.enabled`)."


async def test_a_gone_thread_stops_its_schedule(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    clock, reach = Clock(TUESDAY), MemoryReach()
    async with running(tmp_path, llm, clock) as core:
        chat = MemoryChat(core.dispatcher)
        await chat.say("schedule every hour report")
        reach.gone.add(chat.key())
        clock.now += 3600
        assert await tick(scheduler_of(core, reach, clock)) == 1
        assert reach.runs(chat.key()) == [] and llm.requests == []
        (schedule,) = await core.store.schedules.of_thread(chat.key())
        assert (schedule.enabled, schedule.disabled_reason, schedule.next_run_at) == (False, THREAD_GONE, None)
        clock.now += 3600
        assert await tick(scheduler_of(core, reach, clock)) == 0


async def test_two_schedulers_on_one_store_run_a_slot_once(store_target: Path | str) -> None:
    async with await Store.open(store_target) as first, await Store.open(store_target) as second:
        new = NewSchedule(
            thread=ThreadKey("test", "W1", "C1", "t1"),
            creator="U1",
            creator_name="u1",
            question="q",
            cron="0 * * * *",
            timezone="UTC",
            described="every hour",
            created_at=TUESDAY,
            next_run_at=TUESDAY + 3600,
        )
        await first.schedules.add(new, max_per_thread=5)
        due = [await store.schedules.due(TUESDAY + 3601) for store in (first, second)]
        assert len(due[0]) == len(due[1]) == 1
        claims = await asyncio.gather(
            *(
                store.schedules.claim(found[0], now=TUESDAY + 3601, next_run_at=TUESDAY + 7200)
                for store, found in zip((first, second), due)
            )
        )
        assert sorted(claims) == [False, True]
        assert await first.schedules.due(TUESDAY + 3601) == []


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("schedule every monday 9:00 revenue", True),
        ("schedule", True),
        ("/schedules", True),
        ("schedules", True),
        ("unschedule 2", True),
        ("unschedule", True),
        ("Schedule daily 8:00 the report", True),
        ("schedules for next week: which ones are late?", False),
        ("unschedule the meeting and tell me why", False),
        ("scheduled jobs in jobs.csv: count them", False),
        ("what is my schedule?", False),
        ("", False),
    ],
)
def test_schedules_and_unschedule_are_commands_only_as_the_whole_message(text: str, command: bool) -> None:
    assert is_schedule_command(text) is command


NEW_YORK = ZoneInfo("America/New_York")


@pytest.mark.parametrize(
    ("cron", "start", "expected"),
    [
        # Fall-back (2026-11-01, 02:00 EDT → 01:00 EST): every real hour once, 01:00 twice.
        (
            "0 * * * *",
            datetime(2026, 11, 1, 0, 10),
            ["01 01:00-0400", "01 01:00-0500", "01 02:00-0500", "01 03:00-0500"],
        ),
        # The repeated half hour runs once, at its first pass.
        ("30 1 * * *", datetime(2026, 10, 31, 12, 0), ["01 01:30-0400", "02 01:30-0500", "03 01:30-0500"]),
        # Spring-forward (2026-03-08, 02:00 EST → 03:00 EDT): 02:00 never comes; 02:30 runs once, after.
        (
            "0 * * * *",
            datetime(2026, 3, 8, 0, 10),
            ["08 01:00-0500", "08 03:00-0400", "08 04:00-0400", "08 05:00-0400"],
        ),
        ("30 2 * * *", datetime(2026, 3, 7, 12, 0), ["08 03:30-0400", "09 02:30-0400", "10 02:30-0400"]),
    ],
)
def test_next_runs_across_daylight_saving_changes(cron: str, start: datetime, expected: list[str]) -> None:
    when = parse_schedule(f"{cron} q", default_timezone="America/New_York").when
    moment, runs = start.replace(tzinfo=NEW_YORK).timestamp(), []
    for _ in expected:
        following = when.next_after(moment)
        assert following > moment  # never the same or an earlier instant
        moment = following
        runs.append(f"{datetime.fromtimestamp(moment, NEW_YORK):%d %H:%M%z}")
    assert runs == expected


@pytest.mark.parametrize(
    ("question", "start", "end", "expected"),
    [
        ("every hour America/New_York report", datetime(2026, 11, 1, 0, 50), datetime(2026, 11, 1, 3, 20), 4),
        ("daily 1:30 America/New_York report", datetime(2026, 11, 1, 0, 50), datetime(2026, 11, 1, 3, 20), 1),
        ("every hour America/New_York report", datetime(2026, 3, 8, 0, 50), datetime(2026, 3, 8, 4, 20), 3),
        ("daily 2:30 America/New_York report", datetime(2026, 3, 8, 0, 50), datetime(2026, 3, 8, 4, 20), 1),
    ],
)
async def test_one_run_per_slot_while_the_clock_crosses_a_daylight_saving_change(
    tmp_path: Path, llm: ScriptedOpenAI, question: str, start: datetime, end: datetime, expected: int
) -> None:
    """The bot's clock starts just before the change and polls every 10 s (as the scheduler
    does) until after it: a run per real slot, no run at every poll."""
    first = start.replace(tzinfo=NEW_YORK).timestamp()
    last = end.replace(tzinfo=NEW_YORK).timestamp()
    clock, reach = Clock(first), MemoryReach()
    async with running(tmp_path, llm, clock) as core:
        chat = MemoryChat(core.dispatcher)
        assert (await chat.say(f"schedule {question}")).reply.text.startswith("⏰ Scheduled #1")
        scheduler = scheduler_of(core, reach, clock)
        llm.script(*(answer("ok") for _ in range(expected + 2)))
        started: list[float] = []
        while clock.now < last:
            if await tick(scheduler):
                started.append(clock.now)
            clock.now += 10
        assert len(started) == expected, [f"{datetime.fromtimestamp(t, NEW_YORK):%H:%M:%S%z}" for t in started]
        assert all(b - a >= 3600 - 10 for a, b in zip(started, started[1:]))
        assert len(reach.runs(chat.key())) == expected


async def test_a_refused_schedule_is_one_line_naming_why(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    async with running(tmp_path, llm, Clock(TUESDAY)) as core:
        chat = MemoryChat(core.dispatcher)
        for text, reason in [
            ("schedule every minute report", "too often"),
            ("schedule every 30 seconds report", "too often"),
            ("schedule */2 * * * * report", "too often"),
            ("schedule whenever you like report", "could not read when"),
        ]:
            refused = (await chat.say(text)).reply.text
            assert refused.startswith("⚠️ Not scheduled: ") and reason in refused and "\n" not in refused
            assert "`schedules` lists" not in refused  # the help paragraph only on request
        assert (await chat.say("schedule help")).reply.text.startswith("To ask a question again at set times")
        assert await core.store.schedules.of_thread(chat.key()) == []
