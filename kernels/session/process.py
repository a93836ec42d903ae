"""A thread's current kernel process: started or taken over, thawed for work and frozen after it,
its CPU time metered, asked questions outside any cell, and lost when it dies or gets stuck.

The :class:`~kernels.session.session.KernelSession` holds one and decides when; this module
owns how. A kernel that cannot be frozen between turns, or thawed for work, is lost (fail
closed), and the thread hears why (:class:`~kernels.session.notices.Notices`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator

from kernels.host.workspace import Workspace
from kernels.seam.options import KernelOptions
from kernels.seam.plan import KernelHandle, Launcher
from kernels.seam.result import KernelError
from kernels.seam.settings import KernelSettings
from kernels.session.execution import Evaluation
from kernels.session.notices import LEFTOVERS_NOTICE, Notices, exit_text
from kernels.session.snapshots import Snapshots

log = logging.getLogger(__name__)


class CpuMeter:
    """The CPU seconds a thread's kernels used: read from each kernel after each piece of work
    and before it is discarded, so a kernel killed, stuck or over its quota is billed too."""

    def __init__(self) -> None:
        #: The current kernel's CPU seconds at its last reading (None: not known).
        self._read: float | None = None
        #: Seconds used since the last :meth:`take` (None: not known).
        self._untaken: float | None = None

    @property
    def reading(self) -> float | None:
        """The current kernel's CPU seconds at the last reading (benchmarks watch it change)."""
        return self._read

    def started(self, used: float | None) -> None:
        """A kernel started having used ``used`` seconds (its start is not the thread's to pay)."""
        self._read = used
        if used is not None and self._untaken is None:
            self._untaken = 0.0

    def read(self, used: float | None) -> None:
        """The current kernel has used ``used`` seconds so far: the difference since the last reading counts."""
        if used is not None and self._read is not None:
            self._untaken = (self._untaken or 0.0) + max(0.0, used - self._read)
        self._read = used

    def take(self) -> float | None:
        """Seconds used since the last call; None when the kernel's CPU time is not known."""
        used, self._untaken = self._untaken, (None if self._read is None else 0.0)
        return used


class KernelProcess:
    """The thread's current kernel process (none, starting, running, lost or stopped)."""

    def __init__(
        self,
        key: str,
        workspace: Workspace,
        settings: KernelSettings,
        *,
        launcher: Launcher,
        options: KernelOptions,
        notices: Notices,
        snapshots: Snapshots,
        taken_over: KernelHandle | None,
    ) -> None:
        """``taken_over``: a running kernel of the thread, with its variables, that the first
        :meth:`ensure` adopts instead of starting one."""
        self.key = key
        self.workspace = workspace
        self.settings = settings
        self.launcher = launcher
        self.options = options
        self.notices = notices
        self.snapshots = snapshots
        self.handle: KernelHandle | None = None
        #: "new" | "starting" | "idle" | "busy" | "dead" | "stopped"
        self.state = "new"
        #: Executions run in the current kernel process (0: fresh, earlier variables gone).
        self.executions = 0
        #: The current kernel was taken over with the thread's variables in it.
        self.inherited = False
        #: The current kernel is frozen (:mod:`kernels.host.freezing`): it is, whenever no work holds the session.
        self.frozen = False
        self.closed = False
        self.cpu = CpuMeter()
        #: Ask the kernel with each cell whether a save would keep anything (see :class:`~kernels.session.cell.Cell`).
        self.ask_holds_state = settings.snapshot
        self._taken_over = taken_over

    @property
    def held_state(self) -> bool:
        """The current kernel holds the thread's variables (code ran, taken over, or restored)."""
        return bool(self.executions or self.inherited or self.snapshots.restored is not None)

    async def ensure(self) -> bool:
        """Start a kernel when there is none or it died (a taken-over one first), and load the
        thread's snapshot into a started one. True when a new one runs now."""
        if self.closed:
            raise KernelError("this kernel session has been shut down")
        if self.handle is not None and await self.handle.is_alive():
            return False
        if self.handle is not None:
            if self.executions:
                self.notices.lost_state = True
            self.notices.death(exit_text(await self.handle.exit_code()), held_state=self.held_state)
            await self.discard()
        if self._taken_over is not None:
            self.handle, self._taken_over = self._taken_over, None
            self.executions, self.inherited, self.state = 0, True, "idle"
            log.info("took over the running kernel of %s", self.key)
            return True
        await self._launch()
        assert self.handle is not None
        await self.snapshots.restore(functools.partial(self.ask, self.handle, sweep=True))
        if self.handle is None:  # it died loading the snapshot (now discarded): once more, without it
            self.notices.died = "loading its saved variables stopped it, so they were discarded"
            await self._launch()
        return True

    async def _launch(self) -> None:
        self.state = "starting"
        try:
            self.handle = await self.launcher.start(self.launcher.plan(self.workspace.path, self.options))
        except BaseException:
            self.state = "dead"
            raise
        self.executions = 0
        self.inherited = False
        self.frozen = False
        self.ask_holds_state = self.settings.snapshot
        self.cpu.started(await self.handle.cpu_seconds())
        self.state = "idle"
        log.info("kernel started for %s (pid %s)", self.key, self.handle.pid)

    async def replace(self, reason: str) -> None:
        """The kernel ignored the interrupt: replace it (same workspace)."""
        log.warning("kernel of %s still busy after interrupt (%s): restarting", self.key, reason)
        self.notices.death("it did not stop when interrupted, so it was restarted", held_state=self.held_state)
        await self.discard()
        await self.ensure()
        self.notices.lost_state = False

    async def ask(self, handle: KernelHandle, expression: str, timeout: float, *, sweep: bool) -> str | None:
        """``expression`` evaluated silently in ``handle``'s kernel (an :class:`Evaluation`); a
        kernel it found dead or stuck is lost. With ``sweep`` (for the snapshots, which run the
        thread's code: a cell may have replaced the functions they call), what it left running
        is stopped, as after a cell."""
        evaluation = Evaluation(
            handle, self.workspace, self.settings, timeout, key=self.key, thaw=self.thaw, frozen=self.frozen_by_probe
        )
        answer = await evaluation.run(expression)
        if evaluation.lost is not None:
            await self.lose(evaluation.lost)
        if sweep and self.handle is not None and not self.options.background_processes:
            if (stopped := await self.stop_leftovers(self.handle)) is not None:
                log.warning(
                    "the kernel of %s left processes running while its variables were saved or restored: %s",
                    self.key,
                    stopped,
                )
        return answer

    @contextlib.asynccontextmanager
    async def frozen_after(self) -> AsyncIterator[None]:
        """Around one piece of work: the kernel is thawed only where the work asks it to run
        (:meth:`thaw`); when the work ends the kernel (the one running then) is frozen again
        and the CPU time it used is counted."""
        try:
            yield
        finally:
            await self._freeze()

    async def thaw(self) -> bool:
        """Let the kernel run; whether it can. One that cannot be thawed is lost (fail closed:
        its execution ends at once instead of waiting its timeout on a frozen kernel)."""
        handle = self.handle
        if handle is None:
            return False
        if not self.frozen:
            return True
        try:
            await handle.thaw()
        except Exception:
            log.warning("thawing the kernel of %s failed: stopping it", self.key, exc_info=True)
            await self.lose("it could not be resumed, so it was stopped")  # still marked frozen: see discard
            return False
        self.frozen = False
        return True

    async def _freeze(self) -> None:
        handle = self.handle
        if handle is None or self.frozen or self.closed:
            return
        try:
            frozen = await handle.freeze()
        except Exception:
            log.warning("freezing the kernel of %s failed", self.key, exc_info=True)
            frozen = False
        if not frozen:  # fail closed: a kernel that cannot be frozen does not run between turns
            log.warning("the kernel of %s could not be frozen between turns: stopping it", self.key)
            await self.lose("it could not be frozen between turns, so it was stopped")
            return
        self.frozen = True
        await self._count_cpu(handle)

    def frozen_by_probe(self) -> None:
        """The quota probe froze the running kernel (from its thread)."""
        self.frozen = True

    async def _count_cpu(self, handle: KernelHandle) -> None:
        try:
            used = await handle.cpu_seconds()
        except Exception:
            log.warning("reading the CPU time of the kernel of %s failed", self.key, exc_info=True)
            used = None
        self.cpu.read(used)

    async def lose(self, why: str | None = None) -> None:
        """Discard a dead or stuck kernel (the thread hears ``why`` if it held its variables);
        the next execution starts a fresh one and, if the lost one had run code, says its
        variables were lost."""
        if why is not None:
            self.notices.death(why, held_state=self.held_state)
        if self.executions:
            self.notices.lost_state = True
        await self.discard()
        self.state = "dead"

    async def discard(self) -> None:
        """Stop the kernel, if there is one (its CPU time counted first)."""
        handle, self.handle = self.handle, None
        if handle is None:
            return
        await self._count_cpu(handle)  # while its cgroup still holds the count
        if self.frozen:
            self.frozen = False
            with contextlib.suppress(Exception):
                await handle.thaw()  # a process frozen by a cgroup v1 freezer takes no SIGKILL
        try:
            # Shielded: a cancelled caller (e.g. a reaper job stopped mid-way) must not
            # leave a half-stopped kernel behind.
            await asyncio.shield(handle.shutdown())
        except Exception:
            log.exception("cleaning up the kernel of %s failed", self.key)

    async def stop_leftovers(self, handle: KernelHandle) -> str | None:
        """Kill the processes the last piece of work left running (nothing runs between
        turns); the notice saying so, or None when there were none."""
        try:
            count = await handle.stop_leftovers()
        except Exception:
            log.warning("stopping the leftover processes of %s failed", self.key, exc_info=True)
            return None
        return LEFTOVERS_NOTICE.format(count=count) if count else None

    async def shutdown(self) -> None:
        """Kill the kernel (a taken-over one never started too); it cannot be used again."""
        self.closed = True
        self.state = "stopped"
        if self._taken_over is not None and self.handle is None:  # never started: stop it instead
            self.handle, self._taken_over = self._taken_over, None
        await self.discard()
