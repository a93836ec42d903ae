"""Thread key → kernel session, with a ``max_kernels`` cap, LRU eviction of idle kernels and a
first-come-first-served queue (:mod:`kernels.pool.queue`) for new threads when every kernel
is in use.

A kernel is *in use* while it executes, starts, or is leased by a turn (:meth:`KernelPool.lease`:
a turn holds its kernel between executions while the model thinks). A new thread that finds
no room waits in the queue until a lease ends or a kernel stops, then takes the least recently
used idle kernel's place; a thread that already has a kernel never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from kernels.host.workspace import WorkspaceManager
from kernels.pool.queue import OnWait, QueueStats, Ticket, WaitingLine
from kernels.seam.options import KernelOptions
from kernels.seam.plan import Launcher
from kernels.seam.settings import KernelSettings
from kernels.session.session import KernelSession
from kernels.session.snapshots import SAVE_TIMEOUT_S
from kernels.warm.pool import HandOff, WarmKernel, WarmPool
from kernels.warm.target import WarmTarget, available_memory

log = logging.getLogger(__name__)

#: The after-turn save waits until the thread has been quiet this long: turns in quick
#: succession do not wait for saves between them; a bot killed within this time of a turn's
#: end loses that turn.
QUIET_BEFORE_SAVE_S = 1.0
#: The after-turn save waits at least this long between looks (never a loop without a pause)
#: and looks at most this many times: activity that keeps coming ends it (the turn's own lease
#: schedules the next save).
_SAVE_WAIT_FLOOR_S = 0.05
_SAVE_LOOKS = 20


class Departures:
    """What a thread's next session must know of the one that left the pool (culled, evicted,
    died): that its variables were lost, and why its kernel stopped unasked if the thread was
    not told yet."""

    def __init__(self) -> None:
        #: Keys whose kernel ran code and was stopped by the pool (culled, evicted) or died.
        self._lost: set[str] = set()
        #: Key → why its last kernel stopped unasked, until the thread's next session tells it.
        self._died: dict[str, str] = {}

    def left(self, session: KernelSession) -> None:
        """``session`` left the pool: its thread's next session hears that state was lost."""
        if session.executions or session.state == "dead":
            self._lost.add(session.key)
        if (why := session.notices.died) is not None:
            self._died[session.key] = why

    def lost_state(self, key: str) -> bool:
        """Whether ``key``'s last session lost variables (asked once, by its next session)."""
        if key in self._lost:
            self._lost.discard(key)
            return True
        return False

    def died(self, key: str) -> str | None:
        """Why ``key``'s last kernel stopped unasked, if the thread was not told (asked once)."""
        return self._died.pop(key, None)


class KernelPool:
    """Owns every kernel session; whoever asks for a key gets the same session back."""

    def __init__(
        self,
        settings: KernelSettings,
        *,
        launcher: Launcher,
        workspaces: WorkspaceManager | None = None,
        warm_target: WarmTarget | None = None,
    ) -> None:
        """``launcher``: how kernels start (:func:`kernels.build.build_launcher`); the pool
        opens and closes it (:meth:`start`, :meth:`shutdown_all`). ``warm_target``: the
        target of ``warm_pool: auto`` (tests and benchmarks compress its windows); by
        default one with the standard windows and, for local kernels, the memory cap."""
        self.settings = settings
        self.workspaces = workspaces or WorkspaceManager(
            settings.workspace_root,
            max_file_bytes=int(settings.max_upload_mb * 1024 * 1024),
            quota_bytes=int(settings.workspace_quota_mb * 1024 * 1024),
        )
        self.launcher = launcher
        self._sessions: dict[str, KernelSession] = {}
        #: New threads waiting for a kernel when every kernel is in use.
        self._line = WaitingLine(settings)
        self._leases: Counter[str] = Counter()
        #: What the sessions that left told their threads' next ones.
        self._departed = Departures()
        self._lock = asyncio.Lock()
        #: Thread key → its after-turn save, waiting for quiet or running (:meth:`_save_in_background`).
        self._saves: dict[str, asyncio.Task[None]] = {}
        #: Set by :meth:`shutdown_all`: after-turn saves stop waiting (the shutdown saves every thread).
        self._closing = asyncio.Event()
        #: Kernels started ahead for new threads (``warm_pool``); they count toward ``max_kernels``.
        self.warm: WarmPool | None = None
        if settings.warm_pool:
            size: int | WarmTarget
            if settings.warm_pool == "auto":
                size = warm_target or WarmTarget(
                    max_kernels=settings.max_kernels,
                    memory=None if settings.gateway.enabled else available_memory,  # a gateway's kernels use its memory
                )
            else:
                size = settings.warm_pool
            self.warm = WarmPool(
                self.launcher,
                root=self.workspaces.root,
                size=size,
                preload=settings.preload,
                options=KernelOptions(network=settings.network),
                has_room=lambda: self._kernel_count() < settings.max_kernels,
                busy=lambda: any(s.state == "busy" for s in self._sessions.values()),
                sessions=lambda: len(self._sessions),
            )

    async def start(self) -> None:
        """Start background work: the launcher's (a fork server), filling the warm pool."""
        await self.launcher.open()
        if self.warm is not None:
            self.warm.start()

    def _kernel_count(self) -> int:
        return len(self._sessions) + (self.warm.count if self.warm is not None else 0)

    def get(self, key: str) -> KernelSession | None:
        """The session of ``key``, if one exists."""
        return self._sessions.get(key)

    def sessions(self) -> list[KernelSession]:
        """A snapshot of all sessions."""
        return list(self._sessions.values())

    @property
    def max_queue(self) -> int:
        """How many threads may wait for a kernel at once."""
        return self._line.max_queue

    def queue_stats(self) -> QueueStats:
        """The queue's length and the recent waits (for ``status``)."""
        return self._line.stats()

    @asynccontextmanager
    async def lease(
        self,
        key: str,
        options: KernelOptions = KernelOptions(),
        *,
        on_wait: OnWait | None = None,
        leave: asyncio.Event | None = None,
    ) -> AsyncIterator[KernelSession]:
        """The session of ``key`` (see :meth:`get_or_start`), held in use until the block ends:
        no eviction takes it while its turn waits for the model."""
        session = await self.get_or_start(key, options, on_wait=on_wait, leave=leave)
        self._leases[key] += 1
        try:
            yield session
        finally:
            self._leases[key] -= 1
            if self._leases[key] <= 0:
                del self._leases[key]
                self._save_in_background(session)
            self._line.wake()

    def _save_in_background(self, session: KernelSession) -> None:
        """After a turn (the last lease ended): save the thread's variables once the thread has
        been quiet for :data:`QUIET_BEFORE_SAVE_S`, while nobody waits, so a crash of the bot
        loses at most the turn that was running. One task per thread: turns in quick
        succession are saved once, after the last."""
        if not self.settings.snapshot or self._closing.is_set():
            return
        if (running := self._saves.get(session.key)) is not None and not running.done():
            return
        task = asyncio.create_task(self._save_when_quiet(session), name=f"save-{session.key}")
        self._saves[session.key] = task
        task.add_done_callback(functools.partial(self._saved, session.key))

    async def _save_when_quiet(self, session: KernelSession) -> None:
        """Wait for quiet, then try one save, whatever comes of it: a save that cannot happen
        (dead kernel, no room, a timeout) was logged by the session and is not retried here.
        A kernel found dead takes its session out of the pool."""
        for _ in range(_SAVE_LOOKS):
            if self._sessions.get(session.key) is not session or self._closing.is_set():
                return
            if session.key in self._leases or session.busy:
                return  # in use again: the lease that ends schedules the next save
            wait = QUIET_BEFORE_SAVE_S - session.idle_seconds()
            if wait <= 0:
                await session.save_state(only_if_quick=True)
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), max(wait, _SAVE_WAIT_FLOOR_S))
        else:
            return
        if not await session.check_alive():
            await self._drop_dead(session)

    async def _drop_dead(self, session: KernelSession) -> bool:
        """Take the session of a kernel that died out of the pool (unless a turn holds it:
        the turn's next execution starts a fresh kernel and says so); whether it left. The
        thread's next session tells it what happened, if nobody did yet."""
        key = session.key
        if self._sessions.get(key) is not session or session.busy or key in self._leases:
            return False
        log.warning("the kernel of %s died: its session leaves the pool", key)
        del self._sessions[key]
        self._departed.left(session)
        await session.shutdown()
        if self.warm is not None:
            self.warm.kick()
        self._line.wake()
        return True

    def _saved(self, key: str, task: asyncio.Task[None]) -> None:
        if self._saves.get(key) is task:
            del self._saves[key]
        self._line.wake()  # the session is idle again: a waiting thread may take its place
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("saving a thread's variables failed: %r", error)

    async def get_or_start(
        self,
        key: str,
        options: KernelOptions = KernelOptions(),
        *,
        on_wait: OnWait | None = None,
        leave: asyncio.Event | None = None,
    ) -> KernelSession:
        """The session of ``key``, starting a kernel when there is none; either way it counts
        as activity (idle culling and LRU eviction measure from here).

        When ``max_kernels`` are running, the least recently used idle one is shut down. When
        all are in use, the call waits its turn in a first-come-first-served queue (``on_wait``
        hears how many are ahead); it raises :class:`QueueFullError` when ``max_queue`` threads
        wait already, :class:`QueueTimeoutError` after ``queue_timeout_s``, and
        :class:`QueueLeftError` once ``leave`` is set.
        """
        ticket: Ticket | None = None
        session: KernelSession | None = None
        try:
            while True:
                async with self._lock:
                    session = self._sessions.get(key)
                    if session is not None and session.state == "dead" and await self._drop_dead(session):
                        session = None  # it died since its last turn: a new session takes over
                    if session is not None:
                        # Asking counts as use: the turn that asked runs code once the model answers;
                        # the idle clock restarts so the reaper or an LRU eviction does not take it meanwhile.
                        session.last_activity = time.monotonic()
                        break
                    if ticket is None and self._line.waiting:
                        ticket = self._line.join(key)  # others came first
                    if ticket is None or self._line.first(ticket):
                        room, warm = await self._room(options)
                        if room:
                            session = self._new_session(key, options, warm)
                            if self.warm is not None and self.warm.fits(options):
                                self.warm.arrived(hit=warm is not None)  # a new thread, or one whose kernel stopped
                            break
                        if ticket is None:
                            ticket = self._line.join(key)
                await self._line.wait(ticket, on_wait, leave)
        finally:
            if ticket is not None:
                self._line.leave(ticket, served=session is not None and self._sessions.get(key) is session)
        try:
            await session.start()  # outside the pool lock: other threads start in parallel
        except BaseException:
            if self._sessions.get(key) is session and not await session.is_alive():
                del self._sessions[key]
                await session.shutdown()
            raise
        return session

    def _new_session(self, key: str, options: KernelOptions, warm: WarmKernel | None) -> KernelSession:
        session = KernelSession(
            key,
            self.workspaces.for_key(key),
            self.settings,
            launcher=self.launcher if warm is None else HandOff(warm, self.launcher),
            options=options,
            lost_state=self._departed.lost_state(key),
            died=self._departed.died(key),
        )
        self._sessions[key] = session
        return session

    async def _room(self, options: KernelOptions, *, use_warm: bool = True) -> tuple[bool, WarmKernel | None]:
        """(Under the lock) whether a new kernel fits, making room when it can: a warm kernel
        to hand out (unless not ``use_warm``), a free slot, a warm kernel given back, or the
        LRU idle kernel evicted."""
        usable = use_warm and self.warm is not None and self.warm.fits(options)
        warm = await self.warm.take() if usable and self.warm is not None else None
        if warm is not None or self._kernel_count() < self.settings.max_kernels:
            return True, warm
        if self.warm is not None and await self.warm.shrink():
            return True, None
        idle = [s for s in self._sessions.values() if not s.busy and s.key not in self._leases]
        if not idle:
            return False, None
        victim = min(idle, key=lambda s: s.last_activity)
        log.info("evicting the least recently used kernel %s (idle %.0f s)", victim.key, victim.idle_seconds())
        await self._stop(victim)
        return True, None

    async def save(self, key: str) -> None:
        """Save ``key``'s variables now, if it has a kernel and code ran since the last save
        (another process is about to serve the thread: it restores them). Never raises."""
        session = self._sessions.get(key)
        if session is not None:
            await self._save(session)

    async def take_over(self, key: str, remote_id: str, options: KernelOptions = KernelOptions()) -> bool:
        """Take over ``key``'s running kernel ``remote_id``, which another process of the bot
        started and left when it died: the thread's variables stay live. A kernel of ``key``
        here is stopped first, unsaved (it is out of date). False when the launcher cannot
        attach (local kernels), the kernel is gone, or there is no room for another kernel."""
        handle = await self.launcher.attach(remote_id)
        if handle is None:
            return False
        await self.discard(key)
        async with self._lock:
            room = key not in self._sessions and (await self._room(options, use_warm=False))[0]
            if not room:
                await handle.shutdown()
                return False
            session = KernelSession(
                key,
                self.workspaces.for_key(key),
                self.settings,
                launcher=self.launcher,
                options=options,
                taken_over=handle,
            )
            self._departed.lost_state(key)  # its variables live on in the kernel taken over
            self._sessions[key] = session
        await session.start()
        return True

    async def discard(self, key: str) -> None:
        """Stop ``key``'s kernel without saving: another process served the thread since, so
        these variables are out of date; the thread's next kernel restores the saved ones."""
        session = self._sessions.get(key)
        if session is not None:
            await self._stop(session, save=False)

    async def _stop(self, session: KernelSession, *, save: bool = True) -> None:
        """Stop ``session``'s kernel; unless ``save`` is False, its variables are saved first
        (when code ran since the last save) and its next kernel restores them."""
        if save:
            await self._save(session)
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]
        self._departed.left(session)
        await session.shutdown()
        if self.warm is not None:
            self.warm.kick()  # room for a warm kernel again
        self._line.wake()

    async def _save(self, session: KernelSession) -> None:
        """Save ``session``'s variables if it has unsaved ones; a failure is logged, never raised
        (the kernel stops either way)."""
        try:
            await session.save_state()
        except Exception:
            log.exception("saving the variables of %s failed", session.key)

    async def forget_state(self, key: str) -> None:
        """``reset``: a fresh kernel for ``key`` if it has one, and its saved variables deleted."""
        session = self._sessions.get(key)
        if session is not None:
            await session.restart()
        else:
            await asyncio.to_thread(self.workspaces.for_key(key).forget_state)

    async def cull_idle(self, idle_timeout_s: float) -> list[str]:
        """Shut down kernels idle longer than ``idle_timeout_s`` and not busy; workspaces stay.
        Sessions whose kernel died while idle leave the pool (not counted as culled)."""
        culled: list[str] = []
        if self.warm is not None:  # warm kernels are never culled; retention must spare their folders
            await asyncio.to_thread(self.warm.touch)

        def still_idle(session: KernelSession) -> bool:
            return not session.busy and session.key not in self._leases and session.idle_seconds() > idle_timeout_s

        for session in self.sessions():
            try:
                if session.key not in self._leases and session.state != "new" and not await session.check_alive():
                    await self._drop_dead(session)
                    continue
                if not still_idle(session):
                    continue
                await self._save(session)
                if not still_idle(session):
                    continue  # the thread came back while its variables were saved
                await self._stop(session)
                culled.append(session.key)
                log.info("culled idle kernel %s", session.key)
            except Exception:
                log.exception("culling the kernel of %s failed", session.key)
        return culled

    async def shutdown(self, key: str) -> None:
        """Shut down the kernel of ``key`` (its workspace stays)."""
        session = self._sessions.get(key)
        if session is not None:
            await self._stop(session)

    async def shutdown_all(self) -> None:
        """Shut down every kernel; no process the pool started outlives this call."""
        if self.warm is not None:
            await self.warm.stop()
        sessions = self.sessions()
        # Every thread's variables first, in parallel (each kernel serialises its own): the
        # next start of the bot restores them. A save already running is waited for.
        # A turn still running holds its session: its save waits for it, but not past the bound.
        self._closing.set()
        saves = asyncio.gather(*self._saves.values(), *(self._save(s) for s in sessions), return_exceptions=True)
        try:
            await asyncio.wait_for(saves, SAVE_TIMEOUT_S)
        except TimeoutError:
            log.warning("saving every thread's variables took over %.0f s: stopping the kernels anyway", SAVE_TIMEOUT_S)
        self._sessions.clear()
        results = await asyncio.gather(*(s.shutdown() for s in sessions), return_exceptions=True)
        for session, outcome in zip(sessions, results):
            if isinstance(outcome, BaseException):
                log.error("shutting down the kernel of %s failed: %r", session.key, outcome)
        await self.launcher.close()
