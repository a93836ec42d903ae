"""Rows into a Parquet file of the thread's workspace, in row groups of a few MB.

The file is made in Threadbook's own folder of the workspace (:data:`kernels.workspace.STATE_DIR`,
counted in the quota, never sent back as a file of the turn) from that folder's descriptor:
created new under a temporary name (:func:`kernels.safefs.create_file_at`), renamed over the final name when
complete, so no link the kernel plants is ever followed. Writing stops with
:class:`ResultTooLarge` when the file outgrows the room left in the workspace's quota.
All of it is blocking: call it from a worker thread.

Each batch is made Arrow arrays at once (its Python objects can go), and batches are written
together as one row group once they hold :func:`~bot.sources.budget.row_group_bytes` (1 to 8
MiB, by the columns): the Parquet writer keeps ~850 bytes of metadata per column chunk (a
column of a row group) until the file is closed, so a row group per batch of 1,500 columns
grew the bot by 1.2 MiB a batch.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import secrets
import threading
from collections.abc import Sequence
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from bot.sources.budget import row_group_bytes
from kernels import safefs

#: Pending batches are made one table once there are this many.
_COMPACT_AFTER = 8
#: Values per column shown to the model in the first rows.
PREVIEW_ROWS = 5
_PREVIEW_CHARS = 40


class SinkFailed(Exception):
    """Writing the rows failed (the workspace, not the database)."""


class ResultTooLarge(Exception):
    """The Parquet file outgrew the room left in the workspace."""


class MixedTypes(Exception):
    """A later batch of a column does not fit the type its first batch had."""


class ParquetSink:
    """Writes batches of rows as one Parquet file named ``name`` in the folder ``dir_fd``."""

    def __init__(self, dir_fd: int, name: str, *, limit_bytes: int) -> None:
        self._dir_fd = dir_fd
        self.name = name
        self._temp = f".{name}.{secrets.token_hex(4)}.part"
        self._limit = limit_bytes
        self._file: BinaryIO | None = None
        self._writer: pq.ParquetWriter | None = None
        #: The temporary file exists (made by start, not yet renamed by finish).
        self._temp_made = False
        #: Held by each call: a worker thread of an abandoned query may still be in ``add`` when
        #: the tool aborts; once aborted (closed), every later call raises :class:`SinkFailed`.
        self._lock = threading.Lock()
        self._closed = False
        self._given: list[pa.DataType | None] = []
        self.columns: list[str] = []
        self.schema: pa.Schema | None = None
        self.rows = 0
        self.bytes = 0
        #: Batches made Arrow, not written yet (the next row group), and their size.
        self._pending: list[pa.Table] = []
        self._pending_bytes = 0
        #: Arrow bytes written so far (to tell how the file's compression goes).
        self._written = 0
        self._group_bytes = row_group_bytes(0)
        #: The first rows, as short strings, for the model.
        self.preview: list[list[str]] = []

    def start(self, columns: Sequence[str], types: Sequence[pa.DataType | None]) -> None:
        """The result's column names and, where the database tells them, their Arrow types."""
        with self._lock:
            self._check_open()
            self.columns = _unique(columns)
            self._given = list(types)
            self._group_bytes = row_group_bytes(len(self.columns))
            self._file = os.fdopen(safefs.create_file_at(self._dir_fd, self._temp), "wb")
            self._temp_made = True

    def add(self, rows: Sequence[Sequence[Any]]) -> None:
        """Take one batch (written with the next ones as a row group of :func:`row_group_bytes`)."""
        with self._lock:
            self._check_open()
            if not rows:
                return
            assert self._file is not None, "start() first"
            values = [list(column) for column in zip(*rows)]
            if self.schema is None:
                arrays = [_first_array(column, given) for column, given in zip(values, self._given)]
                self.schema = pa.schema([pa.field(name, array.type) for name, array in zip(self.columns, arrays)])
                # No statistics: nothing reads them (the kernel reads the whole file), and for a
                # wide value they cost copies of it (min and max) in memory.
                self._writer = pq.ParquetWriter(self._file, self.schema, compression="snappy", write_statistics=False)
            else:
                arrays = [_array_as(column, field) for column, field in zip(values, self.schema)]
            table = pa.Table.from_arrays(arrays, schema=self.schema)
            del arrays, values
            if len(self.preview) < PREVIEW_ROWS:
                self.preview.extend([_short(v) for v in row] for row in rows[: PREVIEW_ROWS - len(self.preview)])
            self.rows += len(rows)
            self._pending.append(table)
            self._pending_bytes += table.nbytes
            del table
            if self._pending_bytes >= self._group_bytes or self._would_outgrow():
                self._flush()
            elif len(self._pending) >= _COMPACT_AFTER:
                # Each batch's arrays cost ~1.7 KB apiece beside their data (40 batches of 1,500
                # columns held 103 MiB for 8 MB of values): keep the pending ones as one table.
                self._pending = [pa.concat_tables(self._pending).combine_chunks()]

    def _would_outgrow(self) -> bool:
        """Whether the pending batches may take the file past the room left, compressed as the
        rows written so far were (as Arrow, before any was written): they are written now then."""
        ratio = self.bytes / self._written if self._written else 1.0
        return self.bytes + self._pending_bytes * ratio > self._limit

    def _flush(self) -> None:
        """Write the pending batches as one row group; :class:`ResultTooLarge` past the room left."""
        if not self._pending:
            return
        assert self._writer is not None and self._file is not None
        table = pa.concat_tables(self._pending)
        self._written += self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        del table
        self.bytes = self._file.tell()
        if self.bytes > self._limit:
            raise ResultTooLarge(f"the result outgrew the {self._limit:,} bytes left in the thread's workspace")

    def finish(self) -> None:
        """Close the file and give it its final name (replacing an earlier result of that name).

        Raises :class:`SinkFailed` when the workspace refuses (a full disk, a folder the kernel
        planted under the final name); :meth:`abort` then drops the temporary file."""
        with self._lock:
            self._check_open()
            assert self._file is not None, "start() first"
            try:
                if self._writer is None:  # no rows: still a file with the columns
                    self.schema = pa.schema([pa.field(n, t or pa.string()) for n, t in zip(self.columns, self._given)])
                    self._writer = pq.ParquetWriter(self._file, self.schema)
                self._flush()
                self._writer.close()
                self._file.flush()
                self.bytes = self._file.tell()
                self._file.close()
                self._file = None
                os.rename(self._temp, self.name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            except OSError as exc:
                raise SinkFailed(f"the result {self.name!r} could not be written: {exc}") from exc
            self._temp_made = False

    def _check_open(self) -> None:
        if self._closed:
            raise SinkFailed("the result was dropped (the query was stopped or timed out)")

    def abort(self) -> None:
        """Drop what was written (safe to call at any point, and twice)."""
        with self._lock:
            self._closed = True
            self._pending, self._pending_bytes = [], 0
            try:
                if self._writer is not None:
                    self._writer.close()
            except Exception:  # the file is deleted just below either way
                pass
            self._writer = None
            if self._file is not None:
                self._file.close()
                self._file = None
            if self._temp_made:
                self._temp_made = False
                try:
                    os.unlink(self._temp, dir_fd=self._dir_fd)
                except FileNotFoundError:
                    pass


def arrow_type_for(postgres_type: str) -> pa.DataType | None:
    """The Arrow type of a PostgreSQL type (by name); None: inferred from the values."""
    return _POSTGRES_TYPES.get(postgres_type)


_POSTGRES_TYPES: dict[str, pa.DataType] = {
    "int2": pa.int16(),
    "int4": pa.int32(),
    "int8": pa.int64(),
    "oid": pa.int64(),
    "float4": pa.float32(),
    "float8": pa.float64(),
    "numeric": pa.float64(),
    "money": pa.string(),
    "bool": pa.bool_(),
    "text": pa.string(),
    "varchar": pa.string(),
    "bpchar": pa.string(),
    "char": pa.string(),
    "name": pa.string(),
    "citext": pa.string(),
    "uuid": pa.string(),
    "json": pa.string(),
    "jsonb": pa.string(),
    "xml": pa.string(),
    "inet": pa.string(),
    "cidr": pa.string(),
    # Decoded from their text form (bot.sources.pgtypes.TEXT_DECODED).
    "macaddr": pa.string(),
    "macaddr8": pa.string(),
    "point": pa.string(),
    "line": pa.string(),
    "lseg": pa.string(),
    "box": pa.string(),
    "path": pa.string(),
    "polygon": pa.string(),
    "circle": pa.string(),
    "bit": pa.string(),
    "varbit": pa.string(),
    "tid": pa.string(),
    "pg_lsn": pa.string(),
    "txid_snapshot": pa.string(),
    "pg_snapshot": pa.string(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "time": pa.time64("us"),
    "interval": pa.duration("us"),
    "bytea": pa.binary(),
}


def _first_array(values: list[Any], given: pa.DataType | None) -> pa.Array:
    """The first batch of a column: as the database typed it, else as Arrow infers it
    (decimals as float64, no values as string, what Arrow cannot type as text)."""
    if given is not None:
        return _convert(values, given)
    if any(isinstance(v, decimal.Decimal) for v in values):
        return _convert(values, pa.float64())
    try:
        array = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return _as_text(values)
    return array.cast(pa.string()) if pa.types.is_null(array.type) else array


def _array_as(values: list[Any], field: pa.Field) -> pa.Array:
    try:
        return _convert(values, field.type)
    except MixedTypes:
        raise MixedTypes(
            f"column {field.name!r} changes type after its first rows (it began as {field.type}); "
            "CAST it to one type in the query"
        ) from None


def _convert(values: list[Any], type_: pa.DataType) -> pa.Array:
    if pa.types.is_string(type_):
        return _as_text(values)
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        pass
    if pa.types.is_floating(type_):  # decimals, or SQLite's integers and reals mixed
        try:
            return pa.array([None if v is None else float(v) for v in values], type=type_)
        except (TypeError, ValueError):
            pass
    raise MixedTypes(f"values do not fit {type_}")


def _as_text(values: list[Any]) -> pa.Array:
    return pa.array([v if v is None or isinstance(v, str) else _text(v) for v in values], type=pa.string())


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    return str(value)


def _short(value: Any) -> str:
    # Cut before anything else: splitting a wide value on its spaces would take many times its size.
    if isinstance(value, str):
        value = value[: _PREVIEW_CHARS * 4]
    elif isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value[:_PREVIEW_CHARS])
    text = "NULL" if value is None else _text(value)[: _PREVIEW_CHARS * 4]
    text = " ".join(text.split())
    return text if len(text) <= _PREVIEW_CHARS else text[: _PREVIEW_CHARS - 1] + "…"


def _unique(columns: Sequence[str]) -> list[str]:
    """Column names made unique (``id``, ``id_2``) and never empty (``column_3``)."""
    seen: set[str] = set()
    names: list[str] = []
    for index, name in enumerate(columns, start=1):
        base = str(name) or f"column_{index}"
        candidate, counter = base, 2
        while candidate in seen:
            candidate, counter = f"{base}_{counter}", counter + 1
        seen.add(candidate)
        names.append(candidate)
    return names
