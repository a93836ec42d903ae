"""Several replicas on one database: each message claimed once, a thread's turns one at a time
and in order, a silent replica's turns taken over, migrations once. Real PostgreSQL (and
SQLite where the rule is the same)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bench.postgres import LocalPostgres
from bot.events import ThreadKey
from bot.store import SCHEMA_VERSION, KernelOwner, Store

KEY = ThreadKey.parse("slack:T1:C1:1700000000.000100")


async def abandon(store: Store) -> None:
    """What ``kill -9`` leaves: the store stops marking itself alive and never signs off."""
    assert store.replicas._heartbeat is not None
    store.replicas._heartbeat.cancel()
    await store._db.close()


async def test_replicas_starting_together_migrate_once(pg_url: str) -> None:
    stores = await asyncio.gather(*(Store.open(pg_url) for _ in range(4)))
    try:
        assert {await s.schema_version() for s in stores} == {SCHEMA_VERSION}
        assert len(await stores[0].replicas.live()) == 4
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    async with await Store.open(pg_url) as alone:
        assert await alone.replicas.live() == [alone.replicas.run]  # the others signed off


async def test_a_message_is_claimed_once_across_replicas(pg_url: str) -> None:
    async with await Store.open(pg_url) as a, await Store.open(pg_url) as b:
        claims = await asyncio.gather(*(s.processed.claim(f"slack:m{i}") for i in range(20) for s in (a, b, a, b)))
    assert sum(claims) == 20  # every id once, whichever replica got it first


async def test_turns_of_a_thread_run_in_ticket_order_across_replicas(pg_url: str) -> None:
    async with await Store.open(pg_url) as a, await Store.open(pg_url) as b:
        first = await a.turns.begin(KEY, "m1")
        second = await b.turns.begin(KEY, "m2")
        assert (first.ticket, first.ahead, second.ticket, second.ahead) == (1, 0, 2, 1)
        assert (await a.turns.check(KEY, first.ticket)).ready
        assert not (await b.turns.check(KEY, second.ticket)).ready  # a live replica runs m1
        await a.turns.end(KEY, "m1")
        assert (await b.turns.check(KEY, second.ticket)).ready


async def test_tickets_taken_at_once_are_all_different(store_target: Path | str) -> None:
    async with await Store.open(store_target) as a, await Store.open(store_target) as b:
        queued = await asyncio.gather(*(s.turns.begin(KEY, f"m{i}") for i, s in enumerate([a, b] * 15)))
    assert sorted(q.ticket for q in queued) == list(range(1, 31))
    assert sorted(q.ahead for q in queued) == list(range(30))


async def test_a_silent_replicas_turns_are_taken_over_after_the_timeout(pg_url: str) -> None:
    killed = await Store.open(pg_url, replica_timeout_s=1.0)
    await killed.turns.begin(KEY, "m1")  # running when it died
    await killed.turns.begin(ThreadKey.parse("slack:T1:C2:5.0"), "m9")  # another thread, no later message
    await abandon(killed)
    async with await Store.open(pg_url, replica_timeout_s=1.0) as other:
        waiting = await other.turns.begin(KEY, "m2")
        assert waiting.ahead == 1
        check = await other.turns.check(KEY, waiting.ticket)
        assert not check.ready and check.interrupted == ()  # not yet: the replica may only be slow
        assert await other.turns.take_interrupted() == []
        await asyncio.sleep(1.2)
        check = await other.turns.check(KEY, waiting.ticket)
        assert check.ready and [t.message_id for t in check.interrupted] == ["m1"]
        # The sweep finds the turn of the thread no message came back to; once.
        assert [t.message_id for t in await other.turns.take_interrupted()] == ["m9"]
        assert await other.turns.take_interrupted() == []


async def test_a_live_replica_keeps_its_turns_past_the_timeout(pg_url: str) -> None:
    async with (
        await Store.open(pg_url, replica_timeout_s=1.0) as a,
        await Store.open(pg_url, replica_timeout_s=1.0) as b,
    ):
        await a.turns.begin(KEY, "m1")
        second = await b.turns.begin(KEY, "m2")
        deadline = time.monotonic() + 1.6
        while time.monotonic() < deadline:  # a's heartbeat (every third of the timeout) keeps it alive
            assert await b.turns.take_interrupted() == []
            assert not (await b.turns.check(KEY, second.ticket)).ready
            await asyncio.sleep(0.2)


async def test_the_kernel_owner_moves_with_the_thread(store_target: Path | str) -> None:
    async with await Store.open(store_target) as a, await Store.open(store_target) as b:
        await a.threads.touch(KEY)
        assert await a.kernel_owners.claim(KEY) is None
        await a.kernel_owners.record(KEY, "gateway-kernel-1")
        assert await a.kernel_owners.claim(KEY) == KernelOwner(
            a.replicas.run, "gateway-kernel-1", gone=False
        )  # keep it
        await b.kernel_owners.record(KEY, "not-b's-to-record")  # b does not own the kernel: nothing changes
        # a's is stale for b; with SQLite (one process by contract) every other process is gone.
        assert await b.kernel_owners.claim(KEY) == KernelOwner(a.replicas.run, "gateway-kernel-1", gone=not b.shared)
        assert await a.kernel_owners.claim(KEY) == KernelOwner(b.replicas.run, None, gone=not a.shared)


async def test_the_kernel_of_a_gone_replica_is_reported_gone(pg_url: str) -> None:
    killed = await Store.open(pg_url, replica_timeout_s=1.0)
    await killed.threads.touch(KEY)
    await killed.kernel_owners.claim(KEY)
    await killed.kernel_owners.record(KEY, "gateway-kernel-7")
    await abandon(killed)
    async with await Store.open(pg_url, replica_timeout_s=1.0) as other:
        await asyncio.sleep(1.2)
        assert await other.kernel_owners.claim(KEY) == KernelOwner(killed.replicas.run, "gateway-kernel-7", gone=True)
        assert await other.kernel_owners.claim(KEY) == KernelOwner(other.replicas.run, None, gone=False)


async def test_a_postgres_restart_costs_no_operation(postgres: LocalPostgres) -> None:
    url = postgres.database()
    async with await Store.open(url) as store:
        await store.transcripts.add_messages(KEY, [{"role": "user", "content": "before"}])
        await asyncio.to_thread(postgres.restart)  # every pooled connection is now dead
        assert await store.transcripts.history(KEY) == [{"role": "user", "content": "before"}]  # a read, once more
        await asyncio.to_thread(postgres.restart)
        await store.transcripts.add_messages(KEY, [{"role": "user", "content": "after"}])  # a write, once more
        assert [m["content"] for m in await store.transcripts.history(KEY)] == ["before", "after"]
