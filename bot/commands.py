"""In-thread commands: the message is just the word, after the mention."""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bot.attachments import human_size
from bot.budgets import Clock
from bot.config import Settings
from bot.events import FileOut, InboundMessage, Outbox, Reply
from bot.hostpaths import HostPaths
from bot.mcp.registry import McpServers
from bot.notebook import export_notebook
from bot.policies import ThreadPolicies
from bot.readable import readable
from bot.safetext import shown
from bot.schedules.commands import ScheduleCommands, is_schedule_command
from bot.store import Store
from bot.transcript import TimelineEntry
from bot.usage import UsageReport
from kernels import (
    UNSANDBOXED,
    KernelPool,
    OneShot,
    OneShotUnavailableError,
    UnsafePathError,
    human_age,
    sandbox_in_force,
)

log = logging.getLogger(__name__)

HELP_TEXT = """\
**Threadbook** runs Python for you in this thread. Attach files (CSV, Excel, JSON, …) and ask a question; \
I write and run the code, and post the answer, charts and files here. Variables stay between messages of this thread, even across bot restarts.

Commands (send just the word):
• `help` — this text
• `reset` — fresh Python kernel (variables and their saved copy cleared, files kept)
• `files` — list the files in this thread's workspace
• `export` — this thread as a Jupyter notebook (.ipynb)
• `export html` — this thread as one web page (.html) that opens in any browser, offline
• `usage` — tokens, Python time and cost of this thread and yours, today and this month (`usage all`: everyone's, for admins)
• `schedule <when> <question>` — ask again at set times, e.g. `schedule every monday 9:00 revenue by region` (`schedules` lists them, `unschedule N` removes one)
• `status` — kernel state, memory, saved variables, steps run, tokens used and 👍/👎 on the answers"""


#: ``export html``: the page is rendered by a one-shot process killed after this many seconds...
HTML_RENDER_TIMEOUT_S = 120.0
#: ...and refused when larger (it is read into memory and uploaded as one file).
HTML_MAX_BYTES = 50 * 2**20
#: The one-shot's answer (one line of JSON) is cut at this many bytes.
_MAX_ANSWER_BYTES = 4096
#: The names of the notebook and the page in the one-shot's scratch folder.
_NOTEBOOK, _PAGE = "notebook.ipynb", "page.html"
HTML_UNAVAILABLE_NOTICE = "⚠️ `export html` is not available on this bot (it has nowhere safe to render the page); `export` gives the notebook."
HTML_FAILED_NOTICE = "⚠️ The page could not be rendered; `export` still gives the notebook."
HTML_TIMEOUT_NOTICE = "⚠️ Rendering the page took too long and was stopped; `export` still gives the notebook."
HTML_TOO_BIG_NOTICE = (
    "⚠️ The page would be {size}, over the {limit} limit of `export html`; `export` gives the notebook instead."
)


USAGE_ALL_REFUSED = (
    "Only the bot's admins (`access.admins`) can see everyone's usage; `usage` shows this thread's and yours."
)


class _RenderFailed(Exception):
    """No page: ``reply`` says so to the thread, ``detail`` to the log."""

    def __init__(self, reply: Reply, detail: str) -> None:
        super().__init__(detail)
        self.reply = reply
        self.detail = detail


class Commands:
    """Answers ``help``, ``reset``, ``files``, ``export``, ``export html``, ``status``, ``usage``
    and the schedule commands."""

    def __init__(
        self,
        *,
        store: Store,
        pool: KernelPool,
        settings: Settings,
        oneshot: OneShot,
        clock: Clock = time.time,
        mcp: McpServers | None = None,
    ) -> None:
        """``oneshot``: where ``export html`` renders pages; ``clock``: what the usage reports count
        time with; ``mcp``: the MCP servers (``status`` says whether the channel's answer)."""
        self._oneshot = oneshot
        self._mcp = mcp
        self._clock = clock
        self._store = store
        self._pool = pool
        self._settings = settings
        self._policies = ThreadPolicies(settings, store.threads)
        self._host_paths = HostPaths.of(settings)
        self._table: dict[str, Callable[[InboundMessage], Awaitable[Reply]]] = {
            "help": self._help,
            "reset": self._reset,
            "files": self._files,
            "export": self._export,
            "export html": self._export_html,
            "status": self._status,
            "usage": self._usage,
            "usage all": self._usage_all,
        }
        self._usage_report = UsageReport(store.usage, store.feedback, settings.llm.prices)
        self._schedules = ScheduleCommands(book=store.schedules, settings=settings, clock=clock)

    async def try_run(self, message: InboundMessage, outbox: Outbox) -> bool:
        """Run the command the message consists of, if it is one; True when it was.

        A bare mention (no text; the dispatcher only asks when there are no attachments) gets help.
        """
        if is_schedule_command(message.text):
            await outbox.post(await self._schedules.run(message))
            return True
        words = " ".join(message.text.lower().split()).strip("!/")
        command = self._table.get(words or "help")
        if command is None:
            return False
        await outbox.post(await command(message))
        return True

    async def _usage(self, message: InboundMessage) -> Reply:
        return Reply(text=await self._usage_report.mine(message.key, message.user_id, self._clock()))

    async def _usage_all(self, message: InboundMessage) -> Reply:
        if not self._settings.access.is_admin(message.key.platform, message.user_id):
            return Reply(text=USAGE_ALL_REFUSED)
        return Reply(text=await self._usage_report.everyone(self._clock()))

    async def _help(self, message: InboundMessage) -> Reply:
        return Reply(text=HELP_TEXT)

    async def _reset(self, message: InboundMessage) -> Reply:
        key = str(message.key)  # the kernel layer's name of the thread
        running = self._pool.get(key) is not None
        await self._pool.forget_state(key)  # a fresh start means fresh: the saved variables go too
        if not running:
            return Reply(
                text="🔄 Saved variables cleared; the next question starts a fresh kernel. The files in this thread are kept."
            )
        return Reply(text="🔄 Fresh kernel started: variables are cleared, the files in this thread are kept.")

    async def _files(self, message: InboundMessage) -> Reply:
        files = await self._pool.workspaces.for_key(str(message.key)).list_files()
        if not files:
            return Reply(text="This thread's workspace is empty.")
        lines = [f"• `{shown(f.name)}` — {human_size(f.size)}" for f in files[:50]]
        if len(files) > 50:
            lines.append(f"… and {len(files) - 50} more")
        return Reply(text=f"Files in this thread ({len(files)}):\n" + "\n".join(lines))

    async def _export(self, message: InboundMessage) -> Reply:
        timeline = await self._store.transcripts.timeline(message.key)
        if not timeline:
            return Reply(text="Nothing to export yet.")
        title = f"Threadbook thread {message.key.channel}/{message.key.thread}"
        # Validating and serialising a long thread with charts takes a while: off the event loop.
        data = await asyncio.to_thread(self._notebook, timeline, title)
        name = f"threadbook-{message.key.thread.replace('.', '-')}.ipynb"
        # The notebook is the bot's own bytes, already in memory: adapters read them, not the file.
        notebook = FileOut(name=name, size=len(data), open_reader=functools.partial(io.BytesIO, data))
        return Reply(text=f"📓 Here is this thread as a notebook ({len(timeline)} entries).", files=(notebook,))

    def _notebook(self, timeline: list[TimelineEntry], title: str) -> bytes:
        """The thread's notebook as readers get it: tracebacks trimmed, no host path (blocking)."""
        return readable(export_notebook(timeline, title=title), self._host_paths.hide)

    async def _export_html(self, message: InboundMessage) -> Reply:
        """The thread as one self-contained web page, rendered in a fresh sandboxed process.

        The bot builds the notebook from the store (its own bytes), writes it into a one-shot's
        private scratch folder, runs ``threadbook_kernel.export`` there (nbconvert, sanitised,
        nothing loaded from the network; :mod:`kernels.oneshot`) and reads the page back through
        :mod:`kernels.safefs` (no link followed, at most :data:`HTML_MAX_BYTES`). Nothing of the
        thread runs: no kernel is leased, so it works while every kernel is busy or the thread's
        budget is spent. The bot never parses the page.
        """
        timeline = await self._store.transcripts.timeline(message.key)
        if not timeline:
            return Reply(text="Nothing to export yet.")
        title = f"Threadbook thread {message.key.channel}/{message.key.thread}"
        notebook = await asyncio.to_thread(self._notebook, timeline, title)
        try:
            page = await self._render(notebook)
        except OneShotUnavailableError as exc:
            log.warning("export html of %s: %s", message.key, exc)
            return Reply(text=HTML_UNAVAILABLE_NOTICE, ok=False)
        except _RenderFailed as exc:
            if exc.reply.text == HTML_FAILED_NOTICE:
                log.warning("export html of %s: %s", message.key, exc.detail[:300])
            return exc.reply
        name = f"threadbook-{message.key.thread.replace('.', '-')}.html"
        # The page is read into memory through a checked descriptor: adapters read these bytes.
        file = FileOut(name=name, size=len(page), open_reader=functools.partial(io.BytesIO, page))
        return Reply(
            text=f"🌐 Here is this thread as one web page ({len(timeline)} entries, {human_size(len(page))}); "
            "it opens in any browser, offline.",
            files=(file,),
        )

    async def _render(self, notebook: bytes) -> bytes:
        """The page of ``notebook``, from a one-shot; :class:`_RenderFailed` with the reply to
        give when there is none."""
        try:
            async with self._oneshot.job() as job:
                await asyncio.to_thread(job.write, _NOTEBOOK, notebook)
                result = await job.run(
                    "export",
                    [_NOTEBOOK, _PAGE, str(HTML_MAX_BYTES)],
                    timeout=HTML_RENDER_TIMEOUT_S,
                    max_output=_MAX_ANSWER_BYTES,
                )
                if result.timed_out:
                    raise _RenderFailed(Reply(text=HTML_TIMEOUT_NOTICE, ok=False), "timed out")
                status = _status_of(result.output)
                if status.get("error") == "too_big":
                    raise _RenderFailed(_too_big(_size_in(status)), "too big")
                if not result.ok or status.get("ok") is not True:
                    detail = f"exit {result.exit_code}: {status.get('detail', '')} {result.errors[-300:]}"
                    raise _RenderFailed(Reply(text=HTML_FAILED_NOTICE, ok=False), detail)
                page = await asyncio.to_thread(job.read, _PAGE, HTML_MAX_BYTES)
        except (OSError, UnsafePathError) as exc:
            raise _RenderFailed(Reply(text=HTML_FAILED_NOTICE, ok=False), f"scratch folder: {exc}") from exc
        if page is None:
            raise _RenderFailed(_too_big(None), "too big")
        return page

    async def _status(self, message: InboundMessage) -> Reply:
        key = str(message.key)  # the kernel layer's name of the thread
        session = self._pool.get(key)
        prompt_tokens, completion_tokens = await self._store.usage.thread_tokens(message.key)
        feedback = await self._store.feedback.counts(message.key)
        cells = await self._store.transcripts.cell_count(message.key)
        if session is None:
            kernel = "no kernel running (one starts with the next question)"
        else:
            memory = await session.memory_bytes()
            kernel = f"{session.state}, {session.executions} executions since start"
            if memory is not None:
                kernel += f", {human_size(memory)} memory"
        queue = self._pool.queue_stats()
        waits = (
            f"; recent waits: median {queue.p50_wait_s:.1f} s, longest {queue.max_wait_s:.1f} s "
            f"({queue.recent_waits} threads)"
            if queue.recent_waits
            else ""
        )
        kernels = f"{len(self._pool.sessions())} of {self._pool.settings.max_kernels} running, {queue.waiting} threads waiting"
        saved = await asyncio.to_thread(self._pool.workspaces.for_key(key).saved_state)
        state = (
            "none"
            if saved is None
            else f"{human_size(saved.bytes)}, saved {human_age(time.time() - saved.saved_at)} ago"
        )
        # Both lines name no host path (no cgroup folder, workspace root or interpreter).
        sandbox = sandbox_in_force(self._pool.launcher) or f"⚠️ {UNSANDBOXED}"
        servers = await self._mcp_status(message)
        return Reply(
            text=(
                f"**Kernel:** {kernel}\n"
                f"**Saved variables:** {state}\n"
                f"**Kernels:** {kernels}{waits}\n"
                f"**Sandbox:** {sandbox}\n"
                f"**Isolation:** {self._pool.launcher.isolation}\n"
                f"**Code cells run in this thread:** {cells}\n"
                f"**Tokens used:** {prompt_tokens + completion_tokens:,} "
                f"({prompt_tokens:,} prompt, {completion_tokens:,} completion)\n"
                f"**Feedback on answers:** 👍 {feedback.good} · 👎 {feedback.bad}"
                f"{servers}"
            )
        )

    async def _mcp_status(self, message: InboundMessage) -> str:
        """A line on the thread's MCP servers (each pinged, within 3 s), or empty without any."""
        granted = (await self._policies.of(message.key)).mcp
        if not granted or self._mcp is None:
            return ""
        found = await self._mcp.check(granted)
        shown_servers = [
            f"`{name}` ✅ answers ({health.detail})" if health.up else f"`{name}` ⚠️ does not answer ({health.detail})"
            for name, health in found.items()
        ]
        return "\n**MCP servers:** " + " · ".join(shown_servers)


def _status_of(output: bytes) -> dict[str, Any]:
    """The one-shot's status (untrusted JSON, its last line, bounded): a dict, else empty."""
    lines = output.decode("utf-8", "replace").strip().splitlines()
    try:
        status = json.loads(lines[-1]) if lines else None
    except ValueError:
        return {}
    return status if isinstance(status, dict) else {}


def _size_in(status: dict[str, Any]) -> int | None:
    size = status.get("bytes")
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None


def _too_big(size: int | None) -> Reply:
    shown_size = human_size(size) if size is not None else "larger"
    return Reply(text=HTML_TOO_BIG_NOTICE.format(size=shown_size, limit=human_size(HTML_MAX_BYTES)), ok=False)
