"""Counting a PostgreSQL connection's bytes as they arrive, to stop a row before it is held.

asyncpg reads a whole ``DataRow`` message before it hands the row over: a 1 GB value would be
1 GB in the bot before anything could look at it. :class:`WireWatch` sits between the
connection's transport and asyncpg's protocol (asyncio's own ``set_protocol``) for one query:
it counts what each fetch brings and reads every message's header (type byte, length; the
bodies are skipped, ~0.15 s a million rows). A row longer than the row cap, or a fetch past
its cap, is never passed on: the watch records why (:attr:`WireWatch.over`) and aborts the connection, so asyncpg's
buffer never holds more than the cap and one socket read, and the server's backend ends its
query when its next write fails. The pool replaces the connection.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

#: A backend message's header: its type byte, then its length (itself included, not the type).
_HEADER = struct.Struct(">cI")


class WatchUnavailable(Exception):
    """The connection exposes no transport to watch (asyncpg changed): no query runs unwatched."""


@dataclass(frozen=True, slots=True)
class Overrun:
    """Why a fetch was cut off: its row at ``index`` (0: the fetch's first) is ``row_bytes``
    long, over the row cap; or the fetch passed its cap (``row_bytes`` None)."""

    row_bytes: int | None
    index: int = 0


class WireWatch(asyncio.Protocol):
    """Forwards a connection's incoming bytes to asyncpg's protocol, within caps (see the module)."""

    def __init__(
        self, transport: asyncio.Transport, inner: asyncio.BaseProtocol, *, row_cap: int, fetch_cap: int
    ) -> None:
        self._transport = transport
        self._inner: Any = inner
        #: Bytes the current fetch (or, before the first, the query's preparation) brought.
        self.fetched = 0
        #: Set once a cap was passed (the connection is being aborted).
        self.over: Overrun | None = None
        self._row_cap = row_cap
        self._fetch_cap = fetch_cap
        #: Rows (``DataRow`` headers) the current fetch brought.
        self.rows = 0
        self._head = b""
        self._skip = 0

    @classmethod
    def install(cls, connection: Any, *, row_cap: int, fetch_cap: int) -> WireWatch:
        """Put a watch on ``connection`` (an asyncpg connection or pool proxy) until :meth:`remove`:
        no row over ``row_cap`` bytes, no fetch (and no preparation) over ``fetch_cap``."""
        # asyncpg keeps its transport in a private attribute; tests/sources/test_wire.py pins it.
        transport = getattr(connection, "_transport", None)
        if transport is None or not hasattr(transport, "set_protocol"):
            raise WatchUnavailable("the database connection's bytes cannot be watched")
        watch = cls(transport, transport.get_protocol(), row_cap=row_cap, fetch_cap=fetch_cap)
        transport.set_protocol(watch)
        return watch

    def limit(self, *, row_cap: int, fetch_cap: int) -> None:
        """New caps from the next fetch on (a result whose columns take more room decoded gets lower ones)."""
        self._row_cap = row_cap
        self._fetch_cap = fetch_cap

    def remove(self) -> None:
        """Give the transport back to asyncpg's protocol (when it is still open and watched)."""
        if self._transport.get_protocol() is self:
            self._transport.set_protocol(self._inner)

    def start_fetch(self) -> None:
        """A fetch starts (the stream is at a message boundary): count from zero."""
        self.fetched = 0
        self.rows = 0
        self._head = b""
        self._skip = 0

    def data_received(self, data: bytes) -> None:
        """Count ``data``; pass it on, or abort the connection once a cap is passed."""
        if self.over is not None:
            return  # aborting: nothing more reaches asyncpg's buffer
        self.fetched += len(data)
        self._walk(data)
        if self.over is None and self.fetched > self._fetch_cap:
            self.over = Overrun(row_bytes=None)
        if self.over is not None:
            self._transport.abort()
            return
        self._inner.data_received(data)

    def _walk(self, data: bytes) -> None:
        """Read the message headers in ``data``, skipping their bodies; a ``DataRow`` over the
        row cap sets :attr:`over`."""
        pos, end = 0, len(data)
        if self._skip:
            pos = min(self._skip, end)
            self._skip -= pos
        while pos < end:
            if self._head or pos + 5 > end:  # a header split between two reads
                need = 5 - len(self._head)
                self._head += data[pos : pos + need]
                pos += need
                if len(self._head) < 5:
                    return
                kind, length = _HEADER.unpack(self._head)
                self._head = b""
            else:
                kind, length = _HEADER.unpack_from(data, pos)
                pos += 5
            body = max(length - 4, 0)
            if kind == b"D":
                if body + 5 > self._row_cap:
                    self.over = Overrun(row_bytes=body + 5, index=self.rows)
                    return
                self.rows += 1
            step = min(body, end - pos)
            pos += step
            self._skip = body - step

    def eof_received(self) -> bool | None:
        """Passed on."""
        eof = getattr(self._inner, "eof_received", None)
        return eof() if eof is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        """Passed on."""
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        """Passed on."""
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        """Passed on."""
        self._inner.resume_writing()
