"""Turns in flight: the dispatcher marks and clears them; a start tells each interrupted thread once.

The dispatcher and store are real; the agent turn is a stand-in that waits to be released (or
fails), so these run without kernels or a model. The whole bot across kill -9 is covered by
tests/slack/test_unclean_restart.py.
"""

from __future__ import annotations

import asyncio
import io
import logging
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from adapters.console import ConsoleAdapter
from bot.admission import Admission
from bot.app import tell_interrupted
from bot.budgets import Budgets, TokenAllowance
from bot.commands import Commands
from bot.dispatcher import FAILURE_NOTICE, Dispatcher
from bot.events import InboundMessage, Outbox, Reply, ThreadKey
from bot.line import INTERRUPTED_NOTICE, QUEUED_NOTICE, RESTART_NOTICE
from bot.store import Store
from kernels.oneshot.runner import OneShot
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat, MemoryOutbox


class HeldTurns:
    """Stands in for TurnRunner: each turn waits for :meth:`release`, then returns or raises."""

    def __init__(self) -> None:
        self.running: list[InboundMessage] = []
        self.fail = False
        self._release = asyncio.Event()

    async def run(self, message: InboundMessage, outbox: Outbox, allowance: TokenAllowance) -> None:
        self.running.append(message)
        await self._release.wait()
        if self.fail:
            raise RuntimeError("the turn broke")
        await outbox.post(Reply(text=f"answer to {message.text}"))

    async def stop(self, key: ThreadKey) -> bool:
        return False

    def release(self) -> None:
        self._release.set()


class FailingNotices(MemoryOutbox):
    """An outbox whose platform refuses every notice (e.g. the network is gone at shutdown)."""

    async def notify(self, text: str) -> None:
        raise ConnectionError("platform unreachable")


class Reach:
    """A fake adapter that reaches the threads of one platform through recorded outboxes."""

    def __init__(self, platform: str, *, broken: frozenset[str] = frozenset()) -> None:
        self.platform = platform
        self.broken = broken
        self.outboxes: dict[ThreadKey, MemoryOutbox] = {}

    def outbox_for(self, key: ThreadKey) -> MemoryOutbox | None:
        if key.platform != self.platform:
            return None
        outbox = FailingNotices() if str(key) in self.broken else MemoryOutbox()
        return self.outboxes.setdefault(key, outbox)

    async def thread_open(self, key: ThreadKey) -> bool:
        return True


def marks(path: Path) -> list[tuple[str, str]]:
    """(thread, message id) of every in-flight mark, read beside the running store."""
    with sqlite3.connect(path) as raw:
        rows = raw.execute("SELECT thread, message_id FROM turns_in_flight ORDER BY started_at").fetchall()
    raw.close()
    return [(str(t), str(m)) for t, m in rows]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "threadbook.db"


@pytest_asyncio.fixture
async def store(db_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(db_path) as opened:
        yield opened


@pytest.fixture
def turns() -> HeldTurns:
    return HeldTurns()


@pytest.fixture
def chat(tmp_path: Path, store: Store, turns: HeldTurns) -> MemoryChat:
    settings = make_settings(tmp_path)
    commands = Commands(store=store, pool=None, settings=settings, oneshot=OneShot.unavailable("not needed"))  # type: ignore[arg-type]  # help needs no pool
    admission = Admission(settings, store, Budgets(settings, store.usage))
    dispatcher = Dispatcher(
        settings=settings,
        store=store,
        admission=admission,
        turns=turns,  # type: ignore[arg-type]
        commands=commands,
        pool=None,  # type: ignore[arg-type]  # one process, SQLite: the pool is never asked
    )
    return MemoryChat(dispatcher)


async def until(predicate: Any, timeout: float = 5.0) -> None:
    async def check() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(check(), timeout)


async def test_the_running_turn_is_marked_and_cleared_however_it_ends(
    chat: MemoryChat, turns: HeldTurns, db_path: Path
) -> None:
    first, second = chat.message("first"), chat.message("second")
    first_out, second_out = MemoryOutbox(), MemoryOutbox()
    running = asyncio.create_task(chat.dispatcher.handle(first, first_out))
    await until(lambda: turns.running)
    queued = asyncio.create_task(chat.dispatcher.handle(second, second_out))
    await until(lambda: second_out.notices == [QUEUED_NOTICE])
    # A queued message is marked too: a kill -9 now would leave both threads' messages to report.
    assert marks(db_path) == [(str(first.key), first.message_id), (str(second.key), second.message_id)]
    turns.release()
    await asyncio.gather(running, queued)
    assert [o.reply.text for o in (first_out, second_out)] == ["answer to first", "answer to second"]
    assert marks(db_path) == []

    turns.fail = True
    failed = await chat.say("break", thread="t2")
    assert failed.notices == [FAILURE_NOTICE]
    assert marks(db_path) == []


async def test_a_command_is_marked_while_it_runs(chat: MemoryChat, db_path: Path) -> None:
    seen: list[list[tuple[str, str]]] = []

    class Watching(MemoryOutbox):
        async def post(self, reply: Reply) -> None:
            seen.append(marks(db_path))
            await super().post(reply)

    message = chat.message("help", thread="t3")
    await chat.dispatcher.handle(message, Watching())
    assert seen == [[(str(message.key), message.message_id)]]
    assert marks(db_path) == []


async def test_a_graceful_shutdown_tells_the_thread_once_and_the_next_start_does_not(
    chat: MemoryChat, turns: HeldTurns, db_path: Path
) -> None:
    outbox = MemoryOutbox()
    turn = asyncio.create_task(chat.dispatcher.handle(chat.message("slow", thread="t4"), outbox))
    await until(lambda: turns.running)
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert outbox.notices == [RESTART_NOTICE]
    assert marks(db_path) == []
    async with await Store.open(db_path) as next_start:
        assert await next_start.turns.take_interrupted() == []


async def test_a_shutdown_notice_that_fails_leaves_the_turn_for_the_next_start(
    chat: MemoryChat, turns: HeldTurns, db_path: Path
) -> None:
    message = chat.message("slow", thread="t5")
    turn = asyncio.create_task(chat.dispatcher.handle(message, FailingNotices()))
    await until(lambda: turns.running)
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert marks(db_path) == [(str(message.key), message.message_id)]
    async with await Store.open(db_path) as next_start:
        assert [t.message_id for t in await next_start.turns.take_interrupted()] == [message.message_id]


async def test_start_up_tells_each_reachable_thread_once_and_keeps_the_rest(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    told_twice = ThreadKey("slack", "T1", "C1", "1.0")
    unreachable_now = ThreadKey("discord", "G1", "C2", "99")
    refuses = ThreadKey("slack", "T1", "C3", "3.0")
    async with await Store.open(db_path) as killed:  # closed without ending: what kill -9 leaves
        await killed.turns.begin(told_twice, "m1")
        await killed.turns.begin(unreachable_now, "m2")
        await killed.turns.begin(refuses, "m3")
        await killed.turns.begin(told_twice, "m4")  # a second message of the same thread
    with sqlite3.connect(db_path) as raw:  # a row no key of this version writes
        raw.execute(
            "INSERT INTO turns_in_flight (thread, message_id, run, started_at) VALUES (?, ?, ?, ?)",
            ("not a thread key", "m5", "gone", time.time()),
        )
    raw.close()

    slack = Reach("slack", broken=frozenset({str(refuses)}))
    async with await Store.open(db_path) as store:
        with caplog.at_level(logging.INFO, logger="bot.app"):
            assert await tell_interrupted(store, [slack]) == 1
        assert slack.outboxes[told_twice].notices == [INTERRUPTED_NOTICE]  # once per thread
        assert "could not tell slack:T1:C3:3.0" in caplog.text  # logged and skipped
        assert "notified 1 thread(s); 1 kept for later" in caplog.text
        assert "dropped an interrupted turn with a bad thread key" in caplog.text
        assert marks(db_path) == [("discord:G1:C2:99", "m2")]  # the bad key was dropped

        again = Reach("slack")
        assert await tell_interrupted(store, [again]) == 0  # told once, not at every start
        assert again.outboxes == {}

    discord = Reach("discord")
    async with await Store.open(db_path) as later:  # the platform is enabled again
        assert await tell_interrupted(later, [Reach("slack"), discord]) == 1
        assert discord.outboxes[unreachable_now].notices == [INTERRUPTED_NOTICE]


async def test_a_resumed_console_thread_hears_about_its_interrupted_turn(db_path: Path) -> None:
    async with await Store.open(db_path) as killed:
        await killed.turns.begin(ThreadKey("console", "local", "console", "demo"), "m1")
        await killed.turns.begin(ThreadKey("console", "local", "console", "other"), "m2")

    async with await Store.open(db_path) as store:
        stdout = io.StringIO()
        console = ConsoleAdapter(None, out_dir=db_path.parent, thread="demo", stdin=io.StringIO(), stdout=stdout)  # type: ignore[arg-type]
        assert await tell_interrupted(store, [console]) == 1
        assert stdout.getvalue() == INTERRUPTED_NOTICE + "\n"
        assert marks(db_path) == [("console:local:console:other", "m2")]  # waits for its own resumption
