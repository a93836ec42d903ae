"""In-thread commands: the message is just the word, after the mention."""

from __future__ import annotations

import asyncio
import functools
import io
import time
from collections.abc import Awaitable, Callable

from bot.attachments import human_size
from bot.events import FileOut, InboundMessage, Outbox, Reply
from bot.notebook import export_notebook
from bot.safetext import shown
from bot.store import Store
from kernels import KernelPool
from kernels.units import human_age

HELP_TEXT = """\
**Threadbook** runs Python for you in this thread. Attach files (CSV, Excel, JSON, …) and ask a question; \
I write and run the code, and post the answer, charts and files here. Variables stay between messages of this thread, even across bot restarts.

Commands (send just the word):
• `help` — this text
• `reset` — fresh Python kernel (variables and their saved copy cleared, files kept)
• `files` — list the files in this thread's workspace
• `export` — this thread as a Jupyter notebook (.ipynb)
• `status` — kernel state, memory, saved variables, steps run and tokens used"""


class Commands:
    """Answers ``help``, ``reset``, ``files``, ``export`` and ``status``."""

    def __init__(self, *, store: Store, pool: KernelPool) -> None:
        self._store = store
        self._pool = pool
        self._table: dict[str, Callable[[InboundMessage], Awaitable[Reply]]] = {
            "help": self._help,
            "reset": self._reset,
            "files": self._files,
            "export": self._export,
            "status": self._status,
        }

    async def try_run(self, message: InboundMessage, outbox: Outbox) -> bool:
        """Run the command the message consists of, if it is one; True when it was.

        A bare mention (no text; the dispatcher only asks when there are no attachments) gets help.
        """
        command = self._table.get(message.text.strip().lower().strip("!/") or "help")
        if command is None:
            return False
        await outbox.post(await command(message))
        return True

    async def _help(self, message: InboundMessage) -> Reply:
        return Reply(text=HELP_TEXT)

    async def _reset(self, message: InboundMessage) -> Reply:
        key = str(message.key)
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
        key = str(message.key)
        timeline = await self._store.timeline(key)
        if not timeline:
            return Reply(text="Nothing to export yet.")
        title = f"Threadbook thread {message.key.channel}/{message.key.thread}"
        # Validating and serialising a long thread with charts takes a while: off the event loop.
        data = await asyncio.to_thread(export_notebook, timeline, title=title)
        name = f"threadbook-{message.key.thread.replace('.', '-')}.ipynb"
        # The notebook is the bot's own bytes, already in memory: adapters read them, not the file.
        notebook = FileOut(name=name, size=len(data), open_reader=functools.partial(io.BytesIO, data))
        return Reply(text=f"📓 Here is this thread as a notebook ({len(timeline)} entries).", files=(notebook,))

    async def _status(self, message: InboundMessage) -> Reply:
        key = str(message.key)
        session = self._pool.get(key)
        prompt_tokens, completion_tokens = await self._store.usage(key)
        cells = await self._store.cell_count(key)
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
        state = "none" if saved is None else f"{human_size(saved.bytes)}, saved {human_age(time.time() - saved.saved_at)} ago"
        return Reply(
            text=(
                f"**Kernel:** {kernel}\n"
                f"**Saved variables:** {state}\n"
                f"**Kernels:** {kernels}{waits}\n"
                f"**Isolation:** {self._pool.launcher.isolation}\n"
                f"**Code cells run in this thread:** {cells}\n"
                f"**Tokens used:** {prompt_tokens + completion_tokens:,} "
                f"({prompt_tokens:,} prompt, {completion_tokens:,} completion)"
            )
        )

