"""Every configured source, made when the bot starts and closed with it.

Making a source loads its SQLAlchemy dialect and driver but connects to nothing: a URL naming
a driver that is not installed (or a dialect SQLAlchemy does not know) stops start-up with
one line (:class:`~bot.sources.engine.SourceUnavailable`; ``bot.config`` checks the same when
it reads the config) instead of failing every turn of every channel granted the source."""

from __future__ import annotations

from collections.abc import Mapping

from bot.sources.catalogue import Catalogue
from bot.sources.engine import Source, open_source
from bot.sources.settings import SourceSettings


class Sources:
    """The process's sources by name (one pool and one concurrency limit each) and their catalogue."""

    def __init__(self, settings: Mapping[str, SourceSettings]) -> None:
        """Make every source (no connection yet); :class:`~bot.sources.engine.SourceUnavailable`
        when one's dialect or driver cannot be loaded."""
        self._sources: dict[str, Source] = {name: open_source(name, each) for name, each in settings.items()}
        self.catalogue = Catalogue()

    def get(self, name: str) -> Source:
        """The source ``name`` (``KeyError`` when it is not configured); it connects on first use."""
        return self._sources[name]

    async def close(self) -> None:
        """Close every pool that was opened (a source used afterwards opens a new one)."""
        for source in self._sources.values():
            await source.close()
