"""Budgets and usage reports through the real core (store, kernels, scripted model), on a clock
the test moves: a spent budget refuses the next turn with one sentence saying what ran out and
when it comes back, it comes back on time, and it holds across a restart; ``usage`` shows what
the store holds; ``usage all`` is for admins only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bot.app import Core
from bot.budgets import DAY_S
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat, MemoryOutbox
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

#: 2026-11-24 10:00 UTC: 14 h before the daily budgets reset.
MORNING = 1_795_514_400.0


class Clock:
    """A clock the test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def running(
    tmp_path: Path, server: ScriptedOpenAI, clock: Clock, **sections: dict[str, Any]
) -> AsyncIterator[MemoryChat]:
    async with Core.open(make_settings(tmp_path, llm_url=server.base_url, **sections), clock=clock) as core:
        yield MemoryChat(core.dispatcher)


def said(outbox: MemoryOutbox) -> str:
    return "\n".join([*outbox.notices, *(r.text for r in outbox.replies)])


async def test_a_spent_daily_token_budget_refuses_resets_and_survives_a_restart(
    tmp_path: Path, llm: ScriptedOpenAI
) -> None:
    clock = Clock(MORNING)
    limits = {"limits": {"tokens_per_user_day": 1000}}
    async with running(tmp_path, llm, clock, **limits) as chat:
        llm.script(answer("first", usage=(900, 150)))
        assert said(await chat.say("question 1")) == "first"
        before = len(llm.requests)
        refused = await chat.say("question 2")
        assert said(refused) == "🪫 You have used your 1,000 tokens for today. It resets at 00:00 UTC, in 14 h."
        assert not refused.replies[0].ok and len(llm.requests) == before  # no model call, no kernel work
        other = await chat.say("question from someone else", user="U2")  # a person's budget is theirs
        assert "🪫" not in said(other)

    clock.now += 3600  # an hour later, after a restart: still spent (counted in the store)
    async with running(tmp_path, llm, clock, **limits) as chat:
        assert "in 13 h" in said(await chat.say("question 3"))
        clock.now = MORNING - MORNING % DAY_S + DAY_S + 60  # 00:01 the next day
        llm.script(answer("a new day"))
        assert said(await chat.say("question 4")) == "a new day"


async def test_a_turn_stops_between_rounds_when_its_tokens_run_out(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    clock = Clock(MORNING)
    async with running(tmp_path, llm, clock, limits={"tokens_per_channel_day": 500}) as chat:
        llm.script(
            tool_call("x = 1", usage=(200, 50)),
            tool_call("x = 2", usage=(250, 50)),  # now 550: the second run must not happen
            answer("never asked"),
        )
        outbox = await chat.say("work hard")
        reply = outbox.replies[0]
        assert reply.text.startswith("🪫 Stopped here: this channel's 500 tokens for today ran out during this answer.")
        assert not reply.ok and len(llm.requests) == 2
        assert llm.remaining == 1  # the answer was never asked for
        llm.script(answer("ok"))
        variables = await chat.say("again")  # the channel is spent: refused before the model
        assert said(variables).startswith("🪫 This channel has used its 500 tokens for today.")
        assert llm.remaining == 2  # nothing was asked


async def test_turns_per_minute_and_kernel_seconds(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    clock = Clock(MORNING)
    sections: dict[str, Any] = {
        "limits": {"turns_per_user_minute": 2},
        "channels": {"test:C1": {"limits": {"kernel_seconds_per_user_day": 0.5}}},
    }
    async with running(tmp_path, llm, clock, **sections) as chat:
        llm.script(answer("one"), answer("two"), answer("three"))
        assert said(await chat.say("1")) == "one"
        clock.now += 20
        assert said(await chat.say("2")) == "two"
        clock.now += 10
        assert (
            said(await chat.say("3"))
            == "⏱️ You have asked 2 questions in the last minute, the most allowed here; please ask again in 30 s."
        )
        clock.now += 31
        assert said(await chat.say("4")) == "three"

        clock.now += 120
        llm.script(tool_call("import time; time.sleep(0.6)"), answer("slept"))
        assert said(await chat.say("sleep")) == "slept"  # asleep: no CPU, so it costs no Python time
        clock.now += 120
        spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
        llm.script(tool_call(spin), answer("spun"))
        assert said(await chat.say("spin")) == "spun"
        clock.now += 120
        assert said(await chat.say("more")) == (
            "🪫 You have used your 0.5 s of Python time for today. It resets at 00:00 UTC, in 13 h 53 min."
        )
        other = MemoryChat(chat.dispatcher, channel="C2")  # the channel's own limit applies there only
        llm.script(answer("elsewhere"))
        assert said(await other.say("more")) == "elsewhere"


async def test_usage_shows_what_the_store_holds_and_usage_all_is_for_admins(
    tmp_path: Path, llm: ScriptedOpenAI
) -> None:
    clock = Clock(MORNING)
    sections: dict[str, Any] = {
        "access": {"admins": ["test:U_BOSS"]},
        "llm": {
            "base_url": llm.base_url,
            "api_key": "k",
            "model": "fake-model",
            "prices": {"fake-model": {"input": 2.0, "output": 10.0}},
        },
    }
    async with running(tmp_path, llm, clock, **sections) as chat:
        llm.script(answer("a", usage=(1000, 100)), answer("b", usage=(3000, 200)), answer("c", usage=(500, 50)))
        await chat.say("q1", thread="t1")
        await chat.say("q2", thread="t2")
        await chat.say("q3", thread="t1", user="U2")
        mine = said(await chat.say("usage", thread="t1"))
        # This thread: 1,100 + 550 tokens; cost (1500 × 2 + 150 × 10) / 1e6 = 0.0045.
        assert "**This thread**\n• today: 1,650 tokens · 0.0 s of Python · 2 turns · $0.0045" in mine
        # You (U1): 1,100 + 3,200 tokens; cost (4000 × 2 + 300 × 10) / 1e6 = 0.011.
        assert "**You**\n• today: 4,300 tokens · 0.0 s of Python · 2 turns · $0.0110" in mine

        refused = said(await chat.say("usage all"))
        assert refused.startswith("Only the bot's admins") and "1,650" not in refused
        everyone = said(await chat.say("usage all", user="U_BOSS"))
        assert "**Channels** (1)\n1. `test:C1` — 4,850 tokens" in everyone
        assert "**People** (2)\n1. `U1` — 4,300 tokens" in everyone and "2. `U2` — 550 tokens" in everyone
        assert "**Feedback on answers:** 👍 0 · 👎 0" in everyone

        clock.now += 40 * DAY_S  # another month: today and this month are empty again
        assert "• this month: 0 tokens" in said(await chat.say("usage", thread="t1"))
