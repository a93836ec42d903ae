"""Wires the parts together: store, kernel pool, reaper, agent, dispatcher, adapters.

The composition root: the only module of ``bot`` that imports ``adapters`` (``make check``
holds the layering; see ``[tool.importlinter]`` in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from adapters.base import Adapter, AdapterStartError
from bot import metrics
from bot.admission import Admission
from bot.agent.loop import Agent
from bot.budgets import Budgets, Clock
from bot.commands import Commands
from bot.config import Settings
from bot.dispatcher import Dispatcher
from bot.events import Outbox, ThreadKey, ThreadReach
from bot.health import OpsServer, Readiness
from bot.hostpaths import HostPaths
from bot.line import INTERRUPTED_NOTICE
from bot.loopwatch import LoopWatchdog
from bot.mcp.registry import McpServers
from bot.outgoing import hiding_reach
from bot.record import TurnRecords
from bot.schedules.runner import POLL_S, Scheduler
from bot.sources.registry import Sources
from bot.store import Store
from bot.turn import TurnRunner
from kernels import KernelPool, OneShot, Reaper, build_launcher, oneshot_for, package_installer

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
    #: What budgets, usage reports and schedules count time with.
    clock: Clock = time.time
    #: Watches the event loop from a thread of its own (``/healthz`` asks it).
    watchdog: LoopWatchdog | None = None
    #: The MCP servers channels may be granted (``/readyz`` shows them).
    mcp: McpServers | None = None
    #: Where the bot's own work on untrusted data runs (upload previews, ``export html``).
    oneshot: OneShot | None = None

    def reaching(self, reaches: Sequence[ThreadReach]) -> list[ThreadReach]:
        """``reaches`` whose outboxes hide host paths, as every outbox the dispatcher hands on:
        for what the core posts with no message to answer (scheduled runs, restart notices)."""
        paths = HostPaths.of(self.settings)
        return [hiding_reach(reach, paths) for reach in reaches]

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: Settings, *, clock: Clock = time.time) -> AsyncIterator[Core]:
        """Start the core; on exit stop the reaper and every kernel, close the store.
        ``clock``: what budgets and usage reports count time with (tests pass their own)."""
        async with AsyncExitStack() as stack:
            watchdog = LoopWatchdog()
            watchdog.start()
            stack.callback(watchdog.stop)
            store = await Store.open(
                settings.storage.resolved_url, replica_timeout_s=settings.storage.replica_timeout_s
            )
            stack.push_async_callback(store.close)
            # Choosing the launcher probes bubblewrap (and slirp4netns) with real processes: off the loop.
            launcher = await asyncio.to_thread(build_launcher, settings.kernels)
            pool = KernelPool(settings.kernels, launcher=launcher)
            stack.push_async_callback(pool.shutdown_all)
            await pool.start()
            reaper = Reaper(pool, settings.kernels)
            reaper.start()
            stack.push_async_callback(reaper.stop)
            agent = Agent(settings.llm)
            stack.push_async_callback(agent.close)
            # One installer for the process: its lock serialises every thread's installs.
            packages = package_installer(settings.kernels, launcher)
            budgets = Budgets(settings, store.usage, clock=clock)
            sources = Sources(settings.sources)
            stack.push_async_callback(sources.close)
            # One shared session per MCP server; one that is down is logged and tried again later.
            mcp = McpServers(settings.mcp)
            stack.push_async_callback(mcp.close)
            await mcp.open()
            # The bot's own work (upload previews, export html) runs in fresh sandboxed one-shots.
            oneshot = await asyncio.to_thread(oneshot_for, settings.kernels, launcher)
            await oneshot.open()  # the one-shot fork server starts in the background
            stack.push_async_callback(oneshot.close)
            turns = TurnRunner(
                settings=settings,
                records=TurnRecords(store.transcripts, store.usage, store.write_all),
                threads=store.threads,
                pool=pool,
                agent=agent,
                budgets=budgets,
                oneshot=oneshot,
                packages=packages,
                sources=sources,
                mcp=mcp,
            )
            commands = Commands(store=store, pool=pool, settings=settings, oneshot=oneshot, clock=clock, mcp=mcp)
            admission = Admission(settings, store, budgets)
            dispatcher = Dispatcher(
                settings=settings, store=store, admission=admission, turns=turns, commands=commands, pool=pool
            )
            yield cls(
                settings=settings,
                store=store,
                pool=pool,
                agent=agent,
                dispatcher=dispatcher,
                clock=clock,
                watchdog=watchdog,
                mcp=mcp,
                oneshot=oneshot,
            )


@asynccontextmanager
async def serve_ops(core: Core, *, host: str | None = None, port: int | None = None) -> AsyncIterator[OpsServer]:
    """The operations endpoints (/healthz, /readyz, /metrics) of ``core`` while the block runs,
    on ``ops.http_host:ops.http_port`` unless ``host``/``port`` say otherwise (port 0: any
    free port). Raises OSError when it cannot listen."""
    readiness = Readiness(
        store=core.store,
        llm=core.settings.llm,
        kernels=core.settings.kernels,
        launcher=core.pool.launcher,
        mcp=core.mcp,
    )
    server = OpsServer(
        readiness,
        host=core.settings.ops.http_host if host is None else host,
        port=core.settings.ops.http_port if port is None else port,
        watchdog=core.watchdog,
    )
    unwatch = metrics.watch(core.pool, core.dispatcher)
    try:
        await server.start()
        yield server
    finally:
        unwatch()
        await server.stop()


def start_schedules(core: Core, reaches: Sequence[ThreadReach], *, poll_s: float = POLL_S) -> Scheduler | None:
    """Start running due schedules into the threads ``reaches`` serve (None when
    ``schedules.enabled`` is off); stop it with :meth:`Scheduler.stop`."""
    if not core.settings.schedules.enabled:
        return None
    scheduler = Scheduler(
        book=core.store.schedules,
        handle=core.dispatcher.handle,
        reaches=core.reaching(reaches),
        clock=core.clock,
        poll_s=poll_s,
    )
    scheduler.start()
    return scheduler


def import_platforms(settings: Settings) -> None:
    """(Blocking) import the adapters of every platform whose token is configured: their SDKs
    take half a second or more to import, which :func:`run_bot` spends in a thread while the
    core starts, not on the event loop (``/healthz`` would call that a stalled loop)."""
    for enabled, module in ((settings.slack.enabled, "adapters.slack"), (settings.discord.enabled, "adapters.discord")):
        if enabled:
            importlib.import_module(module)


def freeze_startup_heap() -> None:
    """Collect once, then put every object the start made (modules, settings, the core) in the
    collector's permanent generation, where no collection walks them again.

    Call once everything is imported and built, before events come. A full collection walks
    every tracked object, and one comes whenever the objects made since the last reach a
    quarter of them: with the start's ~300,000 objects it held the event loop 0.1-0.25 s,
    in a crowd of turns too (``bench/README.md``). What turns make is collected as before.
    """
    gc.collect()
    gc.freeze()


def platform_adapters(settings: Settings, dispatcher: Dispatcher) -> list[Adapter]:
    """The adapters of every platform whose token is configured (imported by
    :func:`import_platforms` first, or here)."""
    adapters: list[Adapter] = []
    if settings.slack.enabled:
        from adapters.slack import SlackAdapter

        adapters.append(SlackAdapter(settings.slack, dispatcher, channels=settings.channels))
    if settings.discord.enabled:
        from adapters.discord import DiscordAdapter

        adapters.append(DiscordAdapter(settings.discord, dispatcher))
    return adapters


async def tell_interrupted(store: Store, adapters: Sequence[ThreadReach]) -> int:
    """Post :data:`INTERRUPTED_NOTICE` once into each thread whose turn an unclean stop cut off.

    Call once the adapters run. Turns of threads no adapter here can reach (their platform is
    not enabled now) stay in the store for a later start. A thread that cannot be told is
    logged and skipped; nothing here raises. Returns the number of threads told.
    """
    outboxes: dict[ThreadKey, Outbox] = {}
    left: set[ThreadKey] = set()

    def reachable(thread: ThreadKey) -> bool:
        if thread in outboxes:
            return True
        try:
            outbox = next((o for a in adapters if (o := a.outbox_for(thread)) is not None), None)
        except Exception:
            log.exception("could not find a way to reach %s; it stays for a later start", thread)
            outbox = None
        if outbox is None:
            left.add(thread)
            return False
        outboxes[thread] = outbox
        return True

    try:
        turns = await store.turns.take_interrupted(reachable)
    except Exception:
        log.exception("could not read the turns interrupted by the last stop")
        return 0
    told = 0
    for thread in dict.fromkeys(turn.thread for turn in turns):  # one notice per thread, oldest first
        outbox = outboxes[thread]
        try:
            await outbox.notify(INTERRUPTED_NOTICE)
        except Exception:
            log.exception("could not tell %s that its message was interrupted", thread)
            continue
        told += 1
    if turns or left:
        log.info(
            "interrupted turns: notified %d thread(s); %d kept for later (no adapter here reaches them)",
            told,
            len(left),
        )
    return told


async def tell_interrupted_while_running(store: Store, adapters: Sequence[ThreadReach], every_s: float) -> None:
    """:func:`tell_interrupted` at start, and with a shared store every ``every_s`` after: a
    replica that dies leaves turns that only the others can report."""
    while True:
        await tell_interrupted(store, adapters)
        if not store.shared:
            return
        await asyncio.sleep(every_s)


async def run_console(
    settings: Settings, out: Path, thread: str | None, log_path: Path | None, *, quiet: bool = False
) -> int:
    """Chat with the bot in this terminal (or through a pipe) until the input ends; files go
    to the thread's own folder under ``out``. Returns the exit code."""
    from adapters.console import ConsoleAdapter

    async with Core.open(settings) as core:
        console = ConsoleAdapter(
            core.dispatcher, out_dir=out, thread=thread, log_path=log_path, quiet=quiet, thread_folders=True
        )
        freeze_startup_heap()
        # A resumed --thread whose last turn was cut off by an unclean stop hears it first;
        # other threads' leftovers stay for their own resumption or platform.
        await tell_interrupted(core.store, core.reaching([console]))
        scheduler = start_schedules(core, [console])
        try:
            await console.run()
        finally:
            if scheduler is not None:
                await scheduler.stop(0.0)
    return 0


async def stop_adapters(adapters: Sequence[Adapter], grace_s: float) -> None:
    """Stop every adapter at once: none takes new events, running turns share one grace period."""
    if adapters:
        log.info("stopping: running turns get up to %.0f s to finish", grace_s)
    results = await asyncio.gather(*(adapter.stop(grace_s) for adapter in adapters), return_exceptions=True)
    for adapter, outcome in zip(adapters, results):
        if isinstance(outcome, BaseException):
            log.error("stopping %s failed: %r", type(adapter).__name__, outcome)


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
    imports = asyncio.ensure_future(asyncio.to_thread(import_platforms, settings))
    try:
        async with Core.open(settings) as core, AsyncExitStack() as ops_stack:
            ops: OpsServer | None = None
            if settings.ops.http_port:
                try:
                    ops = await ops_stack.enter_async_context(serve_ops(core))
                except OSError as exc:
                    log.error(
                        "ops.http_port: cannot listen on %s:%d: %s", settings.ops.http_host, settings.ops.http_port, exc
                    )
                    return 2
            await imports
            adapters = platform_adapters(settings, core.dispatcher)
            freeze_startup_heap()  # before any event: the one collection delays nobody
            started: list[Adapter] = []
            scheduler: Scheduler | None = None
            try:
                for adapter in adapters:
                    try:
                        await adapter.start()
                    except AdapterStartError as exc:
                        log.error("%s could not start: %s", type(adapter).__name__, exc)
                        return 2
                    started.append(adapter)
                log.info("Threadbook is running (%s); Ctrl-C stops it.", ", ".join(type(a).__name__ for a in started))
                scheduler = start_schedules(core, started)
                # In the background: a slow platform must not hold up start-up or a stop signal.
                notices = asyncio.create_task(
                    tell_interrupted_while_running(
                        core.store, core.reaching(started), settings.storage.replica_timeout_s / 2
                    ),
                    name="interrupted-notices",
                )
                try:
                    await stop.wait()
                finally:
                    if ops is not None:
                        ops.readiness.stopping = True  # /readyz: 503 while the turns finish
                    notices.cancel()
                    with suppress(asyncio.CancelledError):
                        await notices
            finally:
                # Scheduled runs and the adapters' turns share one grace period.
                grace = settings.ops.shutdown_grace_s
                stopping = [stop_adapters(started, grace)]
                if scheduler is not None:
                    stopping.append(scheduler.stop(grace))
                await asyncio.gather(*stopping)
    finally:
        imports.cancel()  # when the core could not start: nobody waits for the imports
        for sig in signals:
            loop.remove_signal_handler(sig)
    return 0
