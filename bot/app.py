"""Wires the parts together: store, kernel pool, reaper, agent, dispatcher, adapters."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from adapters.base import Adapter, AdapterStartError
from bot.agent.loop import Agent
from bot.commands import Commands
from bot.config import Settings
from bot.dispatcher import Dispatcher
from bot.store import Store
from bot.turn import TurnRunner
from kernels import KernelPool, Reaper, make_launcher

log = logging.getLogger(__name__)

NO_PLATFORM_MESSAGE = (
    "No chat platform is configured. Set SLACK_BOT_TOKEN (with SLACK_APP_TOKEN for Socket Mode, or "
    "SLACK_SIGNING_SECRET for the Events API) and/or DISCORD_BOT_TOKEN, then run `make run` again. "
    "To try Threadbook locally without a platform: `make console`."
)


@dataclass
class Core:
    """Everything a platform adapter needs behind it; owns its parts' lifetimes."""

    settings: Settings
    store: Store
    pool: KernelPool
    agent: Agent
    dispatcher: Dispatcher

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: Settings) -> AsyncIterator[Core]:
        """Start the core; on exit stop the reaper and every kernel, close the store."""
        async with AsyncExitStack() as stack:
            store = await Store.open(settings.storage.path)
            stack.push_async_callback(store.close)
            # Choosing the launcher probes bubblewrap (and slirp4netns) with real processes: off the loop.
            launcher = await asyncio.to_thread(make_launcher, settings.kernels)
            pool = KernelPool(settings.kernels, launcher=launcher)
            stack.push_async_callback(pool.shutdown_all)
            await pool.start()
            reaper = Reaper(pool, settings.kernels)
            reaper.start()
            stack.push_async_callback(reaper.stop)
            agent = Agent(settings.llm)
            stack.push_async_callback(agent.close)
            turns = TurnRunner(settings=settings, store=store, pool=pool, agent=agent)
            commands = Commands(store=store, pool=pool, export_dir=settings.storage.path.parent / "exports")
            dispatcher = Dispatcher(settings=settings, store=store, turns=turns, commands=commands)
            yield cls(settings=settings, store=store, pool=pool, agent=agent, dispatcher=dispatcher)


def platform_adapters(settings: Settings, dispatcher: Dispatcher) -> list[Adapter]:
    """The adapters of every platform whose token is configured."""
    adapters: list[Adapter] = []
    if settings.slack.enabled:
        from adapters.slack import SlackAdapter

        adapters.append(SlackAdapter(settings.slack, dispatcher))
    if settings.discord.enabled:
        from adapters.discord import DiscordAdapter

        adapters.append(DiscordAdapter(settings.discord, dispatcher))
    return adapters


async def run_bot(settings: Settings) -> int:
    """Run every configured platform until SIGINT/SIGTERM. Returns the exit code."""
    if not (settings.slack.enabled or settings.discord.enabled):
        log.error(NO_PLATFORM_MESSAGE)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        async with Core.open(settings) as core:
            adapters = platform_adapters(settings, core.dispatcher)
            started: list[Adapter] = []
            try:
                for adapter in adapters:
                    try:
                        await adapter.start()
                    except AdapterStartError as exc:
                        log.error("%s could not start: %s", type(adapter).__name__, exc)
                        return 2
                    started.append(adapter)
                log.info("Threadbook is running (%s); Ctrl-C stops it.", ", ".join(type(a).__name__ for a in started))
                await stop.wait()
            finally:
                for adapter in reversed(started):
                    try:
                        await adapter.stop()
                    except Exception:
                        log.exception("stopping %s failed", type(adapter).__name__)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    return 0
