"""Every configured source, opened on first use and closed with the bot."""

from __future__ import annotations

from collections.abc import Mapping

from bot.sources.catalogue import Catalogue
from bot.sources.engine import Source, open_source
from bot.sources.settings import SourceSettings


class Sources:
    """The process's sources by name (one pool and one concurrency limit each) and their catalogue."""

    def __init__(self, settings: Mapping[str, SourceSettings]) -> None:
        self._settings = dict(settings)
        self._open: dict[str, Source] = {}
        self.catalogue = Catalogue()

    def get(self, name: str) -> Source:
        """The source ``name`` (``KeyError`` when it is not configured)."""
        source = self._open.get(name)
        if source is None:
            source = self._open[name] = open_source(name, self._settings[name])
        return source

    async def close(self) -> None:
        """Close every pool that was opened."""
        opened, self._open = list(self._open.values()), {}
        for source in opened:
            await source.close()
