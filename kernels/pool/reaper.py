"""Background clean-up: cull idle kernels and delete workspaces past their retention."""

from __future__ import annotations

import logging

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from kernels.pool.pool import KernelPool
from kernels.seam.settings import KernelSettings

log = logging.getLogger(__name__)
_DAY_S = 86_400.0


class Reaper:
    """Two apscheduler jobs: idle kernels every ``reap_interval_s``, stale workspaces hourly."""

    def __init__(self, pool: KernelPool, settings: KernelSettings) -> None:
        self.pool = pool
        self.settings = settings
        self._scheduler: AsyncIOScheduler | None = None

    def start(self) -> None:
        """Schedule the jobs on the running event loop."""
        scheduler = AsyncIOScheduler()
        interval = self.settings.reap_interval_s
        scheduler.add_job(self.cull_kernels, "interval", seconds=interval, max_instances=1, coalesce=True)
        scheduler.add_job(
            self.delete_workspaces, "interval", seconds=max(interval, 3600.0), max_instances=1, coalesce=True
        )
        scheduler.start()
        self._scheduler = scheduler

    async def stop(self) -> None:
        """Remove the jobs (a running one finishes on its own)."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None

    async def cull_kernels(self) -> list[str]:
        """Shut down kernels idle longer than ``idle_timeout_s`` (their workspaces stay)."""
        try:
            culled = await self.pool.cull_idle(self.settings.idle_timeout_s)
        except Exception:
            log.exception("culling idle kernels failed")
            return []
        if culled:
            log.info("reaper culled %d idle kernel(s): %s", len(culled), ", ".join(culled))
        return culled

    async def delete_workspaces(self) -> int:
        """Delete workspaces unused for ``retention_days``, sparing those with a live kernel."""
        live = {session.key for session in self.pool.sessions()}
        try:
            deleted = await self.pool.workspaces.delete_stale(self.settings.retention_days * _DAY_S, keep=live)
        except Exception:
            log.exception("deleting stale workspaces failed")
            return 0
        for path in deleted:
            log.info("reaper deleted stale workspace %s", path)
        return len(deleted)
