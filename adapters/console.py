"""A local terminal as a chat platform: one thread, one message per stdin line.

``/attach PATH [PATH ...]`` attaches files to the next message. Replies go to stdout; images
and files are saved under the output folder and announced as ``saved: PATH`` lines. When
stdin is not a terminal there are no prompts and the console exits after answering the last
line at EOF, so scripts can drive it through a pipe.
"""

from __future__ import annotations

import asyncio
import functools
import mimetypes
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TextIO

from bot.dispatcher import Dispatcher
from bot.events import Attachment, InboundMessage, Reply, ThreadKey

CHUNK = 256 * 1024


def _file_fetcher(path: Path) -> AsyncIterator[bytes]:
    async def chunks() -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(path.open, "rb")
        try:
            while block := await asyncio.to_thread(handle.read, CHUNK):
                yield block
        finally:
            await asyncio.to_thread(handle.close)

    return chunks()


class _ConsoleProgress:
    def __init__(self, console: ConsoleAdapter) -> None:
        self._console = console

    async def start(self, status: str) -> None:
        self._console.status(status)

    async def update(self, status: str) -> None:
        self._console.status(status)

    async def finish(self, ok: bool) -> None:
        self._console.status("done" if ok else "failed")


class ConsoleAdapter:
    """Drives the dispatcher from a text stream; also the :class:`~bot.events.Outbox`."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        out_dir: Path,
        thread: str | None = None,
        stdin: TextIO = sys.stdin,
        stdout: TextIO = sys.stdout,
        stderr: TextIO = sys.stderr,
    ) -> None:
        self._dispatcher = dispatcher
        self._out_dir = out_dir
        self.key = ThreadKey("console", "local", "console", thread or time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6])
        self._stdin = stdin
        self._stdout = stdout
        self._stderr = stderr
        self._interactive = stdin.isatty()

    async def run(self) -> None:
        """Read lines until EOF, answering each before reading the next."""
        pending: list[Attachment] = []
        if self._interactive:
            self._say(f"Threadbook console — thread `{self.key.thread}`. Type a question, `/attach FILE`, or `help`. Ctrl-D quits.")
        while True:
            if self._interactive:
                self._stdout.write("you> ")
                self._stdout.flush()
            line = await asyncio.to_thread(self._stdin.readline)
            if not line:
                break
            line = line.strip()
            if not line:
                continue
            if line.startswith("/attach"):
                pending.extend(await asyncio.to_thread(self._attachments, line))
                continue
            message = InboundMessage(
                key=self.key,
                message_id=uuid.uuid4().hex,
                user_id="console",
                user_name="you",
                text=line,
                attachments=tuple(pending),
                is_dm=True,
            )
            pending = []
            await self._dispatcher.handle(message, self)

    def _attachments(self, line: str) -> list[Attachment]:
        """(Blocking: checks the files) the attachments named on an ``/attach`` line."""
        try:
            names = shlex.split(line)[1:]
        except ValueError as exc:  # unbalanced quotes
            self._say(f"not attached: {exc} (quote names with spaces, e.g. /attach \"my file.csv\")")
            return []
        found: list[Attachment] = []
        for raw in names:
            path = Path(raw).expanduser()
            if not path.is_file():
                self._say(f"not attached: {raw} is not a file")
                continue
            mime, _ = mimetypes.guess_type(path.name)
            found.append(Attachment(name=path.name, size=path.stat().st_size, mime=mime, fetch=functools.partial(_file_fetcher, path)))
            self._say(f"attached: {path.name} (goes with your next message)")
        return found

    # Outbox
    async def notify(self, text: str) -> None:
        """Print a notice."""
        self._say(text)

    async def post(self, reply: Reply) -> None:
        """Print the reply text; save images and files under the output folder."""
        self._say(reply.text)
        if not (reply.images or reply.files):
            return
        for image in reply.images:
            self._say(f"saved: {await asyncio.to_thread(self._save, image.filename, image.data)}")
        for file in reply.files:
            self._say(f"saved: {await asyncio.to_thread(self._save, file.name, file.path)}")

    def progress(self) -> _ConsoleProgress:
        """Status lines on stderr (terminal only)."""
        return _ConsoleProgress(self)

    def status(self, text: str) -> None:
        """Show a progress line when a person is watching."""
        if self._interactive:
            print(f"  … {text}", file=self._stderr, flush=True)

    def _say(self, text: str) -> None:
        print(text, file=self._stdout, flush=True)

    def _save(self, name: str, content: bytes | Path) -> Path:
        """(Blocking) write ``content`` (bytes, or a file to copy) under a free name in the output folder."""
        self._out_dir.mkdir(parents=True, exist_ok=True)
        safe = Path(name).name or "output"
        target = self._out_dir / safe
        counter = 1
        while target.exists():
            target = self._out_dir / f"{Path(safe).stem}-{counter}{Path(safe).suffix}"
            counter += 1
        if isinstance(content, Path):
            shutil.copyfile(content, target)
        else:
            target.write_bytes(content)
        return target
