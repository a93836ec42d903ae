"""One thread's kernel: its executions, timeouts, interrupts, death and restart.

An execution (:mod:`kernels.session.execution`) follows nbclient's ``async_execute_cell``:
only iopub messages whose parent ``msg_id`` is ours count, the execution ends on ``status:
idle``, the shell reply is read for the execution count, and a watchdog (every 0.25 s) turns
a dead process into ``Outcome.DIED``. On timeout the kernel is interrupted; if it is still
busy ``interrupt_grace_s`` later (a long C call ignores SIGINT), the session replaces it by a
fresh kernel in the same workspace. When an execution ends, processes it left running are
killed unless the channel allows background processes (:mod:`kernels.host.leftovers`); the
result's notice says how many. The thread's variables are saved and restored through
:class:`~kernels.session.snapshots.Snapshots`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable

from kernels.host.workspace import FileStamps, Workspace, changed_files
from kernels.seam.options import KernelOptions
from kernels.seam.plan import KernelHandle, Launcher
from kernels.seam.result import ExecutionResult, KernelError, Outcome
from kernels.seam.settings import KernelSettings
from kernels.session.execution import TRIP_LOOK_S, Execution, QuotaWatch, interrupt_quietly, joined
from kernels.session.snapshots import HOLDS_STATE_EXPRESSION, RestoreReport, SaveReport, Snapshots

log = logging.getLogger(__name__)

LOST_STATE_NOTICE = "The kernel was restarted: variables from before were lost; files in the workspace remain."
THAW_FAILED_NOTICE = (
    "The kernel could not be resumed for this execution, so it was stopped. Variables were lost; files in "
    "the workspace remain. The next execution starts a fresh kernel."
)
LEFTOVERS_NOTICE = "{count} background process(es) left by this code were stopped."
#: The name of the cell's user expression that says whether a save would write anything.
_HOLDS_STATE = "threadbook_holds_state"
#: What the thread is told, once, when its kernel stopped without being asked to (``{why}``).
KERNEL_LOST_THREAD_NOTICE = (
    "⚠️ This thread's kernel stopped ({why}): variables since the last save are lost; files in the "
    "workspace are kept, and a fresh kernel takes over."
)


class KernelSession:
    """A thread's kernel process plus its workspace; one execution at a time."""

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
        #: Executions run in the current kernel process (0: fresh, earlier variables gone).
        self.executions = 0
        #: ``time.monotonic()`` of the last start or execution.
        self.last_activity = time.monotonic()
        #: "new" | "starting" | "idle" | "busy" | "dead" | "stopped"
        self.state = "new"
        #: The thread's snapshot: loaded into each new kernel, the kernel's variables saved into it.
        self.snapshots = Snapshots(key, workspace, settings)
        self._handle: KernelHandle | None = None
        self._lock = asyncio.Lock()
        self._lost_state = lost_state
        #: The execution running now (the Stop button reaches it).
        self._execution: Execution | None = None
        self._closed = False
        self._taken_over = taken_over
        #: The current kernel was taken over with the thread's variables in it.
        self._inherited = False
        #: Why a kernel of the thread stopped unasked, until the thread is told.
        self._died = died
        #: The current kernel is frozen (:mod:`kernels.host.freezing`): it is, whenever no work holds the session.
        self._frozen = False
        #: CPU seconds of the current kernel at its last freeze (or start), and those used since
        #: the last :meth:`take_cpu_seconds` (None: this kernel's CPU time is not known).
        self._cpu_read: float | None = None
        self._cpu_untaken: float | None = None
        #: Ask the kernel with each cell whether a save would keep anything (see :meth:`_run`).
        self._ask_holds_state = settings.snapshot

    @property
    def fresh(self) -> bool:
        """The current kernel holds nothing of the thread's own: no code ran in it, and it was
        not taken over with the thread's variables (restored ones are reported apart)."""
        return self.executions == 0 and not self._inherited

    @property
    def remote_id(self) -> str | None:
        """The current kernel's :attr:`~kernels.seam.plan.KernelHandle.remote_id` (None: local, or none running)."""
        return self._handle.remote_id if self._handle is not None else None

    @property
    def busy(self) -> bool:
        """True while an execution runs or waits, or the kernel is starting."""
        return self._lock.locked() or self.state in ("busy", "starting")

    @property
    def restored(self) -> RestoreReport | None:
        """What the current kernel got back from the thread's snapshot (None: there was none)."""
        return self.snapshots.restored

    @property
    def dead(self) -> bool:
        """The kernel died (or was lost) and none replaced it yet."""
        return self.state == "dead"

    @property
    def untold_death(self) -> str | None:
        """Why a kernel of this thread stopped unasked, while the thread has not been told."""
        return self._died

    def take_thread_notices(self) -> list[str]:
        """The sentences the thread has not been told yet (a kernel that stopped unasked, a
        save that failed), each once; the caller posts them."""
        notices: list[str] = []
        if self._died is not None:
            notices.append(KERNEL_LOST_THREAD_NOTICE.format(why=self._died))
            self._died = None
        if (failed_save := self.snapshots.take_notice()) is not None:
            notices.append(failed_save)
        return notices

    @contextlib.asynccontextmanager
    async def _working(self) -> AsyncIterator[None]:
        """Hold the session for one piece of work (an execution, an evaluation, a snapshot save
        or restore, a start). The kernel is thawed only where the work asks it to run
        (:meth:`_run`, :meth:`_evaluate`); when the work ends the kernel (the one running
        then) is frozen again and the CPU time it used is counted."""
        async with self._lock:
            try:
                yield
            finally:
                await self._freeze()

    async def _thaw(self) -> bool:
        """Let the kernel run; whether it can. One that cannot be thawed is lost (fail closed:
        its execution ends at once instead of waiting its timeout on a frozen kernel)."""
        handle = self._handle
        if handle is None:
            return False
        if not self._frozen:
            return True
        try:
            await handle.thaw()
        except Exception:
            log.warning("thawing the kernel of %s failed: stopping it", self.key, exc_info=True)
            self._note_death("it could not be resumed, so it was stopped")
            await self._lose_kernel()  # still marked frozen: the discard tries the thaw once more before the kill
            return False
        self._frozen = False
        return True

    async def _freeze(self) -> None:
        handle = self._handle
        if handle is None or self._frozen or self._closed:
            return
        try:
            frozen = await handle.freeze()
        except Exception:
            log.warning("freezing the kernel of %s failed", self.key, exc_info=True)
            frozen = False
        if not frozen:  # fail closed: a kernel that cannot be frozen does not run between turns
            log.warning("the kernel of %s could not be frozen between turns: stopping it", self.key)
            self._note_death("it could not be frozen between turns, so it was stopped")
            await self._lose_kernel()
            return
        self._frozen = True
        await self._count_cpu(handle)

    async def _count_cpu(self, handle: KernelHandle) -> None:
        """Add the CPU time ``handle``'s kernel used since the last reading to the thread's
        (:meth:`take_cpu_seconds`): after each piece of work, and before a kernel is
        discarded, so a kernel killed, stuck or over its quota is billed too."""
        try:
            used = await handle.cpu_seconds()
        except Exception:
            log.warning("reading the CPU time of the kernel of %s failed", self.key, exc_info=True)
            used = None
        if used is not None and self._cpu_read is not None:
            self._cpu_untaken = (self._cpu_untaken or 0.0) + max(0.0, used - self._cpu_read)
        self._cpu_read = used

    def take_cpu_seconds(self) -> float | None:
        """CPU seconds the thread's kernels used since the last call (executions, and the
        saves and restores between them); None when the kernel's CPU time is not known."""
        used, self._cpu_untaken = self._cpu_untaken, (None if self._cpu_read is None else 0.0)
        return used

    def _note_death(self, why: str) -> None:
        """A kernel that held the thread's variables stopped unasked: the thread hears why."""
        if self.executions or self._inherited or self.restored is not None:
            self._died = why

    async def _note_exit(self, handle: KernelHandle) -> None:
        """:meth:`_note_death` with how ``handle``'s process ended."""
        self._note_death(_exit_text(await handle.exit_code()))

    def idle_seconds(self) -> float:
        """Seconds since the last activity."""
        return time.monotonic() - self.last_activity

    async def start(self) -> None:
        """Start the kernel if it is not running."""
        async with self._working():
            await self._ensure_kernel()

    async def _ensure_kernel(self) -> bool:
        """Start a kernel when there is none or it died, and load the thread's snapshot into
        it. True when a new one was started."""
        if self._closed:
            raise KernelError("this kernel session has been shut down")
        if self._handle is not None and await self._handle.is_alive():
            return False
        if self._handle is not None:
            if self.executions:
                self._lost_state = True
            await self._note_exit(self._handle)
            await self._discard_handle()
        if self._taken_over is not None:
            self._handle, self._taken_over = self._taken_over, None
            self.executions, self._inherited, self.state = 0, True, "idle"
            self.last_activity = time.monotonic()
            log.info("took over the running kernel of %s", self.key)
            return True
        await self._start_kernel()
        assert self._handle is not None
        await self.snapshots.restore(functools.partial(self._ask, self._handle))
        if self._handle is None:  # it died loading the snapshot (now discarded): once more, without it
            self._died = "loading its saved variables stopped it, so they were discarded"
            await self._start_kernel()
        return True

    async def _start_kernel(self) -> None:
        self.state = "starting"
        try:
            self._handle = await self.launcher.start(self.launcher.plan(self.workspace.path, self.options))
        except BaseException:
            self.state = "dead"
            raise
        self.executions = 0
        self._inherited = False
        self._frozen = False
        self._ask_holds_state = self.settings.snapshot
        self._cpu_read = await self._handle.cpu_seconds()  # its start is not the thread's to pay
        if self._cpu_read is not None and self._cpu_untaken is None:
            self._cpu_untaken = 0.0
        self.state = "idle"
        self.last_activity = time.monotonic()
        log.info("kernel started for %s (pid %s)", self.key, self._handle.pid)

    async def save_state(self, *, only_if_quick: bool = False) -> SaveReport | None:
        """Save the kernel's variables into the thread's snapshot (:meth:`Snapshots.save`),
        when code ran since the last save (and snapshots are on). None when nothing was saved.

        ``only_if_quick``: skip it when the last save took longer than
        :data:`~kernels.session.snapshots.QUICK_SAVE_S` (the after-turn save; the save on the
        way down always runs).
        """
        if not self.settings.snapshot:
            return None
        async with self._working():
            handle = self._handle
            if handle is None or self._closed or not self.snapshots.due(only_if_quick=only_if_quick):
                return None
            if not await handle.is_alive():
                log.warning("the kernel of %s died before its variables were saved", self.key)
                await self._note_exit(handle)
                await self._lose_kernel()
                return None
            return await self.snapshots.save(
                functools.partial(self._ask, handle), kernel_lost=lambda: self._handle is None
            )

    async def _ask(self, handle: KernelHandle, expression: str, timeout: float) -> str | None:
        """For :attr:`snapshots` (an :data:`~kernels.session.snapshots.Ask`): ``expression``
        evaluated silently in ``handle``'s kernel, then what it left running is stopped."""
        answer = await self._evaluate(handle, expression, timeout)
        await self._sweep_after_bot_request()
        return answer

    async def _discard_handle(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            await self._count_cpu(handle)  # while its cgroup still holds the count
        if handle is not None and self._frozen:
            self._frozen = False
            with contextlib.suppress(Exception):
                await handle.thaw()  # a process frozen by a cgroup v1 freezer takes no SIGKILL
        if handle is not None:
            try:
                # Shielded: a cancelled caller (e.g. a reaper job stopped mid-way) must not
                # leave a half-stopped kernel behind.
                await asyncio.shield(handle.shutdown())
            except Exception:
                log.exception("cleaning up the kernel of %s failed", self.key)

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
        async with self._working():
            await self._ensure_kernel()
            lost, self._lost_state = self._lost_state, False
            self.state = "busy"
            self.last_activity = time.monotonic()
            try:
                result = await self._run(code, timeout, on_output)
            finally:
                self.last_activity = time.monotonic()
                if self.state == "busy":
                    self.state = "idle"
            if lost and not result.kernel_restarted:
                result.kernel_restarted = True
                result.notice = joined(self._fresh_kernel_notice(), result.notice)
            return result

    async def evaluate(self, expression: str, timeout: float) -> str | None:
        """The ``text/plain`` of ``expression`` evaluated in the kernel's namespace, run
        silently: no cell, no output, no execution count, no leftover-process sweep. None when
        it raised, took longer than ``timeout`` (it is interrupted then), or the kernel died or
        could not be started.

        A question about the thread's own kernel that must not show up as one of its cells (the
        snapshots ask theirs through the same loop; tests read a kernel's state with it). Its
        workspace quota is watched as a cell's is. A kernel that dies, or ignores the interrupt for
        ``interrupt_grace_s``, is discarded as :meth:`execute` does: the next execution
        starts a fresh one and says that variables were lost.
        """
        async with self._working():
            try:
                await self._ensure_kernel()
            except Exception:
                log.warning("no kernel to evaluate in for %s", self.key, exc_info=True)
                return None
            handle = self._handle
            assert handle is not None
            try:
                return await self._evaluate(handle, expression, timeout)
            finally:
                self.last_activity = time.monotonic()

    async def _evaluate(self, handle: KernelHandle, expression: str, timeout: float) -> str | None:
        """:meth:`evaluate` in ``handle``'s kernel, its workspace quota watched as a cell's is
        (code in the kernel may have replaced what ``expression`` calls)."""
        quota = await QuotaWatch.scan_and_start(self.workspace, handle, thaw=self._thaw, frozen=self._frozen_by_probe)
        try:
            if not await self._thaw():  # lost: it could not be thawed
                return None
            return await self._evaluate_watched(handle, expression, timeout, quota)
        finally:
            await quota.stop()

    async def _evaluate_watched(
        self, handle: KernelHandle, expression: str, timeout: float, quota: QuotaWatch
    ) -> str | None:
        msg_id = handle.client.execute(
            "", silent=True, store_history=False, user_expressions={"value": expression}, allow_stdin=False
        )
        deadline = time.monotonic() + timeout
        interrupted_at: float | None = None
        while True:
            over = await quota.after_trip() if quota.tripped else None
            if quota.lost:  # it could not be thawed after the walk: already lost
                return None
            if over is not None:
                log.warning("the kernel of %s wrote past its workspace quota during an evaluation", self.key)
                self._note_death(
                    "it wrote past the workspace quota while the bot asked it something, so it was stopped"
                )
                await self._lose_kernel()
                return None
            now = time.monotonic()
            if interrupted_at is None and now >= deadline:
                interrupted_at = now
                await interrupt_quietly(handle, self.key)
            if interrupted_at is not None and now >= interrupted_at + self.settings.interrupt_grace_s:
                log.warning("kernel of %s ignored the interrupt of an evaluation: discarding it", self.key)
                self._note_death("it did not answer, so it was replaced")
                await self._lose_kernel()
                return None
            until = deadline if interrupted_at is None else interrupted_at + self.settings.interrupt_grace_s
            reply = await handle.reply(msg_id, max(min(until - now, TRIP_LOOK_S), 0.001))
            if reply is not None:
                break
            if not await handle.is_alive():
                log.warning("kernel of %s died during an evaluation", self.key)
                await self._note_exit(handle)
                await self._lose_kernel()
                return None
        if await quota.check() is not None:  # grown past the quota without tripping the probe
            self._note_death("it wrote past the workspace quota while the bot asked it something, so it was stopped")
            await self._lose_kernel()
            return None
        if interrupted_at is not None:
            return None
        content = reply["content"]
        value = (content.get("user_expressions") or {}).get("value") or {}
        if content.get("status") != "ok" or value.get("status") != "ok":
            log.info(
                "evaluation in the kernel of %s failed: %s", self.key, value.get("evalue") or content.get("evalue")
            )
            return None
        text = (value.get("data") or {}).get("text/plain")
        return text if isinstance(text, str) else None

    async def check_alive(self) -> bool:
        """Whether the kernel runs. One found dead while idle is discarded and its thread
        will hear why (:meth:`take_thread_notices`); a busy session is not looked at (its
        execution watches the kernel itself)."""
        if self.busy:
            return True
        async with self._lock:
            handle = self._handle
            if handle is None:
                return False
            if await handle.is_alive():
                return True
            await self._note_exit(handle)
            await self._lose_kernel()
            return False

    async def _lose_kernel(self) -> None:
        """Discard a dead or stuck kernel; the next execution starts a fresh one and, if the
        lost one had run code, says its variables were lost."""
        if self.executions:
            self._lost_state = True
        await self._discard_handle()
        self.state = "dead"

    async def _run(
        self, code: str, timeout: float, on_output: Callable[[str, str], None] | None = None
    ) -> ExecutionResult:
        handle = self._handle
        assert handle is not None
        execution = Execution(
            handle,
            self.workspace,
            self.settings,
            timeout,
            key=self.key,
            on_output=on_output,
            thaw=self._thaw,
            frozen=self._frozen_by_probe,
            # Asked until the kernel says it holds something: then it almost always goes on
            # holding something, and the question costs each cell ~0.5 ms.
            expressions={_HOLDS_STATE: HOLDS_STATE_EXPRESSION} if self._ask_holds_state else None,
        )
        self._execution = execution
        try:
            await execution.start(code)
            self.executions += 1
            self.snapshots.unsaved = True
            result = await execution.finish()
            holds_state = execution.expression_answers.get(_HOLDS_STATE)
            self.snapshots.ran(holds_state)
            self._ask_holds_state = self._ask_holds_state and holds_state != "True"
            if result.outcome is Outcome.DIED and self._handle is not handle:  # lost: it could not be thawed
                result.notice = joined(THAW_FAILED_NOTICE, result.notice)
                self.state = "dead"
                self._lost_state = True
            elif result.outcome is Outcome.DIED:
                quota_notice = execution.watchdog.quota_notice
                result.notice = joined(quota_notice or await self._death_notice(handle), result.notice)
                self._note_death(
                    "it wrote past the workspace quota" if quota_notice else _exit_text(await handle.exit_code())
                )
                await self._discard_handle()
                self.state = "dead"
                self._lost_state = True  # the next result (in a fresh kernel) says so too
            elif execution.stuck_notice is not None:
                await self._restart_after_stuck(execution.watchdog.reason)
                result.kernel_restarted = True
                result.notice = joined(f"{execution.stuck_notice} {self._fresh_kernel_notice()}", result.notice)
            elif not self.options.background_processes:
                result.notice = joined(result.notice, await self._stop_leftovers(handle))
            after = await asyncio.to_thread(self._stamps_and_touch)
            result.changed_files = changed_files(execution.before, after)
            result.duration_s = time.monotonic() - execution.started
            return result
        finally:
            self._execution = None

    def _frozen_by_probe(self) -> None:
        """The quota probe froze the running kernel (from its thread)."""
        self._frozen = True

    async def _sweep_after_bot_request(self) -> None:
        """After a snapshot save or restore (which run the thread's code: a cell may have
        replaced the functions they call): kill what it left running, as after a cell."""
        handle = self._handle
        if handle is not None and not self.options.background_processes:
            if (stopped := await self._stop_leftovers(handle)) is not None:
                log.warning(
                    "the kernel of %s left processes running while its variables were saved or restored: %s",
                    self.key,
                    stopped,
                )

    async def _stop_leftovers(self, handle: KernelHandle) -> str | None:
        """Kill the processes this execution left running (nothing runs between turns); the
        notice saying so, or None when there were none."""
        try:
            count = await handle.stop_leftovers()
        except Exception:
            log.warning("stopping the leftover processes of %s failed", self.key, exc_info=True)
            return None
        return LEFTOVERS_NOTICE.format(count=count) if count else None

    def _fresh_kernel_notice(self) -> str:
        """What a result says when it ran in a kernel that replaced one with variables."""
        if self.restored is None:
            return LOST_STATE_NOTICE
        return f"The kernel was restarted. {self.restored.notice()}"

    def _stamps_and_touch(self) -> FileStamps:
        self.workspace.touch()
        return self.workspace.stamps()

    async def _restart_after_stuck(self, reason: str) -> None:
        """The kernel ignored the interrupt: replace it (same workspace)."""
        log.warning("kernel of %s still busy after interrupt (%s): restarting", self.key, reason)
        self._note_death("it did not stop when interrupted, so it was restarted")
        await self._discard_handle()
        await self._ensure_kernel()
        self._lost_state = False

    async def _death_notice(self, handle: KernelHandle) -> str:
        how = _exit_text(await handle.exit_code())
        if await handle.out_of_memory():
            how = f"{how}, stopped by its memory limit ({self.settings.memory_mb} MiB for all its processes together)"
        tail = [line for line in (await handle.log_tail()).splitlines() if "Fatal Python error" in line]
        detail = f" ({tail[-1].strip()})" if tail else ""
        return (
            f"The kernel died during this execution: {how}{detail}. Variables were lost; files in "
            "the workspace remain. The next execution starts a fresh kernel."
        )

    async def interrupt(self) -> None:
        """Stop the running execution (Stop button); it returns ``Outcome.INTERRUPTED``.

        If the kernel is still busy ``interrupt_grace_s`` later, it is restarted.
        """
        execution = self._execution
        if self._handle is None or execution is None or self.state != "busy":
            return
        await execution.stop()

    async def restart(self) -> None:
        """Replace the kernel with a fresh process in the same workspace, and forget the
        thread's saved variables (``reset``: a fresh start means fresh)."""
        async with self._working():
            await self._discard_handle()
            self._lost_state = False
            self._died = None
            await self.snapshots.forget()
            await self._ensure_kernel()

    async def shutdown(self) -> None:
        """Kill the kernel and everything it started. The session cannot be used again."""
        self._closed = True
        self.state = "stopped"
        if self._taken_over is not None and self._handle is None:  # never started: stop it instead
            self._handle, self._taken_over = self._taken_over, None
        await self._discard_handle()
        log.info("kernel of %s shut down", self.key)

    async def is_alive(self) -> bool:
        """Whether the kernel process is running."""
        return self._handle is not None and await self._handle.is_alive()

    async def memory_bytes(self) -> int | None:
        """PSS of the kernel's process tree, or None when there is no kernel."""
        handle = self._handle
        return None if handle is None else await handle.memory_bytes()

    @property
    def pid(self) -> int | None:
        """The kernel process id, if one runs."""
        return None if self._handle is None else self._handle.pid


def _exit_text(code: int | None) -> str:
    if code is None:
        return "the process ended"
    if 128 < code < 128 + signal.NSIG:  # a wrapper (bubblewrap, a shell) passes a signal on as 128 + its number
        code = 128 - code
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (possibly out of memory)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit code {code}"
