"""One execution of a cell in a thread's kernel, run the way nbclient's ``async_execute_cell`` runs one.

Three pieces share the work, as in nbclient:

* :class:`IopubReader` takes the iopub messages whose parent ``msg_id`` is ours into the
  execution's :class:`~kernels.session.output.OutputCollector`; the execution ends when the
  kernel reports ``status: idle`` for it.
* :class:`ShellReply` reads our ``execute_reply`` for the execution count. A reply that is in
  while iopub stays silent for :data:`IOPUB_GRACE_S` means iopub lost messages (its socket
  dropped one over ``MAX_MESSAGE_BYTES`` and reconnected): the execution ends with what it has.
* :class:`Watchdog` turns a timeout or the Stop button into an interrupt, and an interrupt the
  kernel still ignores ``interrupt_grace_s`` later into a stuck kernel (the session replaces
  it); every :data:`WATCHDOG_INTERVAL_S` it checks that the kernel lives and its workspace is
  within quota, and it walks the workspace soon after the quota probe trips (:class:`QuotaWatch`).

nbclient runs them as concurrent tasks; here :meth:`Execution.finish` lets them take turns in
one loop: the watchdog looks before every iopub read, no read waits past its next look, and
the shell is looked at whenever iopub is quiet. No read is cancelled half-way, and their
decisions come in a fixed order.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from enum import Enum, auto
from queue import Empty
from typing import Any

from kernels.host import safefs
from kernels.host.safefs import MAX_WALK_ENTRIES
from kernels.host.workspace import FileStamps, Workspace
from kernels.seam.plan import KernelHandle
from kernels.seam.result import ExecutionResult, Outcome
from kernels.seam.settings import KernelSettings
from kernels.seam.units import human_size
from kernels.seam.wire import MAX_MESSAGE_BYTES
from kernels.session.notices import exit_text
from kernels.session.output import OutputCollector
from kernels.session.quota_probe import QuotaProbe

log = logging.getLogger(__name__)

#: How often a running execution checks that the kernel lives and its workspace is within quota.
WATCHDOG_INTERVAL_S = 0.25
#: How soon a running execution notices that the quota probe tripped (and froze the kernel).
TRIP_LOOK_S = 0.05
SHELL_REPLY_TIMEOUT_S = 2.0
#: A user expression's answer longer than this is left out.
_MAX_EXPRESSION_CHARS = 1000
INTERRUPTED_REPLY_TIMEOUT_S = 0.25
#: After the shell reply, how long iopub may stay silent before the execution counts as done
#: (iopub lost messages: the socket dropped one over ``MAX_MESSAGE_BYTES`` and reconnected).
IOPUB_GRACE_S = 1.0
QUOTA_NOTICE = (
    "This code wrote past the thread's workspace quota ({used}; the limit is {quota}): the kernel was stopped. "
    "Variables were lost; files in the workspace remain. Delete or shrink files to free space before writing more."
)
LOST_OUTPUT_NOTICE = (
    f"Some output of this execution was lost: a single output over {MAX_MESSAGE_BYTES // 2**20} MB is refused."
)


def joined(*notices: str | None) -> str | None:
    """The notices given, in order and separated by spaces; None when there is none."""
    return " ".join(notice for notice in notices if notice) or None


async def interrupt_quietly(handle: KernelHandle, key: str) -> None:
    """Interrupt ``handle``'s kernel; a failure is only logged (a kernel still busy after the
    grace is replaced anyway)."""
    try:
        await handle.interrupt()
    except Exception:
        log.warning("interrupting the kernel of %s failed", key, exc_info=True)


class QuotaWatch:
    """The workspace quota while a cell runs: a walk every watchdog tick, and one soon after the
    quota probe (:mod:`kernels.session.quota_probe`) froze the kernel because the file system
    grew past the room the quota left.

    This is the fallback the quota has where no size-limited file system holds the workspace.
    Code that only shrinks an over-full workspace may run.
    """

    def __init__(
        self,
        workspace: Workspace,
        before: safefs.Scan,
        probe: QuotaProbe,
        *,
        thaw: Callable[[], Awaitable[bool]],
        frozen: Callable[[], None],
    ) -> None:
        """``before``: the walk before the cell. ``frozen`` tells the session that the probe
        froze the kernel; ``thaw`` has the session thaw it (False: it could not, and the
        session lost the kernel)."""
        self._workspace = workspace
        self._before = before
        self._probe = probe
        self._thaw = thaw
        self._frozen = frozen
        #: The kernel could not be thawed after a walk: the session lost it.
        self.lost = False
        #: When the probe was last armed (it is re-armed once per WATCHDOG_INTERVAL_S at most).
        self._armed_at = time.monotonic()

    @classmethod
    async def start(
        cls,
        workspace: Workspace,
        before: safefs.Scan,
        handle: KernelHandle,
        *,
        thaw: Callable[[], Awaitable[bool]],
        frozen: Callable[[], None],
    ) -> QuotaWatch:
        """Start the probe with the room ``before`` leaves under the quota."""
        room = _room(workspace, before, before)
        # On a trip the probe's thread freezes the kernel itself: the writer stops before the walk.
        probe = await asyncio.to_thread(QuotaProbe, workspace.path, room, handle.freeze_blocking)
        return cls(workspace, before, probe, thaw=thaw, frozen=frozen)

    @classmethod
    async def scan_and_start(
        cls,
        workspace: Workspace,
        handle: KernelHandle,
        *,
        thaw: Callable[[], Awaitable[bool]],
        frozen: Callable[[], None],
    ) -> QuotaWatch:
        """Walk the workspace and start the probe with the room that walk leaves (:attr:`before`),
        in one trip to a thread."""

        def scan_and_probe() -> tuple[safefs.Scan, QuotaProbe]:
            before = workspace.scan()
            return before, QuotaProbe(workspace.path, _room(workspace, before, before), handle.freeze_blocking)

        before, probe = await asyncio.to_thread(scan_and_probe)
        return cls(workspace, before, probe, thaw=thaw, frozen=frozen)

    @property
    def before(self) -> safefs.Scan:
        """The walk the watch started from (before the cell)."""
        return self._before

    @property
    def tripped(self) -> bool:
        """The probe saw the file system grow past the room (and froze the kernel)."""
        return self._probe.tripped.is_set()

    async def check(self) -> str | None:
        """Walk the workspace: the notice when it outgrew its quota (bytes, or entries) during
        this execution, else None."""
        return self._notice(await asyncio.to_thread(self._workspace.scan))

    async def after_trip(self) -> str | None:
        """Walk the workspace the probe froze the kernel for. Over its quota: the notice (the
        kernel stays frozen until it is killed). Within it: thaw the kernel and re-arm the
        probe; None.

        The probe is re-armed once per :data:`WATCHDOG_INTERVAL_S` at most: a trip sooner
        than that after the last arming leaves the kernel frozen (and :attr:`tripped` set)
        until then, so a workspace whose file system grows faster than the walk counts (small
        files, other writers) costs a walk per tick, not one per write."""
        self._frozen()
        if time.monotonic() < self._armed_at + WATCHDOG_INTERVAL_S:
            return None
        now = await asyncio.to_thread(self._workspace.scan)
        over = self._notice(now)
        if over is None:
            await asyncio.to_thread(self._probe.rearm, _room(self._workspace, self._before, now))
            self._armed_at = time.monotonic()
            self.lost = not await self._thaw()
        return over

    async def stop(self) -> None:
        """Stop the probe; when a trip's freeze is under way, wait for it (off the event loop)."""
        if not self._probe.stop_unless_tripping():
            await asyncio.to_thread(self._probe.stop)

    def _notice(self, now: safefs.Scan) -> str | None:
        quota = self._workspace.quota_bytes
        if now.entries > MAX_WALK_ENTRIES >= self._before.entries:
            return QUOTA_NOTICE.format(
                used=f"more than {MAX_WALK_ENTRIES:,} files", quota=f"{MAX_WALK_ENTRIES:,} files"
            )
        if now.bytes > quota and now.bytes > self._before.bytes:
            return QUOTA_NOTICE.format(used=human_size(now.bytes), quota=human_size(quota))
        return None


def _room(workspace: Workspace, before: safefs.Scan, now: safefs.Scan) -> int:
    """The bytes the workspace may still grow by (as :meth:`QuotaWatch._notice` counts: a
    workspace over its quota before the cell may grow back up to the size it had then)."""
    return max(workspace.quota_bytes, before.bytes) - now.bytes


class End(Enum):
    """Why an execution's loop ended."""

    IDLE = auto()  # the kernel reported idle for our request
    LOST_OUTPUT = auto()  # the reply came in and idle never did: iopub lost messages
    DIED = auto()  # the kernel died, or its workspace went over quota (Watchdog.quota_notice)
    STUCK = auto()  # the kernel still ignored the interrupt interrupt_grace_s later


class Watchdog:
    """Watches one execution (nbclient's timeout handling and its kernel-alive poll): a timeout
    or the Stop button interrupts the cell, an interrupt it still ignores ``grace`` seconds
    later makes the kernel stuck, and every :data:`WATCHDOG_INTERVAL_S` it checks that the
    kernel lives and its workspace is within quota.

    ipykernel takes SIGINT only once it runs the cell (before that it ignores it, or it breaks
    the request's own handling): an interrupt waits until the kernel announces the cell. One
    that lands in the callbacks IPython runs before the cell's code is kept for the cell by
    the kernel (``threadbook_kernel.interrupts``).
    """

    def __init__(self, handle: KernelHandle, *, grace: float, key: str, cell_running: bool = False) -> None:
        """Stop requests count from now; the clock starts with :meth:`arm`. ``cell_running``:
        interrupt without waiting for the kernel to announce the cell (a silent request, which
        announces none)."""
        self._handle = handle
        self._grace = grace
        self._key = key
        self._stop_requested_at: float | None = None
        #: The kernel has announced the cell (``execute_input``): SIGINT reaches it.
        self._cell_running = cell_running
        self._deadline = math.inf
        self._next_check = math.inf
        self._quota: QuotaWatch | None = None
        #: When the cell was interrupted, or the Stop button pressed (None: neither).
        self.interrupted_at: float | None = None
        #: Why: "stop" (the Stop button) or "timeout".
        self.reason = ""
        #: What the result says when the workspace went over its quota.
        self.quota_notice: str | None = None
        #: The kernel could not be thawed for the cell: the session lost it.
        self.lost = False

    def arm(self, started: float, timeout: float, quota: QuotaWatch) -> None:
        """The cell was sent at ``started``: it may run ``timeout`` seconds."""
        self._deadline = started + timeout
        self._next_check = started + WATCHDOG_INTERVAL_S
        self._quota = quota

    async def disarm(self) -> None:
        """The execution ended: stop the quota probe (once it has stopped, it freezes nothing)."""
        if self._quota is not None:
            await self._quota.stop()

    async def stop(self) -> None:
        """The Stop button: interrupt the cell now if the kernel runs it, else once it does."""
        if self._stop_requested_at is not None:
            return
        self._stop_requested_at = time.monotonic()
        if self._cell_running:
            await interrupt_quietly(self._handle, self._key)

    async def cell_started(self) -> None:
        """The kernel announced the cell: an interrupt held back until now is sent."""
        if self._cell_running:
            return
        self._cell_running = True
        if self.interrupted_at is not None or self._stop_requested_at is not None:
            await interrupt_quietly(self._handle, self._key)

    async def look(self, now: float) -> End | None:
        """One look before an iopub read: what ends the execution now, if anything does."""
        quota = self._quota
        assert quota is not None, "armed when the cell was sent"
        if self.lost:
            return End.DIED
        if self.interrupted_at is None and self._stop_requested_at is not None:
            self.interrupted_at, self.reason = self._stop_requested_at, "stop"
        if self.interrupted_at is None and now >= self._deadline:
            self.interrupted_at, self.reason = now, "timeout"
            if self._cell_running:
                await interrupt_quietly(self._handle, self._key)
        # A kernel the quota probe froze takes no SIGINT: it is walked (and thawed when within
        # its quota) before an interrupt it could not take makes it stuck.
        tripped = quota.tripped
        if tripped and (over := await quota.after_trip()) is not None:
            self.quota_notice = over
            return End.DIED
        if quota.lost:
            return End.DIED
        walked = tripped and not quota.tripped  # walked and re-armed (not held back until the tick)
        if self.interrupted_at is not None and now >= self.interrupted_at + self._grace:
            return End.STUCK
        if now >= self._next_check:
            if not await self._handle.is_alive():
                return End.DIED
            if not walked and (over := await quota.check()) is not None:
                self.quota_notice = over
                return End.DIED
            self._next_check = now + WATCHDOG_INTERVAL_S
        return None

    def until(self, now: float) -> float:
        """When the next look is due (``now``: when this one began)."""
        end = self._deadline if self.interrupted_at is None else self.interrupted_at + self._grace
        # At least every TRIP_LOOK_S, interrupted or not: a kernel the quota probe froze is walked soon.
        return min(self._next_check, now + TRIP_LOOK_S, end)


class Evaluation:
    """A question asked of a thread's kernel outside any cell: ``expression`` evaluated silently
    (no cell, no output, no execution count), its answer read from the shell reply. The same
    :class:`Watchdog` as a cell's watches it: a timeout interrupts it (its answer is None then),
    and a kernel that ignores the interrupt ``interrupt_grace_s`` later, dies, or writes past its
    workspace quota makes :attr:`lost` say why the session must discard it.
    """

    def __init__(
        self,
        handle: KernelHandle,
        workspace: Workspace,
        settings: KernelSettings,
        timeout: float,
        *,
        key: str,
        thaw: Callable[[], Awaitable[bool]],
        frozen: Callable[[], None],
    ) -> None:
        """``thaw`` and ``frozen`` as for :class:`Execution`."""
        self._handle = handle
        self._workspace = workspace
        self._timeout = timeout
        self._key = key
        self._thaw = thaw
        self._frozen = frozen
        # A silent request announces no cell: a timeout interrupts it at once.
        self.watchdog = Watchdog(handle, grace=settings.interrupt_grace_s, key=key, cell_running=True)
        #: Why the kernel must be discarded (None: it may stay; also when it was lost already,
        #: because it could not be thawed).
        self.lost: str | None = None

    async def run(self, expression: str) -> str | None:
        """The ``text/plain`` of ``expression``; None when it raised, timed out, or the kernel was lost."""
        quota = await QuotaWatch.scan_and_start(self._workspace, self._handle, thaw=self._thaw, frozen=self._frozen)
        try:
            if not await self._thaw():  # lost: it could not be thawed
                return None
            msg_id = self._handle.client.execute(
                "", silent=True, store_history=False, user_expressions={"value": expression}, allow_stdin=False
            )
            self.watchdog.arm(time.monotonic(), self._timeout, quota)
            reply = await self._wait(msg_id, quota)
            if reply is not None and await quota.check() is not None:  # grown past it without tripping the probe
                self.lost = _EVALUATION_OVER_QUOTA
                return None
        finally:
            await quota.stop()  # armed or not
        if reply is None or self.watchdog.interrupted_at is not None:
            return None
        content = reply["content"]
        value = (content.get("user_expressions") or {}).get("value") or {}
        if content.get("status") != "ok" or value.get("status") != "ok":
            log.info(
                "evaluation in the kernel of %s failed: %s", self._key, value.get("evalue") or content.get("evalue")
            )
            return None
        text = (value.get("data") or {}).get("text/plain")
        return text if isinstance(text, str) else None

    async def _wait(self, msg_id: str, quota: QuotaWatch) -> dict[str, Any] | None:
        """The reply, or None when the watchdog ended the evaluation (:attr:`lost` says why)."""
        while True:
            now = time.monotonic()
            end = await self.watchdog.look(now)
            if end is End.STUCK:
                log.warning("kernel of %s ignored the interrupt of an evaluation: discarding it", self._key)
                self.lost = "it did not answer, so it was replaced"
                return None
            if end is not None and self.watchdog.quota_notice is not None:
                log.warning("the kernel of %s wrote past its workspace quota during an evaluation", self._key)
                self.lost = _EVALUATION_OVER_QUOTA
                return None
            if end is not None:
                if not quota.lost:  # else it could not be thawed after a walk: lost already
                    log.warning("kernel of %s died during an evaluation", self._key)
                    self.lost = exit_text(await self._handle.exit_code())
                return None
            reply = await self._handle.reply(msg_id, max(self.watchdog.until(now) - now, 0.001))
            if reply is not None:
                return reply


_EVALUATION_OVER_QUOTA = "it wrote past the workspace quota while the bot asked it something, so it was stopped"


class ShellReply:
    """Waits for one execution's ``execute_reply`` on the shell channel and takes its execution count."""

    def __init__(self, handle: KernelHandle, msg_id: str, output: OutputCollector) -> None:
        self._handle = handle
        self._msg_id = msg_id
        self._output = output
        #: When the reply came in while iopub was quiet (None: not yet).
        self._replied_at: float | None = None
        #: The request's user expressions as the reply answered them (name → ``text/plain``).
        self.expressions: dict[str, str] = {}

    def until(self, limit: float) -> float:
        """``limit``, or sooner the moment from which iopub's silence means it lost messages."""
        return limit if self._replied_at is None else min(limit, self._replied_at + IOPUB_GRACE_S)

    async def iopub_quiet(self) -> bool:
        """An iopub read found nothing: look for the reply without waiting. True once the reply
        is in and iopub has stayed silent :data:`IOPUB_GRACE_S` since (``idle`` was lost)."""
        if self._replied_at is None:
            if await self._read(0):
                self._replied_at = time.monotonic()
            return False
        return time.monotonic() >= self._replied_at + IOPUB_GRACE_S

    async def after_idle(self, interrupted: bool) -> None:
        """The kernel reported idle: wait for the reply if it is not in yet."""
        if self._replied_at is None:
            # An interrupt that lands in ipykernel's own code around the cell can cost the
            # reply (idle still comes): do not wait long for it then.
            await self._read(INTERRUPTED_REPLY_TIMEOUT_S if interrupted else SHELL_REPLY_TIMEOUT_S)

    async def _read(self, wait: float) -> bool:
        """Wait up to ``wait`` s (0: only look) for the reply and take its execution count;
        whether it came."""
        reply = await self._handle.reply(self._msg_id, wait)
        if reply is None:
            return False
        content = reply["content"]
        if (count := content.get("execution_count")) is not None:
            self._output.execution_count = count
        answers = content.get("user_expressions")
        if isinstance(answers, dict):
            for name, answer in answers.items():
                text = answer.get("data", {}).get("text/plain") if isinstance(answer, dict) else None
                if isinstance(name, str) and isinstance(text, str) and len(text) <= _MAX_EXPRESSION_CHARS:
                    self.expressions[name] = text
        return True


class IopubReader:
    """Takes one execution's iopub messages into its output (nbclient's ``process_message``)."""

    def __init__(
        self,
        msg_id: str,
        output: OutputCollector,
        watchdog: Watchdog,
        on_output: Callable[[str, str], None] | None,
    ) -> None:
        self._msg_id = msg_id
        self._output = output
        self._watchdog = watchdog
        self._on_output = on_output

    async def take(self, msg: dict[str, Any]) -> bool:
        """Take one iopub message; True when it ends the execution (our ``status: idle``)."""
        if msg["parent_header"].get("msg_id") != self._msg_id:
            return False
        msg_type, content = msg["msg_type"], msg["content"]
        if msg_type == "status":
            return bool(content.get("execution_state") == "idle")
        if msg_type == "execute_input":
            await self._watchdog.cell_started()
        self._output.handle(msg_type, content)
        if self._on_output is not None and msg_type == "stream":
            try:
                self._on_output(str(content.get("name", "stdout")), str(content.get("text", "")))
            except Exception:  # a listener's failure must not end the cell
                log.exception("on_output failed")
        return False


class Execution:
    """One cell in a kernel, from the workspace walk before it to its result.

    The session sends it (:meth:`start`), counts it, and waits for it (:meth:`finish`); a
    kernel that died (``Outcome.DIED``) or got stuck (:attr:`stuck_notice`) is the session's
    to discard or replace, and the processes a cell left and the files it changed are the
    session's to look at.
    """

    def __init__(
        self,
        handle: KernelHandle,
        workspace: Workspace,
        settings: KernelSettings,
        timeout: float,
        *,
        key: str,
        on_output: Callable[[str, str], None] | None,
        thaw: Callable[[], Awaitable[bool]],
        frozen: Callable[[], None],
        expressions: dict[str, str] | None = None,
    ) -> None:
        """``on_output(name, text)`` hears each stream message as it arrives; ``thaw`` has the
        session thaw the kernel, ``frozen`` tells it that the quota probe froze it;
        ``expressions``: user expressions asked with the cell (their answers:
        :attr:`expression_answers`). The Stop button (:meth:`stop`) counts from now."""
        self._handle = handle
        self._workspace = workspace
        self._timeout = timeout
        self._key = key
        self._on_output = on_output
        self._thaw = thaw
        self._frozen = frozen
        self._msg_id = ""
        self._expressions = expressions or {}
        #: The answers to ``expressions`` (name → ``text/plain``), once the reply is in.
        self.expression_answers: dict[str, str] = {}
        self.output = OutputCollector(settings.max_output_bytes)
        self.watchdog = Watchdog(handle, grace=settings.interrupt_grace_s, key=key)
        #: The workspace's files before the cell (the baseline of its changed files).
        self.before: FileStamps = {}
        #: ``time.monotonic()`` when the cell was sent.
        self.started = 0.0
        #: Set when the kernel did not stop when interrupted: what the result says first.
        self.stuck_notice: str | None = None

    async def start(self, code: str) -> None:
        """Walk the workspace, start the quota probe, thaw the kernel and send ``code``."""
        # One walk: the diff's "before" and the quota's, in the same trip to a thread as the probe.
        quota = await QuotaWatch.scan_and_start(self._workspace, self._handle, thaw=self._thaw, frozen=self._frozen)
        self.before = self._workspace.stamps(quota.before)
        try:
            thawed = await self._thaw()
            self.started = time.monotonic()
            if thawed:  # else the session lost the kernel: the execution ends at once (DIED)
                self._msg_id = self._handle.client.execute(
                    code, store_history=True, allow_stdin=False, user_expressions=self._expressions
                )
        except BaseException:
            await quota.stop()
            raise
        self.watchdog.arm(self.started, self._timeout, quota)
        self.watchdog.lost = not thawed

    async def stop(self) -> None:
        """The Stop button (see :meth:`Watchdog.stop`)."""
        await self.watchdog.stop()

    async def finish(self) -> ExecutionResult:
        """Wait until the cell ends; its result, with what the execution itself has to say
        (an interrupt, dropped displays, lost output)."""
        reply = ShellReply(self._handle, self._msg_id, self.output)
        try:
            end = await self._wait(IopubReader(self._msg_id, self.output, self.watchdog, self._on_output), reply)
        finally:
            await self.watchdog.disarm()
        outcome, notice = await self._outcome(end, reply)
        self.expression_answers = reply.expressions
        output = self.output
        result = ExecutionResult(
            outcome=outcome,
            streams=output.streams(),
            result=_text_plain(output.result.data if output.result else None),
            result_data=output.result,
            displays=output.displays(),
            error=output.error,
            execution_count=output.execution_count,
            truncated=output.truncated,
        )
        if output.dropped_displays:
            notice = joined(notice, f"{output.dropped_displays} display output(s) were dropped (too much output).")
        if end is End.LOST_OUTPUT:
            if not await self._handle.renew_iopub():
                log.warning("iopub of %s did not come back after dropping an oversized message", self._key)
            result.truncated = True
            notice = joined(notice, LOST_OUTPUT_NOTICE)
        result.notice = notice
        return result

    async def _wait(self, reader: IopubReader, reply: ShellReply) -> End:
        """The loop in which the watchdog, the iopub reader and the shell reply waiter take turns."""
        client = self._handle.client
        while True:
            now = time.monotonic()
            if (end := await self.watchdog.look(now)) is not None:
                return end
            limit = reply.until(self.watchdog.until(now))
            try:
                msg = await client.get_iopub_msg(timeout=max(limit - now, 0.001))
            except Empty:
                if await reply.iopub_quiet():
                    return End.LOST_OUTPUT
                continue
            if await reader.take(msg):
                return End.IDLE

    async def _outcome(self, end: End, reply: ShellReply) -> tuple[Outcome, str | None]:
        """The outcome of an execution that ended so, and what its result says of an interrupt.
        A stuck kernel gets :attr:`stuck_notice` instead (the session, which replaces it, adds
        to it), a dead one nothing (the session words its death)."""
        stopped = self.watchdog.reason == "stop"
        if end is End.DIED:
            return Outcome.DIED, None
        if end is End.STUCK:
            if stopped:
                self.stuck_notice = "Execution was stopped on request, but the kernel did not respond to the interrupt."
                return Outcome.INTERRUPTED, None
            self.stuck_notice = f"Execution timed out after {self._timeout:g} s and did not stop when interrupted."
            return Outcome.TIMEOUT_RESTARTED, None
        interrupted = self.watchdog.interrupted_at is not None
        await reply.after_idle(interrupted)
        if not interrupted:
            return (Outcome.ERROR if self.output.error is not None else Outcome.OK), None
        if stopped:
            return Outcome.INTERRUPTED, "Execution was stopped on request; variables are kept."
        return (
            Outcome.TIMEOUT_INTERRUPTED,
            f"Execution timed out after {self._timeout:g} s and was interrupted; variables are kept.",
        )


def _text_plain(data: dict[str, Any] | None) -> str | None:
    value = (data or {}).get("text/plain")
    return value if isinstance(value, str) else None
