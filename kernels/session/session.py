"""One thread's kernel: its executions, timeouts, interrupts, death and restart.

An execution (:mod:`kernels.session.execution`) follows nbclient's ``async_execute_cell``:
only iopub messages whose parent ``msg_id`` is ours count, the execution ends on ``status:
idle``, the shell reply is read for the execution count, and a watchdog (every 0.25 s) turns
a dead process into ``Outcome.DIED``. On timeout the kernel is interrupted; if it is still
busy ``interrupt_grace_s`` later (a long C call ignores SIGINT), the session replaces it by a
fresh kernel in the same workspace (:mod:`kernels.session.cell`). The kernel process's life is
:mod:`kernels.session.process`'s; a question asked of it outside any cell is an
:class:`~kernels.session.execution.Evaluation`, watched by the same watchdog. When an execution ends, processes it left running are
killed unless the channel allows background processes (:mod:`kernels.host.leftovers`); the
result's notice says how many. The thread's variables are saved and restored through
:class:`~kernels.session.snapshots.Snapshots`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

from kernels.host.workspace import Workspace
from kernels.seam.options import KernelOptions
from kernels.seam.plan import KernelHandle, Launcher
from kernels.seam.result import ExecutionResult
from kernels.seam.settings import KernelSettings
from kernels.session.cell import Cell
from kernels.session.execution import joined
from kernels.session.notices import Notices, exit_text, fresh_kernel_notice
from kernels.session.process import KernelProcess
from kernels.session.snapshots import RestoreReport, SaveReport, Snapshots

log = logging.getLogger(__name__)


class KernelSession:
    """A thread's kernel process plus its workspace; one piece of work at a time.

    A coordinator: the session holds the lock and decides when; the kernel process
    (:class:`~kernels.session.process.KernelProcess`: start, take over, lose, freeze/thaw, CPU
    meter), each cell (:class:`~kernels.session.cell.Cell`), the thread's notices
    (:class:`~kernels.session.notices.Notices`) and its snapshots do the work.
    """

    def __init__(
        self,
        key: str,
        workspace: Workspace,
        settings: KernelSettings,
        *,
        launcher: Launcher,
        options: KernelOptions = KernelOptions(),
        lost_state: bool = False,
        taken_over: KernelHandle | None = None,
        died: str | None = None,
    ) -> None:
        """``lost_state``: an earlier kernel of this thread ran code and is gone (reaped,
        evicted); the first result of this session then says so. ``taken_over``: a running
        kernel of this thread that another process of the bot started and left (it died),
        with the thread's variables in it: the session starts with it instead of a new one.
        ``died``: why the thread's last kernel stopped unasked, when the thread has not been
        told yet (:meth:`take_thread_notices` tells it)."""
        self.key = key
        self.workspace = workspace
        self.settings = settings
        self.options = options
        self.launcher = launcher
        #: ``time.monotonic()`` of the last start or execution.
        self.last_activity = time.monotonic()
        #: The thread's snapshot: loaded into each new kernel, the kernel's variables saved into it.
        self.snapshots = Snapshots(key, workspace, settings)
        #: What the thread has not been told yet (``notices.died``: why a kernel stopped unasked).
        self.notices = Notices(died=died, lost_state=lost_state)
        self._kernel = KernelProcess(
            key,
            workspace,
            settings,
            launcher=launcher,
            options=options,
            notices=self.notices,
            snapshots=self.snapshots,
            taken_over=taken_over,
        )
        self._lock = asyncio.Lock()
        #: The cell running now (the Stop button reaches it).
        self._cell: Cell | None = None

    @property
    def state(self) -> str:
        """The kernel's: ``new``, ``starting``, ``idle``, ``busy``, ``dead`` (died or lost, and none
        replaced it yet) or ``stopped``."""
        return self._kernel.state

    @property
    def executions(self) -> int:
        """Executions run in the current kernel process (0: fresh, earlier variables gone)."""
        return self._kernel.executions

    @property
    def _handle(self) -> KernelHandle | None:
        """The current kernel's handle (tests and benchmarks look at its process)."""
        return self._kernel.handle

    @property
    def _frozen(self) -> bool:
        """Whether the current kernel is frozen (tests look)."""
        return self._kernel.frozen

    @property
    def fresh(self) -> bool:
        """The current kernel holds nothing of the thread's own: no code ran in it, and it was
        not taken over with the thread's variables (restored ones are reported apart)."""
        return self._kernel.executions == 0 and not self._kernel.inherited

    @property
    def remote_id(self) -> str | None:
        """The current kernel's :attr:`~kernels.seam.plan.KernelHandle.remote_id` (None: local, or none running)."""
        handle = self._kernel.handle
        return handle.remote_id if handle is not None else None

    @property
    def busy(self) -> bool:
        """True while an execution runs or waits, or the kernel is starting."""
        return self._lock.locked() or self.state in ("busy", "starting")

    @property
    def restored(self) -> RestoreReport | None:
        """What the current kernel got back from the thread's snapshot (None: there was none)."""
        return self.snapshots.restored

    @property
    def pid(self) -> int | None:
        """The kernel process id, if one runs."""
        handle = self._kernel.handle
        return None if handle is None else handle.pid

    def take_thread_notices(self) -> list[str]:
        """The sentences the thread has not been told yet (a kernel that stopped unasked, a
        save that failed), each once; the caller posts them."""
        return self.notices.take_thread(self.snapshots.take_notice())

    def take_cpu_seconds(self) -> float | None:
        """CPU seconds the thread's kernels used since the last call (executions, and the
        saves and restores between them); None when the kernel's CPU time is not known."""
        return self._kernel.cpu.take()

    def idle_seconds(self) -> float:
        """Seconds since the last activity."""
        return time.monotonic() - self.last_activity

    async def start(self) -> None:
        """Start the kernel if it is not running."""
        async with self._lock, self._kernel.frozen_after():
            if await self._kernel.ensure():
                self.last_activity = time.monotonic()

    async def save_state(self, *, only_if_quick: bool = False) -> SaveReport | None:
        """Save the kernel's variables into the thread's snapshot (:meth:`Snapshots.save`),
        when code ran since the last save (and snapshots are on). None when nothing was saved.

        ``only_if_quick``: skip it when the last save took longer than
        :data:`~kernels.session.snapshots.QUICK_SAVE_S` (the after-turn save; the save on the
        way down always runs).
        """
        if not self.settings.snapshot:
            return None
        kernel = self._kernel
        async with self._lock, kernel.frozen_after():
            handle = kernel.handle
            if handle is None or kernel.closed or not self.snapshots.due(only_if_quick=only_if_quick):
                return None
            if not await handle.is_alive():
                log.warning("the kernel of %s died before its variables were saved", self.key)
                await kernel.lose(exit_text(await handle.exit_code()))
                return None
            return await self.snapshots.save(
                functools.partial(kernel.ask, handle, sweep=True), kernel_lost=lambda: kernel.handle is None
            )

    async def execute(
        self, code: str, timeout: float | None = None, on_output: Callable[[str, str], None] | None = None
    ) -> ExecutionResult:
        """Run ``code`` and return what it produced. User errors are data, not exceptions.

        ``on_output(name, text)`` hears each stream message (``stdout``/``stderr``) as it
        arrives; it is called from the loop that reads the kernel, so it must only record.

        Raises :class:`KernelError` only when no kernel can be started (or the session is
        shut down). A kernel that died before is replaced first; the result then has
        ``kernel_restarted=True`` and a notice that variables were lost.
        """
        timeout = self.settings.exec_timeout_s if timeout is None else timeout
        kernel = self._kernel
        async with self._lock, kernel.frozen_after():
            await kernel.ensure()
            lost = self.notices.take_lost_state()
            kernel.state = "busy"
            self.last_activity = time.monotonic()
            try:
                self._cell = Cell(kernel, timeout, on_output)
                result = await self._cell.run(code)
            finally:
                self._cell = None
                self.last_activity = time.monotonic()
                if kernel.state == "busy":
                    kernel.state = "idle"
            if lost and not result.kernel_restarted:
                result.kernel_restarted = True
                result.notice = joined(fresh_kernel_notice(self.restored), result.notice)
            return result

    async def evaluate(self, expression: str, timeout: float) -> str | None:
        """The ``text/plain`` of ``expression`` evaluated in the kernel's namespace, run
        silently: no cell, no output, no execution count, no leftover-process sweep. None when
        it raised, took longer than ``timeout`` (it is interrupted then), or the kernel died or
        could not be started.

        A question about the thread's own kernel that must not show up as one of its cells (the
        snapshots ask theirs the same way; tests read a kernel's state with it). The same
        watchdog as a cell's watches it (:class:`~kernels.session.execution.Evaluation`): a
        kernel that dies, writes past its workspace quota, or ignores the interrupt for
        ``interrupt_grace_s``, is discarded as :meth:`execute` does: the next execution starts a
        fresh one and says that variables were lost.
        """
        async with self._lock, self._kernel.frozen_after():
            try:
                await self._kernel.ensure()
            except Exception:
                log.warning("no kernel to evaluate in for %s", self.key, exc_info=True)
                return None
            handle = self._kernel.handle
            assert handle is not None
            try:
                return await self._kernel.ask(handle, expression, timeout, sweep=False)
            finally:
                self.last_activity = time.monotonic()

    async def check_alive(self) -> bool:
        """Whether the kernel runs. One found dead while idle is discarded and its thread
        will hear why (:meth:`take_thread_notices`); a busy session is not looked at (its
        execution watches the kernel itself)."""
        if self.busy:
            return True
        async with self._lock:
            handle = self._kernel.handle
            if handle is None:
                return False
            if await handle.is_alive():
                return True
            await self._kernel.lose(exit_text(await handle.exit_code()))
            return False

    async def interrupt(self) -> None:
        """Stop the running execution (Stop button); it returns ``Outcome.INTERRUPTED``.

        If the kernel is still busy ``interrupt_grace_s`` later, it is restarted.
        """
        cell = self._cell
        if self._kernel.handle is None or cell is None or self.state != "busy":
            return
        await cell.stop()

    async def restart(self) -> None:
        """Replace the kernel with a fresh process in the same workspace, and forget the
        thread's saved variables (``reset``: a fresh start means fresh)."""
        async with self._lock, self._kernel.frozen_after():
            await self._kernel.discard()
            self.notices.lost_state = False
            self.notices.died = None
            await self.snapshots.forget()
            if await self._kernel.ensure():
                self.last_activity = time.monotonic()

    async def shutdown(self) -> None:
        """Kill the kernel and everything it started. The session cannot be used again."""
        await self._kernel.shutdown()
        log.info("kernel of %s shut down", self.key)

    async def is_alive(self) -> bool:
        """Whether the kernel process is running."""
        handle = self._kernel.handle
        return handle is not None and await handle.is_alive()

    async def memory_bytes(self) -> int | None:
        """PSS of the kernel's process tree, or None when there is no kernel."""
        handle = self._kernel.handle
        return None if handle is None else await handle.memory_bytes()
