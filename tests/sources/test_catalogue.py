"""The catalogue's cache: listings are kept, failures are not; a turn lists its sources at once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from bot.sources.catalogue import Catalogue
from bot.sources.engine import QueryFailed, TableColumns
from bot.sources.tool import SqlTool


class FlakySource:
    """Fails its first listing, then lists one table."""

    def __init__(self, name: str = "shop", *, fail_first: bool = True, meet: asyncio.Barrier | None = None) -> None:
        self.name = name
        self.dialect = "sqlite"
        self.settings = SimpleNamespace(description="")
        self.calls = 0
        self._fail_first = fail_first
        self._meet = meet

    async def tables(self) -> list[TableColumns]:
        self.calls += 1
        if self._meet is not None:  # every listing waits for the others: only concurrent ones meet
            await asyncio.wait_for(self._meet.wait(), 5)
        if self._fail_first and self.calls == 1:
            raise QueryFailed("connection refused")
        return [TableColumns("orders", (("id", "INTEGER"),))]


async def test_a_failed_listing_is_not_cached() -> None:
    catalogue = Catalogue()
    source: Any = FlakySource()
    assert "could not be listed: connection refused" in await catalogue.describe(source)
    assert "- orders(id integer)" in await catalogue.describe(source)
    assert "- orders(id integer)" in await catalogue.describe(source)
    assert source.calls == 2  # the good listing is kept


async def test_sources_are_described_concurrently() -> None:
    meet = asyncio.Barrier(3)
    slow: dict[str, Any] = {n: FlakySource(n, fail_first=False, meet=meet) for n in ("a", "b", "c")}
    sources: Any = SimpleNamespace(catalogue=Catalogue(), get=slow.__getitem__)
    tool = await SqlTool.open(sources=sources, granted=list(slow), kernel=None, workspace=None)  # type: ignore[arg-type]
    description = tool.spec["function"]["description"]
    assert all(f"Source `{n}`" in description for n in slow)
    assert "could not be listed" not in description  # all three met: they were listed at the same time
