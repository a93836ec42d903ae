"""One agent turn: attachments in, LLM tool loop against the thread's kernel, reply out."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from bot import metrics
from bot.agent.llm import Usage
from bot.agent.loop import Agent, TurnResult
from bot.agent.prompt import PromptFile, build_system_prompt
from bot.attachments import IngestResult, add_previews, describe_for_model, ingest
from bot.budgets import Budgets, TokenAllowance
from bot.config import ChannelPolicy, Settings
from bot.displays import TABLE_MIME, chart_from, table_from
from bot.events import Chart, FileOut, ImageOut, InboundMessage, Outbox, Progress, Reply, Table, ThreadKey
from bot.live import LiveCell
from bot.mcp.registry import McpServers
from bot.mcp.tool import McpTool, tools_for
from bot.policies import ThreadPolicies
from bot.record import TurnRecord, TurnRecords
from bot.safetext import shown
from bot.sources.registry import Sources
from bot.sources.tool import SqlTool
from bot.store import Threads
from bot.transcript import NewCell
from kernels import (
    CHAT_IMAGE_MIMES,
    DisplayOutput,
    ExecutionResult,
    KernelOptions,
    KernelPool,
    KernelSession,
    KernelUnavailableError,
    OneShot,
    Outcome,
    PackageInstaller,
    PackageOutcome,
    PinnedFile,
    QueueFullError,
    QueueLeftError,
    QueueTimeoutError,
    UnsafePathError,
    Workspace,
    distribution_for,
    missing_module,
    safefs,
)

log = logging.getLogger(__name__)

MAX_IMAGES = 10
MAX_FILES = 10
#: Tables the code showed (``display_dataframe_to_user``) sent with one answer.
MAX_TABLES = 5
MAX_PROMPT_FILES = 50
IMAGE_SUFFIXES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif"}
_FIGURE_SUFFIXES = {"image/png": ".png", "image/jpeg": ".jpg"}
MAX_INLINE_IMAGE_BYTES = 8 * 1024 * 1024
#: A longer answer is cut here (a few chat messages); the whole text comes along as a file.
MAX_REPLY_CHARS = 6000
#: Put before the question of a scheduled run: its data may be new, earlier results stale.
SCHEDULED_RUN_NOTE = (
    "[Scheduled run ({when}): this question was asked before and is asked again now. The data "
    "files may have changed since: load them again instead of reusing earlier variables or results.]"
)
FULL_ANSWER_NAME = "answer.md"
QUEUE_FULL_NOTICE = (
    "🚦 All {kernels} Python kernels are in use and {waiting} threads are already waiting for one; "
    "please ask again in a few minutes."
)
QUEUE_TIMEOUT_NOTICE = (
    "⌛ No Python kernel came free within {timeout:g} s (all {kernels} are in use); please ask again."
)
QUEUE_LEFT_NOTICE = "⏹️ Stopped while waiting for a kernel; nothing ran."
KERNEL_START_NOTICE = "⚠️ I could not start a Python kernel for this thread. Please try again."
KERNEL_SERVICE_NOTICE = (
    "⚠️ The service that runs Python kernels is not reachable right now; please ask again in a minute."
)


def kernel_options(settings: Settings, policy: ChannelPolicy) -> KernelOptions:
    """What a thread's kernel may see and do, from the policy in force for it (:meth:`TurnRunner.policy`)."""
    return KernelOptions(
        data_dir=policy.data_dir,
        network=settings.kernels.network if policy.network is None else policy.network,
        background_processes=policy.background_processes,
    )


@dataclass
class _ActiveTurn:
    """What Stop needs to reach a running turn."""

    session: KernelSession | None = None
    #: Set by Stop: no further code runs, and a turn still waiting for a kernel leaves the queue.
    leave: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def stopped(self) -> bool:
        """Whether Stop was pressed."""
        return self.leave.is_set()


@dataclass
class _Turn:
    """One message's turn: what it asks, where it works, and where it reports."""

    message: InboundMessage
    user_content: str
    workspace: Workspace
    active: _ActiveTurn
    progress: Progress
    outputs: Outputs
    has_files: bool
    #: What the turn records (transcript, usage), and the token budget it started with.
    record: TurnRecord
    allowance: TokenAllowance
    #: The policy in force for the thread (:meth:`TurnRunner.policy`).
    policy: ChannelPolicy
    #: This message's uploads: saved before the kernel is leased, previewed by it once leased.
    uploads: IngestResult = field(default_factory=IngestResult)


@dataclass
class _RecordingRunner:
    """Runs the agent's code in the thread's kernel, stores each cell, and honours Stop.

    Code that fails on a module that is not installed gets its package installed on demand
    (when ``packages`` allows it) and runs once more; the result's notice tells the model,
    ``notes`` collects what the thread is told.
    """

    session: KernelSession
    record: TurnRecord
    turn: _ActiveTurn
    packages: PackageInstaller | None = None
    progress: Progress | None = None
    #: Shows each step's cell while it runs (its output as it comes).
    live: LiveCell | None = None
    results: list[ExecutionResult] = field(default_factory=list)
    #: Lines for the reply (packages installed, installs that failed).
    notes: list[str] = field(default_factory=list)
    #: Missing modules already dealt with in this turn: each is installed (and re-run) once.
    _provided: dict[str, PackageOutcome] = field(default_factory=dict)

    async def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
        """Run ``code`` unless Stop was pressed; record the result and store the cell."""
        if self.turn.stopped:
            return ExecutionResult(outcome=Outcome.INTERRUPTED, notice="Stopped by the user before running.")
        live = self.live if self.live is not None and self.live.claim() else None
        result = await self._run(code, timeout, live)
        module = missing_module(result.error) if self.packages is not None and result.outcome is Outcome.ERROR else None
        if module is None or self.packages is None:
            return self._record(code, result)
        if (earlier := self._provided.get(module)) is not None:
            # Once per module and turn: an import that still fails after an install is the model's to read.
            if not earlier.rerun:
                _add_notice(result, earlier.model_note())
            return self._record(code, result)
        if self.progress is not None and self.packages.allowed(distribution_for(module)):
            await self.progress.update(f"📦 Installing `{distribution_for(module)}`…")
        outcome = self._provided[module] = await self.packages.provide(module)
        metrics.package_install(outcome.verdict.value)
        if (note := outcome.thread_note()) is not None and note not in self.notes:
            self.notes.append(note)
        if not outcome.rerun or self.turn.stopped:
            _add_notice(result, outcome.model_note())
            if self.turn.stopped:
                result.outcome = Outcome.INTERRUPTED
            return self._record(code, result)
        self._record(code, result)  # the failed run stays in the thread's notebook, as it happened
        again = await self._run(code, timeout, live)
        _add_notice(again, outcome.model_note())
        return self._record(code, again)

    async def _run(self, code: str, timeout: float | None, live: LiveCell | None = None) -> ExecutionResult:
        if live is None:
            result = await self.session.execute(code, timeout)
        else:
            live.begin()
            try:
                result = await self.session.execute(code, timeout, on_output=live.record)
            except BaseException:
                await live.ran(ok=False, show=False)
                raise
            await live.ran(ok=result.outcome is Outcome.OK)
        if self.turn.stopped and result.outcome is not Outcome.INTERRUPTED:
            result.outcome = Outcome.INTERRUPTED
        return result

    def _record(self, code: str, result: ExecutionResult) -> ExecutionResult:
        self.results.append(result)
        metrics.execution(result.outcome.value, result.duration_s)
        self.record.add_cell(NewCell.of(code, result))  # stored while the model reads the result
        return result


class TurnRunner:
    """Runs agent turns; knows which turn is running in which thread (for Stop)."""

    def __init__(
        self,
        *,
        settings: Settings,
        records: TurnRecords,
        threads: Threads,
        pool: KernelPool,
        agent: Agent,
        budgets: Budgets,
        oneshot: OneShot,
        packages: PackageInstaller | None = None,
        sources: Sources | None = None,
        mcp: McpServers | None = None,
    ) -> None:
        """``records``: where each turn records what it did (transcript, usage); ``threads``:
        which channel a direct-message thread took its policy from (:mod:`bot.policies`); ``oneshot``: where upload
        previews are computed; ``packages``: installs missing
        modules on demand (None: never); ``sources``: the data sources channels may be granted
        (the ``sql`` tool); ``mcp``: the MCP servers channels may be granted (their tools)."""
        self._oneshot = oneshot
        self._sources = sources
        self._mcp = mcp
        self._settings = settings
        self._budgets = budgets
        self._packages = packages
        self._records = records
        self._policies = ThreadPolicies(settings, threads)
        self._pool = pool
        self._agent = agent
        self._active: dict[ThreadKey, _ActiveTurn] = {}

    def running(self, key: ThreadKey) -> bool:
        """Whether a turn of the thread runs here now."""
        return key in self._active

    async def stop(self, key: ThreadKey) -> bool:
        """Stop the thread's running turn: interrupt its code, run no further code."""
        turn = self._active.get(key)
        if turn is None:
            return False
        turn.leave.set()
        if turn.session is not None:
            await turn.session.interrupt()
        return True

    async def policy(self, key: ThreadKey) -> ChannelPolicy:
        """The policy in force for a thread, as decided (:meth:`bot.policies.ThreadPolicies.of`)."""
        return await self._policies.of(key)

    async def run(self, message: InboundMessage, outbox: Outbox, allowance: TokenAllowance) -> None:
        """Run one admitted turn for ``message`` (its tokens checked against ``allowance`` as it
        goes) and post its reply."""
        key = message.key
        workspace = self._pool.workspaces.for_key(str(key))
        intake = await ingest(
            message.attachments, workspace, max_bytes=int(self._settings.kernels.max_upload_mb * 2**20)
        )
        for name, reason in intake.refused:
            await outbox.notify(f"📎 `{shown(name)}` was not added: {reason}")
        user_content = message.text.strip()
        if message.scheduled is not None and user_content:
            user_content = f"{SCHEDULED_RUN_NOTE.format(when=message.scheduled)}\n\n{user_content}"
        if not user_content and not intake.saved:
            metrics.turn_outcome("empty")
            return

        in_force = await self._policies.for_turn(message, outbox)
        if in_force.stop_kernel:  # it saw a channel's data folder the thread may no longer see
            await self._pool.shutdown(str(key))
        policy = in_force.policy
        model = policy.model or self._settings.llm.model
        record = await self._records.open(key, model=model, user_id=message.user_id, at=self._budgets.clock())
        turn = _ActiveTurn()
        self._active[key] = turn
        progress = outbox.progress()
        await progress.start("Thinking…")
        ok = False
        outputs = Outputs()
        try:
            reply = await self._turn(
                _Turn(
                    message,
                    user_content,
                    workspace,
                    turn,
                    progress,
                    outputs,
                    bool(intake.saved),
                    record,
                    allowance,
                    policy,
                    intake,
                )
            )
            ok = reply.ok
            await outbox.post(reply)
        finally:
            outputs.close()
            self._active.pop(key, None)
            await progress.finish(ok)

    async def _turn(self, t: _Turn) -> Reply:
        """Get the thread's kernel (waiting in the queue if need be), then converse."""
        key = t.message.key
        policy = t.policy
        options = kernel_options(self._settings, policy)
        kernels = self._settings.kernels

        async def waiting(ahead: int) -> None:
            place = "you are next" if ahead == 0 else f"{ahead} ahead of you"
            await t.progress.update(f"⏳ Waiting for a free kernel ({place})")

        async with contextlib.AsyncExitStack() as held:
            try:
                lease = self._pool.lease(str(key), options, on_wait=waiting, leave=t.active.leave)
                session = await held.enter_async_context(lease)  # held until the turn ends
            except QueueFullError:
                metrics.turn_outcome("queue_full")
                waiting_now = self._pool.queue_stats().waiting
                return Reply(text=QUEUE_FULL_NOTICE.format(kernels=kernels.max_kernels, waiting=waiting_now), ok=False)
            except QueueTimeoutError:
                metrics.turn_outcome("queue_timeout")
                text = QUEUE_TIMEOUT_NOTICE.format(timeout=kernels.queue_timeout_s, kernels=kernels.max_kernels)
                return Reply(text=text, ok=False)
            except QueueLeftError:
                metrics.turn_outcome("queue_left")
                return Reply(text=QUEUE_LEFT_NOTICE, ok=False)
            except KernelUnavailableError as exc:
                metrics.turn_outcome("kernel_unavailable")
                log.warning("no kernel for %s: %s", key, exc)
                return Reply(text=KERNEL_SERVICE_NOTICE, ok=False)
            except Exception:
                log.exception("kernel start failed for %s", key)
                metrics.turn_outcome("kernel_start_failed")
                return Reply(text=KERNEL_START_NOTICE, ok=False)
            reply = await self._converse(t, session, options, policy)
        return reply

    async def _converse(self, t: _Turn, session: KernelSession, options: KernelOptions, policy: ChannelPolicy) -> Reply:
        """The agent loop against the thread's (leased) kernel, then the reply."""
        key = t.message.key
        t.active.session = session
        kernel_is_fresh = session.fresh and await t.record.ran_code_before()
        if t.uploads.saved:  # previews come from fresh sandboxed one-shots, never from here or the thread's kernel
            saved = await add_previews(t.uploads.saved, t.workspace, self._oneshot)
            t.user_content = f"{t.user_content}\n\n{describe_for_model(saved, t.uploads.refused)}".strip()
        # Two trips off the event loop (the store's thread, a walk of the workspace) at once.
        history, workspace_files = await asyncio.gather(t.record.history(), t.workspace.list_files())
        seen = self._pool.launcher.kernel_view(options)  # data_dir and network as the (sandboxed) kernel sees them
        system_prompt = build_system_prompt(
            files=[PromptFile(name=f.name, size=f.size) for f in workspace_files[:MAX_PROMPT_FILES]],
            channel_prompt=policy.system_prompt,
            data_dir=seen.data_dir,
            kernel_fresh=kernel_is_fresh,
            restored=session.restored.notice() if session.restored is not None else None,
            network=seen.network,
        )
        if policy.mcp and self._mcp is not None and (down := self._mcp.down_note(policy.mcp)):
            system_prompt = f"{system_prompt}\n\n{down}"
        live = LiveCell(t.progress)
        runner = _RecordingRunner(
            session=session,
            record=t.record,
            turn=t.active,
            packages=self._packages,
            progress=t.progress,
            live=live,
        )

        tools: list[SqlTool | McpTool] = []
        if policy.sources and self._sources is not None:
            tools.append(
                await SqlTool.open(
                    sources=self._sources,
                    granted=policy.sources,
                    kernel=runner,
                    workspace=t.workspace,
                    status=t.progress.update,
                    leave=t.active.leave,
                )
            )
        # The granted MCP servers' tools (none without a grant); the bot makes their calls.
        tools += tools_for(self._mcp, policy.mcp, workspace=t.workspace, status=t.progress.update, leave=t.active.leave)

        async def within_budget(spent: Usage) -> str | None:
            return t.allowance.exceeded(spent.prompt_tokens + spent.completion_tokens, self._budgets.clock())

        started = time.time()
        try:
            result = await self._agent.run_turn(
                history=history,
                user_content=t.user_content,
                runner=runner,
                system_prompt=system_prompt,
                model=policy.model,
                max_rounds=policy.max_rounds,
                on_step=live.step,
                has_files=t.has_files,
                drafts=t.progress if t.progress.shows_drafts else None,
                budget=within_budget,
                tools=tools,
            )
        finally:
            # Also when the turn fails: the cells that ran belong in the store, and a failed
            # write must surface instead of vanishing with an unawaited task.
            await live.close()
            await t.record.cells_stored()
        metrics.turn_outcome(result.stop_reason)
        # A failed model request leaves new_messages empty: nothing of it (not even the user's
        # message) enters the history, so the next turn replays only exchanges that worked.
        # Our own notes are stored as notices, which history() never returns to the model.
        await t.record.close(
            result.new_messages,
            notice=result.notice,
            user_id=t.message.user_id,
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
            # The CPU time the kernel's processes really used (threads a cell started, and the
            # saves since the last turn, included; the cells' wall time where it is not known),
            # and the data sources' query time and the MCP calls' wall time.
            kernel_s=_or(session.take_cpu_seconds(), sum(r.duration_s for r in runner.results))
            + sum(tool.seconds for tool in tools),
        )
        await collect_outputs(runner.results, t.workspace, t.outputs)
        log.info(
            "turn in %s: %s after %d cells, %.1fs", key, result.stop_reason, len(runner.results), time.time() - started
        )
        # A kernel that stopped unasked or variables that could not be saved: told once, here.
        notes = [*runner.notes, *session.take_thread_notices()]
        return _reply(
            result,
            t.outputs.images,
            t.outputs.files,
            notes,
            tables=t.outputs.tables,
            tables_shown=t.outputs.tables_shown,
        )


def _or(value: float | None, fallback: float) -> float:
    return fallback if value is None else value


def _add_notice(result: ExecutionResult, note: str) -> None:
    result.notice = f"{result.notice} {note}" if result.notice else note


def _reply(
    result: TurnResult,
    images: list[ImageOut],
    files: list[FileOut],
    extra: list[str] | None = None,
    *,
    tables: list[Table] | None = None,
    tables_shown: int = 0,
) -> Reply:
    notes = list(extra or [])
    tables = tables or []
    if len(images) > MAX_IMAGES:
        notes.append(f"_{len(images) - MAX_IMAGES} more images were made; showing the first {MAX_IMAGES}._")
    if tables_shown > MAX_TABLES:
        notes.append(f"_{tables_shown - MAX_TABLES} more tables were shown; showing the first {MAX_TABLES}._")
    if len(files) > MAX_FILES:
        notes.append(f"_{len(files) - MAX_FILES} more files were made; say `files` to list them all._")
    text, full = cap_answer(result.text)
    attached = [*files[:MAX_FILES], *([full] if full is not None else [])]
    text = "\n\n".join([text, *notes]).strip() or "(no answer)"
    return Reply(
        text=text,
        images=tuple(images[:MAX_IMAGES]),
        files=tuple(attached),
        tables=tuple(tables[:MAX_TABLES]),
        ok=result.ok,
        rateable=result.ok,
    )


def cap_answer(text: str, limit: int = MAX_REPLY_CHARS) -> tuple[str, FileOut | None]:
    """An answer of at most ``limit`` characters (a few chat messages) and, when it had to be
    cut, the whole answer as a Markdown file to attach."""
    if len(text) <= limit:
        return text, None
    data = text.encode()
    head = text[:limit]
    if (cut := head.rfind("\n")) > limit * 4 // 5:
        head = head[:cut]  # end on a whole line when one ends near the limit
    note = f"\n\n_… the answer is {len(text):,} characters long; the whole of it is attached as `{FULL_ANSWER_NAME}`._"
    full = FileOut(name=FULL_ANSWER_NAME, size=len(data), open_reader=lambda: io.BytesIO(data))
    return head + note, full


@dataclass
class Outputs:
    """What a turn sends back besides its text; holds the changed files open until they are posted."""

    images: list[ImageOut] = field(default_factory=list)
    files: list[FileOut] = field(default_factory=list)
    #: Tables the code showed, in order.
    tables: list[Table] = field(default_factory=list)
    #: How many tables the code showed (only the first :data:`MAX_TABLES` are read).
    tables_shown: int = 0
    _open: list[PinnedFile] = field(default_factory=list)

    def add_file(self, pinned: PinnedFile, name: str) -> None:
        """Send ``pinned`` (kept open until :meth:`close`) as ``name``."""
        self._open.append(pinned)
        self.files.append(FileOut(name=shown(name), size=pinned.size, open_reader=pinned.reader))

    def close(self) -> None:
        """Release every file held for sending."""
        for pinned in self._open:
            pinned.close()
        self._open.clear()


async def collect_outputs(results: list[ExecutionResult], workspace: Workspace, outputs: Outputs) -> None:
    """Images shown and files created or changed during a turn, each sent once, into ``outputs``.

    A saved image file is sent inline as an image; a cell that both showed figures and saved
    image files counts as one chart per saved file (``plt.savefig`` then ``plt.show``), so the
    shown copies are dropped. Identical bytes are sent once. A shown chart whose data the kernel
    could read carries it (:attr:`ImageOut.chart`), and tables the code showed
    (``display_dataframe_to_user``) are read from their bundles (:mod:`bot.displays`). Files are
    opened without following links (:mod:`kernels.safefs`) and sent from those descriptors.
    """
    changed: list[str] = []
    displayed_images: list[tuple[bytes, str, Chart | None]] = []
    for result in results:
        saved_images = [n for n in result.changed_files if PurePosixPath(n).suffix.lower() in IMAGE_SUFFIXES]
        outputs_shown = [*result.displays, *([result.result_data] if result.result_data else [])]
        displayed = [image for out in outputs_shown if (image := _chat_image(out)) is not None]
        if saved_images and len(displayed) <= len(saved_images):
            displayed = []
        displayed_images.extend(displayed)
        for out in outputs_shown:
            if TABLE_MIME not in out.data:
                continue
            outputs.tables_shown += 1
            # Only the tables a reply shows are parsed; the rest are counted for its note.
            if len(outputs.tables) < MAX_TABLES and (table := table_from(out.data)) is not None:
                outputs.tables.append(table)
        changed.extend(n for n in result.changed_files if n not in changed)

    seen: set[str] = set()

    def add_image(data: bytes, title: str, mime: str, chart: Chart | None = None) -> None:
        digest = hashlib.sha256(data).hexdigest()
        if digest not in seen:
            seen.add(digest)
            outputs.images.append(ImageOut(data=data, title=shown(title), mime=mime, chart=chart))

    for index, (data, mime, chart) in enumerate(displayed_images, start=1):
        add_image(data, f"figure-{index}{_FIGURE_SUFFIXES.get(mime, '.png')}", mime, chart)
    for name, found in await asyncio.to_thread(_changed_files, workspace, changed):
        base = PurePosixPath(name).name
        if isinstance(found, bytes):
            add_image(found, base, IMAGE_SUFFIXES[PurePosixPath(name).suffix.lower()])
        else:
            outputs.add_file(found, base)


def _chat_image(out: DisplayOutput) -> tuple[bytes, str, Chart | None] | None:
    """An output's best chat image (:meth:`DisplayOutput.image`) with the chart data beside it
    (a PNG only: a chart's picture)."""
    image = out.image()
    if image is None:
        return None
    data, mime = image
    return data, mime, chart_from(out.data) if mime == CHAT_IMAGE_MIMES[0] else None


def _changed_files(workspace: Workspace, names: list[str]) -> list[tuple[str, PinnedFile | bytes]]:
    """(Blocking) the changed files, opened without following links from one folder
    descriptor: an image small enough to show inline as its bytes, any other as the open
    file; files gone again or unsafe (a link, a FIFO, a folder) are left out."""
    try:
        dir_fd = safefs.open_dir(workspace.path)
    except (UnsafePathError, OSError) as exc:
        log.warning("not sending changed files: %s", exc)
        return []
    found: list[tuple[str, PinnedFile | bytes]] = []
    try:
        for name in names:
            try:
                pinned = safefs.open_file_at(dir_fd, name)
            except FileNotFoundError:
                continue  # deleted again during the turn
            except (UnsafePathError, OSError) as exc:
                log.warning("not sending changed file %r: %s", name, exc)
                continue
            if PurePosixPath(name).suffix.lower() in IMAGE_SUFFIXES and pinned.size <= MAX_INLINE_IMAGE_BYTES:
                with pinned:
                    found.append((name, pinned.read()))
            else:
                found.append((name, pinned))
    finally:
        os.close(dir_fd)
    return found
