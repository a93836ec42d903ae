"""What the model is told of a source: its description, tables and columns (bounded, cached).

A source's tables are listed once and kept for :data:`CATALOGUE_TTL_S`; the ``sql`` tool's
``refresh_schema`` argument lists them again at once. The text given to the model is cut at
:data:`MAX_SOURCE_CHARS` per source (tables beyond it are named as left out).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from bot.sources.engine import QueryFailed, Source, TableColumns

CATALOGUE_TTL_S = 600.0
MAX_SOURCE_CHARS = 4_000
#: Listing the tables before a turn waits at most this long (the turn goes on without them).
_LIST_TIMEOUT_S = 5.0


@dataclass
class _Listed:
    text: str
    at: float


class Catalogue:
    """Cached table listings of every source, by name."""

    def __init__(self, *, ttl_s: float = CATALOGUE_TTL_S) -> None:
        self._ttl_s = ttl_s
        self._listed: dict[str, _Listed] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def describe(self, source: Source, *, refresh: bool = False) -> str:
        """The source's description and tables, as Markdown lines for the model."""
        lock = self._locks.setdefault(source.name, asyncio.Lock())
        async with lock:
            listed = self._listed.get(source.name)
            if refresh or listed is None or time.monotonic() - listed.at > self._ttl_s:
                text, listed_ok = await _list(source)
                if not listed_ok:  # a failed listing is told this once, never kept: the next turn tries again
                    self._listed.pop(source.name, None)
                    return text
                listed = _Listed(text, time.monotonic())
                self._listed[source.name] = listed
        return listed.text


async def _list(source: Source) -> tuple[str, bool]:
    """The text for the model, and whether the tables were listed (False: the text tells why not)."""
    head = f"Source `{source.name}` ({source.dialect})"
    if source.settings.description.strip():
        head += f": {' '.join(source.settings.description.split())}"
    try:
        async with asyncio.timeout(_LIST_TIMEOUT_S):
            tables = await source.tables()
    except TimeoutError:
        return f"{head}\n(its tables could not be listed in time; query information_schema or try again)", False
    except QueryFailed as exc:
        return f"{head}\n(its tables could not be listed: {exc})", False
    return format_tables(head, tables), True


def format_tables(head: str, tables: list[TableColumns], *, limit: int = MAX_SOURCE_CHARS) -> str:
    """``head`` then one line per table, ``- table(column type, …)``, cut at ``limit`` characters."""
    lines = [head]
    used = len(head)
    for index, table in enumerate(tables):
        line = f"- {table.table}(" + ", ".join(f"{name} {type_.lower()}" for name, type_ in table.columns) + ")"
        if used + len(line) + 1 > limit:
            lines.append(f"- … and {len(tables) - index} more tables (query the database's catalogue to list them)")
            break
        lines.append(line)
        used += len(line) + 1
    if not tables:
        lines.append("(no tables found)")
    return "\n".join(lines)
