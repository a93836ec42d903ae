"""Fetching by bytes on its own: the pacer's batch sizes and stops, and the wire watch's reading
of PostgreSQL's message headers however the stream is split (a transport of our own making
stands in for asyncio's; a real asyncpg connection pins the attribute the watch needs)."""

from __future__ import annotations

import asyncio
import random
import struct
from typing import Any

import asyncpg
import pytest

from bot.sources import budget
from bot.sources.budget import BATCH_ROWS, ROW_CAP, Pacer, Stop
from bot.sources.wire import WireWatch


def test_the_pacer_starts_with_one_row_and_grows_to_the_byte_budget() -> None:
    pacer = Pacer(left=1_000_000, cap=2**40)
    sizes = []
    for _ in range(8):
        want = pacer.next_rows()
        sizes.append(want)
        pacer.took(want, want * 70)  # 70-byte rows
    assert sizes == [1, 8, 64, 512, 4096, BATCH_ROWS, BATCH_ROWS, BATCH_ROWS]


def test_the_pacer_takes_one_wide_row_at_a_time_and_never_forgets_the_widest() -> None:
    pacer = Pacer(left=1_000, cap=2**40)
    assert pacer.next_rows() == 1
    pacer.took(1, 3 * 2**20)
    assert pacer.next_rows() == 1
    pacer.took(1, 100)  # a narrow row after a wide one: the widest still sizes the batch
    assert pacer.next_rows() == 1


def test_the_pacer_stops_before_the_rows_that_pass_the_result_cap() -> None:
    pacer = Pacer(left=1_000, cap=10 * 2**20)
    pacer.took(1, 2**20)
    pacer.took(8, 8 * 2**20)
    with pytest.raises(Stop) as stopped:
        pacer.took(2, 2 * 2**20)
    assert stopped.value.rows == 9
    assert (
        str(stopped.value)
        == "the result stopped at 9 rows (9 MB): the next rows would take it past the 10 MB a query may return"
    )


def test_the_pacer_asks_for_no_more_than_max_rows_plus_one() -> None:
    pacer = Pacer(left=5, cap=2**40)
    pacer.took(1, 10)
    assert pacer.next_rows() == 4
    pacer.took(4, 40)
    assert pacer.next_rows() == 0


def test_columns_that_take_more_room_decoded_divide_the_caps() -> None:
    pacer = Pacer(left=1_000_000, cap=2**40, expansion=4)
    assert pacer.row_cap == 2**20 and pacer.fetch_cap == 2**20 + 2**16 and pacer.batch_bytes == 2**19
    sizes = []
    for _ in range(7):
        want = pacer.next_rows()
        sizes.append(want)
        pacer.took(want, want * 70)
    assert sizes == [1, 8, 64, 512, 4096, 2**19 // 70, 2**19 // 70]
    assert str(budget.row_too_wide(0, 1, 3 * 2**20, pacer.row_cap)) == (
        "the result stopped at 0 rows, before row 1, which is 3 MB, over the 1 MB one row may take when it holds "
        "arrays, composite values, ranges, numeric or interval values (they take several times their size once "
        "read; 4 MB for other columns)"
    )


def test_a_fetch_of_many_columns_brings_a_bounded_number_of_values() -> None:
    pacer = Pacer(left=1_000_000, cap=2**40, columns=1500)
    sizes = []
    for _ in range(5):
        want = pacer.next_rows()
        sizes.append(want)
        pacer.took(want, want * 1500 * 5)  # 5 bytes a value
    assert sizes == [1, 8, 64, budget.BATCH_VALUES // 1500, budget.BATCH_VALUES // 1500]


def test_a_result_of_many_columns_has_a_lower_cap() -> None:
    assert budget.row_group_bytes(1) == 2**20 and budget.row_group_bytes(64) == 2**21
    assert budget.row_group_bytes(1500) == budget.ROW_GROUP_BYTES == 8 * 2**20
    # Up to 256 columns a result of 512 MB makes no more column chunks than the writer may keep.
    assert Pacer(left=1, cap=512 * 2**20, columns=256).result_cap == 512 * 2**20
    pacer = Pacer(left=10**6, cap=512 * 2**20, columns=1500)
    assert pacer.result_cap == (budget.COLUMN_CHUNKS // 1500) * 8 * 2**20 == 80 * 2**20
    pacer.took(1000, 70 * 2**20)
    with pytest.raises(Stop) as stopped:
        pacer.took(1000, 20 * 2**20)
    assert str(stopped.value) == (
        "the result stopped at 1,000 rows (70 MB): the next rows would take it past the 80 MB a result of 1,500 "
        "columns may take"
    )


class Inner(asyncio.Protocol):
    """asyncpg's protocol as the watch sees it: what reaches it."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.lost = False

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


class Transport:
    """The few calls of an asyncio transport the watch makes."""

    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol
        self.aborted = False

    def get_protocol(self) -> Any:
        return self.protocol

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def abort(self) -> None:
        self.aborted = True


class Connection:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport


def message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack(">I", len(body) + 4) + body


def data_row(size: int) -> bytes:
    return message(b"D", b"\x00\x01" + struct.pack(">I", size) + b"x" * size)


def feed(watch: WireWatch, stream: bytes, seed: int) -> None:
    """``stream`` in random pieces, as the socket might hand it over (headers split too)."""
    chance = random.Random(seed)
    pos = 0
    while pos < len(stream):
        step = chance.choice([1, 2, 3, 5, 7, 64, 4096, 65536])
        watch.data_received(stream[pos : pos + step])
        pos += step


def watched() -> tuple[WireWatch, Inner, Transport]:
    inner = Inner()
    transport = Transport(inner)
    watch = WireWatch.install(Connection(transport), row_cap=ROW_CAP, fetch_cap=budget.FETCH_CAP)
    assert transport.protocol is watch
    return watch, inner, transport


@pytest.mark.parametrize("seed", range(5))
def test_rows_under_the_caps_pass_through_unchanged_however_split(seed: int) -> None:
    watch, inner, transport = watched()
    stream = message(b"2", b"") + b"".join(data_row(n * 1000) for n in range(50)) + message(b"s", b"")
    watch.start_fetch()
    feed(watch, stream, seed)
    assert inner.data == stream and watch.rows == 50 and watch.fetched == len(stream)
    assert watch.over is None and not transport.aborted
    watch.remove()
    assert transport.protocol is inner


@pytest.mark.parametrize("seed", range(5))
def test_a_row_over_the_cap_is_refused_from_its_header(seed: int) -> None:
    watch, inner, transport = watched()
    before = message(b"2", b"") + data_row(10) + data_row(20)
    huge_header = b"D" + struct.pack(">I", 300_000_000)
    watch.start_fetch()
    feed(watch, before + huge_header + b"x" * 100_000, seed)
    assert watch.over is not None and watch.over.index == 2 and watch.over.row_bytes == 300_000_001
    assert transport.aborted
    assert len(inner.data) <= len(before) + len(huge_header)  # not one byte of its body


def test_a_fetch_over_its_cap_is_cut_off_there() -> None:
    watch, inner, transport = watched()
    watch.start_fetch()
    rows = b"".join(data_row(2**20) for _ in range(6))  # 6 rows of 1 MB: each under the row cap
    feed(watch, rows, 0)
    assert watch.over is not None and watch.over.row_bytes is None
    assert transport.aborted and len(inner.data) <= budget.FETCH_CAP


def test_lower_caps_hold_from_the_next_fetch() -> None:
    watch, inner, transport = watched()
    watch.limit(row_cap=2**20, fetch_cap=2**20 + 2**16)
    watch.start_fetch()
    feed(watch, data_row(2**20 - 100) + data_row(2**20 + 100), 2)  # under, then over 1 MB
    assert watch.over is not None and watch.over.index == 1 and transport.aborted
    assert len(inner.data) < 2**20 + 100


def test_the_count_starts_again_with_each_fetch() -> None:
    watch, inner, transport = watched()
    for _ in range(10):  # 10 fetches of 3 MB each: 30 MB in all, never 4 MB in one fetch
        watch.start_fetch()
        feed(watch, data_row(3 * 2**20) + message(b"s", b""), 1)
    assert watch.over is None and not transport.aborted


async def test_the_watch_finds_a_real_asyncpg_connections_transport(pg_url: str) -> None:
    pool = await asyncpg.create_pool(pg_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            watch = WireWatch.install(conn, row_cap=ROW_CAP, fetch_cap=budget.FETCH_CAP)
            try:
                watch.start_fetch()
                assert await conn.fetchval("SELECT repeat('x', 1000)") == "x" * 1000
                assert watch.rows == 1 and watch.fetched > 1000
            finally:
                watch.remove()
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await pool.close()
