"""What the Discord end-to-end tests share: a real Core and DiscordAdapter against the fake Discord."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from adapters.discord import DiscordAdapter
from bot.app import Core
from bot.config import Settings


@asynccontextmanager
async def running_adapter(settings: Settings) -> AsyncIterator[tuple[Core, DiscordAdapter]]:
    """Open the Core of ``settings`` and start its Discord adapter (short waits, for tests); stop both on exit."""
    async with Core.open(settings) as core:
        adapter = DiscordAdapter(settings.discord, core.dispatcher, guild_ready_timeout_s=0.05, status_interval_s=0.05)
        await adapter.start()
        try:
            yield core, adapter
        finally:
            await adapter.stop()
