"""Scheduled analyses on Slack, end to end (real bolt + slack_sdk, Core, kernels; fake Slack and
model): ``schedule`` in a thread confirms in the author's time zone, the run posts its answer
and chart into that thread and no other, and a thread Slack says is gone stops its schedule."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from bot.events import ThreadKey
from bot.schedules.runner import THREAD_GONE, Scheduler
from tests.fakes.openai_server import answer, tool_call
from tests.slack.conftest import Bot, running_bot

PLOT = "import matplotlib.pyplot as plt\nplt.bar(['north', 'south'], [5, 3])\nplt.show()"
WEEK_S = 7 * 24 * 3600


async def run_due(bot: Bot, at: float) -> int:
    """Run what is due at ``at`` through the Slack adapter; how many runs there were."""
    scheduler = Scheduler(
        book=bot.core.store.schedules, handle=bot.core.dispatcher.handle, reaches=[bot.adapter], clock=lambda: at
    )
    runs = await scheduler.tick()
    await asyncio.gather(*runs)
    return len(runs)


async def test_a_schedule_posts_its_answer_and_chart_into_its_thread(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False) as bot:
        slack = bot.slack
        slack.user_timezones["U1"] = "Europe/Paris"
        event = slack.mention("C_SCHED", "schedule every monday 9:00 revenue by region as a chart")
        await slack.post_event(bot.events_url, event)
        assert await bot.finished(event) == {"white_check_mark"}
        [confirmed] = bot.answers(event)
        assert confirmed.startswith("⏰ Scheduled #1: every Monday at 09:00 (Europe/Paris). Next run: Mon ")
        other = slack.mention("C_SCHED", "hello")  # another thread of the channel
        bot.llm.script(answer("Hi."))
        await slack.post_event(bot.events_url, other)
        await bot.finished(other)

        bot.llm.script(tool_call(PLOT), answer("North leads with 5."))
        assert await run_due(bot, time.time() + WEEK_S) == 1
        texts = bot.answers(event)
        assert texts[1] == "⏰ Scheduled run #1 (every Monday at 09:00, Europe/Paris): “revenue by region as a chart”"
        [answered] = [m for m in slack.bot_messages("C_SCHED", event["ts"]) if m.text == "North leads with 5."]
        [chart] = [u for u in slack.uploads if u.file_id in answered.files]
        assert chart.data.startswith(b"\x89PNG") and chart.thread_ts == event["ts"]
        assert bot.answers(other) == ["Hi."]

        slack.delete_thread("C_SCHED", event["ts"])
        posted = len(slack.messages)
        assert await run_due(bot, time.time() + 2 * WEEK_S) == 1
        assert len(slack.messages) == posted  # nothing posted
        [schedule] = await bot.core.store.schedules.of_thread(ThreadKey("slack", "T1", "C_SCHED", event["ts"]))
        assert schedule.disabled_reason == THREAD_GONE


def next_fall_back(zone: ZoneInfo) -> float:
    """When ``zone`` next sets its clocks back (the first hour after now whose UTC offset is
    smaller than the hour's before), as a timestamp."""
    at = int(time.time()) // 3600 * 3600 + 3600
    while True:
        before = datetime.fromtimestamp(at - 3600, zone).utcoffset()
        after = datetime.fromtimestamp(at, zone).utcoffset()
        if before is not None and after is not None and after < before:
            return float(at)
        at += 3600


async def test_every_hour_across_the_fall_back_posts_once_per_hour(tmp_path: Path) -> None:
    """Issue 31: ``every hour America/New_York`` across the November fall-back posted a run header
    at every poll. The scheduler's clock goes from just before the change to after it, polling
    every 10 s: one run per real hour (01:00 twice, EDT then EST), nothing at the other polls."""
    new_york = ZoneInfo("America/New_York")
    async with running_bot(tmp_path, socket_mode=False) as bot:
        slack = bot.slack
        event = slack.mention("C_DST", "schedule every hour America/New_York report")
        await slack.post_event(bot.events_url, event)
        assert await bot.finished(event) == {"white_check_mark"}
        fall_back = next_fall_back(new_york) - 70 * 60  # 00:50 EDT before the next change
        bot.llm.script(*(answer("ok") for _ in range(4)))
        runs_at: list[str] = []
        for step in range(0, 150 * 60, 10):  # 2.5 real hours: to 02:20 EST
            at = fall_back + step
            if await run_due(bot, at):
                runs_at.append(f"{datetime.fromtimestamp(at, new_york):%H:%M%z}")
        # 00:50: the slots missed since the schedule was made, once; then each real hour.
        assert runs_at == ["00:50-0400", "01:00-0400", "01:00-0500", "02:00-0500"]
        headers = [t for t in bot.answers(event) if t.startswith("⏰ Scheduled run #1")]
        assert len(headers) == 4
