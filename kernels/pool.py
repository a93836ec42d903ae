"""Thread key → kernel session, with a ``max_kernels`` cap and LRU eviction of idle kernels."""

from __future__ import annotations

import asyncio
import logging
import time

from bot.config import KernelSettings
from kernels.forkserver import ForkingLauncher
from kernels.launcher import KernelLauncher
from kernels.options import KernelOptions
from kernels.result import PoolFullError
from kernels.sandbox import make_launcher
from kernels.session import KernelSession
from kernels.warm import HandOff, WarmPool
from kernels.workspace import WorkspaceManager

log = logging.getLogger(__name__)


class KernelPool:
    """Owns every kernel session; whoever asks for a key gets the same session back."""

    def __init__(
        self,
        settings: KernelSettings,
        *,
        workspaces: WorkspaceManager | None = None,
        launcher: KernelLauncher | None = None,
    ) -> None:
        self.settings = settings
        self.workspaces = workspaces or WorkspaceManager(
            settings.workspace_root,
            max_file_bytes=int(settings.max_upload_mb * 1024 * 1024),
            quota_bytes=int(settings.workspace_quota_mb * 1024 * 1024),
        )
        self.launcher = launcher or make_launcher(settings)
        self._sessions: dict[str, KernelSession] = {}
        #: Keys whose kernel ran code and was stopped by the pool (culled, evicted).
        self._lost: set[str] = set()
        self._lock = asyncio.Lock()
        if settings.fork_server and ForkingLauncher.supports(self.launcher):
            self.launcher = ForkingLauncher(self.launcher)
        #: Kernels started ahead for new threads (``warm_pool``); they count toward ``max_kernels``.
        self.warm: WarmPool | None = None
        if settings.warm_pool:
            self.warm = WarmPool(
                self.launcher,
                root=self.workspaces.root,
                size=settings.warm_pool,
                options=KernelOptions(network=settings.network),
                has_room=lambda: self._kernel_count() < settings.max_kernels,
                busy=lambda: any(s.state == "busy" for s in self._sessions.values()),
            )

    async def start(self) -> None:
        """Start background work: the fork server, filling the warm pool."""
        if isinstance(self.launcher, ForkingLauncher):
            await self.launcher.server.launch()
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

    async def get_or_start(self, key: str, options: KernelOptions = KernelOptions()) -> KernelSession:
        """The session of ``key``, starting a kernel when there is none; either way it counts
        as activity (idle culling and LRU eviction measure from here).

        When ``max_kernels`` are running, the least recently used idle one is shut down;
        if all are busy, :class:`PoolFullError` is raised.
        """
        async with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                # Asking counts as use: the turn that asked runs code once the model answers;
                # the idle clock restarts so the reaper or an LRU eviction does not take it meanwhile.
                session.last_activity = time.monotonic()
            else:
                warm = await self.warm.take() if self.warm is not None and self.warm.fits(options) else None
                if warm is None and self._kernel_count() >= self.settings.max_kernels:
                    if self.warm is None or not await self.warm.shrink():
                        await self._evict_one()
                session = KernelSession(
                    key,
                    self.workspaces.for_key(key),
                    self.settings,
                    launcher=self.launcher if warm is None else HandOff(warm, self.launcher),
                    options=options,
                    lost_state=key in self._lost,
                )
                self._lost.discard(key)
                self._sessions[key] = session
        try:
            await session.start()  # outside the pool lock: other threads start in parallel
        except BaseException:
            if self._sessions.get(key) is session and not await session.is_alive():
                del self._sessions[key]
                await session.shutdown()
            raise
        return session

    async def _evict_one(self) -> None:
        idle = [s for s in self._sessions.values() if not s.busy]
        if not idle:
            raise PoolFullError(
                f"all {self.settings.max_kernels} kernels are busy; try again in a moment"
            )
        victim = min(idle, key=lambda s: s.last_activity)
        log.info("evicting the least recently used kernel %s (idle %.0f s)", victim.key, victim.idle_seconds())
        await self._stop(victim)

    async def _stop(self, session: KernelSession) -> None:
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]
        if session.executions:
            self._lost.add(session.key)
        await session.shutdown()
        if self.warm is not None:
            self.warm.kick()  # room for a warm kernel again

    async def cull_idle(self, idle_timeout_s: float) -> list[str]:
        """Shut down kernels idle longer than ``idle_timeout_s`` and not busy; workspaces stay."""
        culled: list[str] = []
        if self.warm is not None:  # warm kernels are never culled; retention must spare their folders
            await asyncio.to_thread(self.warm.touch)
        for session in self.sessions():
            try:
                if session.busy or session.idle_seconds() <= idle_timeout_s:
                    continue
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
        self._sessions.clear()
        results = await asyncio.gather(*(s.shutdown() for s in sessions), return_exceptions=True)
        for session, outcome in zip(sessions, results):
            if isinstance(outcome, BaseException):
                log.error("shutting down the kernel of %s failed: %r", session.key, outcome)
        if isinstance(self.launcher, ForkingLauncher):
            await self.launcher.server.stop()
