"""How many bytes of a query's result the bot holds at once, and when it stops taking more.

A row count says nothing about memory (100 rows of 4 MB are 400 MB), so rows are fetched by
bytes: the first fetch takes one row, each next one as many as fit :data:`BATCH_BYTES` at
the widest bytes-per-row seen so far (at most 8 times the last, at most :data:`BATCH_ROWS`).
A row over :data:`ROW_CAP` is never taken whole (PostgreSQL: refused from its header, as it
arrives, by :mod:`bot.sources.wire`), nor a fetch over :data:`FETCH_CAP`; a result whose
rows pass the source's ``max_result_mb`` stops there. Each stop keeps the rows before it and
says why in one sentence for the model (:class:`Stop`). Bytes are as the database sent them
(PostgreSQL: the wire's ``DataRow`` messages; other drivers: the values' size in memory).
A result whose values take several times their wire size once decoded (PostgreSQL arrays,
composite values, ranges: :mod:`bot.sources.pgtypes`) is paced with its batch target, row
cap and fetch cap divided by that factor (:attr:`Pacer.expansion`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

#: Rows fetched at a time, at most (narrow rows: the batch is this many rows).
BATCH_ROWS = 20_000
#: What a fetch aims at, in bytes.
BATCH_BYTES = 2 * 2**20
#: One row may take this much at most (a single value included).
ROW_CAP = 4 * 2**20
#: One fetch may bring this much at most: a row at the cap and the protocol's messages around it.
FETCH_CAP = ROW_CAP + 2**16
#: A fetch may take this many times as many rows as the one before it.
_GROWTH = 8
#: A fetch brings this many values (rows × columns) at most: narrow values cost an object each.
BATCH_VALUES = 100_000
#: The Parquet writer keeps ~850 bytes for each column of each row group until the file is
#: closed (measured: 1,500 columns × 600 row groups took 744 MiB): a result may have this many
#: such column chunks (~13 MiB), so one of many columns stops sooner (:meth:`Pacer.result_cap`),
#: and its batches are written together in row groups of :func:`row_group_bytes`.
COLUMN_CHUNKS = 16_384
#: A row group holds this much at most, however many columns (Arrow bytes): the bot holds it until written.
ROW_GROUP_BYTES = 8 * 2**20


def row_group_bytes(columns: int) -> int:
    """How much (Arrow bytes) the batches of a result of ``columns`` columns are written
    together: 32 KiB a column (so 512 MB of results make :data:`COLUMN_CHUNKS` chunks at most),
    1 MiB to :data:`ROW_GROUP_BYTES`."""
    return min(max(columns * 2**15, 2**20), ROW_GROUP_BYTES)


def megabytes(size: float) -> str:
    """``8 MB``, ``40.5 MB``, ``0.3 MB``: a size as the model is told it (MB = 2**20 bytes)."""
    value = size / 2**20
    return f"{value:.0f} MB" if value >= 10 or value == int(value) else f"{value:.1f} MB"


class Stop(Exception):
    """The result stops before its end: ``rows`` rows were kept; ``str()`` says why, for the model."""

    def __init__(self, why: str, rows: int) -> None:
        super().__init__(why)
        self.rows = rows


def _rows(count: int) -> str:
    return f"{count:,} row{'' if count == 1 else 's'}"


def row_too_wide(rows: int, row: int, size: int, cap: int = ROW_CAP) -> Stop:
    """Row ``row`` (counted from 1) is ``size`` bytes, over ``cap`` (:data:`ROW_CAP`, or less for
    columns that take more room decoded: :attr:`Pacer.row_cap`); ``rows`` rows were kept."""
    why = f"over the {megabytes(cap)} one row may take"
    if cap < ROW_CAP:
        why += (
            f" when it holds arrays, composite values, ranges, numeric or interval values (they take several "
            f"times their size once read; {megabytes(ROW_CAP)} for other columns)"
        )
    return Stop(f"the result stopped at {_rows(rows)}, before row {row:,}, which is {megabytes(size)}, {why}", rows)


def fetch_too_wide(rows: int, count: int, cap: int = FETCH_CAP) -> Stop:
    """The ``count`` rows after row ``rows`` came to more than ``cap`` (:data:`FETCH_CAP`, or
    :attr:`Pacer.fetch_cap`) together."""
    return Stop(
        f"the result stopped at {_rows(rows)}: the {count:,} rows after them are much wider than those before "
        f"and came to over {megabytes(cap)} at once",
        rows,
    )


def result_too_big(rows: int, size: int, cap: int, columns: int = 0) -> Stop:
    """The rows after row ``rows`` (``size`` bytes so far) would take the result past ``cap``
    (``columns``: the result's, when they made the cap lower than the source's)."""
    which = f"a result of {columns:,} columns may take" if columns else "a query may return"
    return Stop(
        f"the result stopped at {_rows(rows)} ({megabytes(size)}): the next rows would take it past the "
        f"{megabytes(cap)} {which}",
        rows,
    )


def value_too_big(rows: int, count: int, cap: int) -> Stop:
    """The database refused to make a value over ``cap`` for one of the ``count`` rows after
    row ``rows`` (SQLite's length limit)."""
    which = f"row {rows + 1:,}" if count == 1 else f"one of the next {count:,} rows"
    return Stop(f"the result stopped at {_rows(rows)}: {which} {_needed(cap)}", rows)


def value_refused(cap: int) -> str:
    """Why a query whose first row needed a value over ``cap`` was stopped."""
    return f"it {_needed(cap)}"


def _needed(cap: int) -> str:
    return (
        f"needed a value over {megabytes(cap)}, more than a value may take ({megabytes(ROW_CAP)} a row, "
        "shared by its columns)"
    )


@dataclass(slots=True)
class Pacer:
    """How many rows to fetch next, from the bytes the fetches so far brought."""

    #: Rows still wanted (``max_rows + 1``: one more says the result was cut).
    left: int
    #: The result may take this many bytes (the source's ``max_result_mb``).
    cap: int
    #: The caps are divided by this: the most room a byte of the result's columns takes once
    #: decoded, in times a plain value's (:func:`bot.sources.pgtypes.expansion`).
    expansion: int = 1
    #: The result's columns (0: not known).
    columns: int = 0
    #: Rows and bytes taken so far.
    rows: int = 0
    bytes: int = 0
    _width: float = 1.0
    _last: int = 0

    @property
    def result_cap(self) -> int:
        """The most the result may take: :attr:`cap`, or less for a result of many columns (so
        that its row groups of :func:`row_group_bytes` come to :data:`COLUMN_CHUNKS` at most)."""
        if self.columns <= 0:
            return self.cap
        return min(self.cap, max(COLUMN_CHUNKS // self.columns, 1) * row_group_bytes(self.columns))

    @property
    def batch_bytes(self) -> int:
        """What a fetch aims at: :data:`BATCH_BYTES` ÷ :attr:`expansion`."""
        return BATCH_BYTES // self.expansion

    @property
    def row_cap(self) -> int:
        """The most one row may take: :data:`ROW_CAP` ÷ :attr:`expansion`."""
        return ROW_CAP // self.expansion

    @property
    def fetch_cap(self) -> int:
        """The most one fetch may bring: :attr:`row_cap` and the messages around it."""
        return self.row_cap + FETCH_CAP - ROW_CAP

    def next_rows(self) -> int:
        """Rows for the next fetch (0: none is wanted any more)."""
        if self.left <= 0:
            return 0
        if self._last == 0:
            return 1
        fit = int(self.batch_bytes // self._width)
        if self.columns > 0:
            fit = min(fit, BATCH_VALUES // self.columns)
        return max(1, min(fit, self._last * _GROWTH, BATCH_ROWS, self.left))

    def took(self, rows: int, size: int) -> None:
        """A fetch brought ``rows`` rows of ``size`` bytes. :class:`Stop` when they would take the
        result past :attr:`result_cap` (they are not counted then: the rows before them are the result)."""
        cap = self.result_cap
        if rows and self.bytes + size > cap:
            raise result_too_big(self.rows, self.bytes, cap, self.columns if cap < self.cap else 0)
        self.rows += rows
        self.bytes += size
        self.left -= rows
        self._last = max(rows, 1)
        if rows:
            self._width = max(self._width, size / rows)


def rows_bytes(rows: Sequence[Sequence[Any]]) -> int:
    """The size of ``rows`` in memory (for drivers that hand rows over whole, not bytes)."""
    return sum(map(sys.getsizeof, chain.from_iterable(rows)))


def widest_row(rows: Sequence[Sequence[Any]]) -> tuple[int, int]:
    """(index, size) of the first row over :data:`ROW_CAP`, or (-1, 0)."""
    for index, row in enumerate(rows):
        size = sum(map(sys.getsizeof, row))
        if size > ROW_CAP:
            return index, size
    return -1, 0
