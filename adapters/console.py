"""A local terminal as a chat platform: one thread, one message per stdin line.

``/attach PATH [PATH ...]`` attaches files to the next message. Replies go to stdout; images
and files are saved under the output folder and announced as ``saved: PATH`` lines. When
stdin is not a terminal there are no prompts and the console exits after answering the last
line at EOF, so scripts can drive it through a pipe.
"""

from __future__ import annotations

import asyncio
import functools
import io
import mimetypes
import os
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TextIO

from bot.dispatcher import Dispatcher
from bot.events import Attachment, InboundMessage, OpenReader, Reply, ThreadKey
from bot.safetext import shown

CHUNK = 256 * 1024
_NAME_MAX_BYTES = 200  # below NAME_MAX (255), leaving room for a "-N" counter
_MAX_NAME_TRIES = 1000


def _disk_name(name: str) -> str:
    """A single, printable file name for ``name``: escaped, no folder separator, not too long."""
    safe = shown(name).replace("/", "_").strip()
    if safe in ("", ".", ".."):
        return "output"
    stem, dot, suffix = safe.rpartition(".")
    if not dot or not stem or len(suffix) > 16:
        stem, suffix = safe, ""
    else:
        suffix = "." + suffix
    while len((stem + suffix).encode()) > _NAME_MAX_BYTES:
        stem = stem[:-1]
    return stem + suffix


def _create_free(dir_fd: int, name: str) -> tuple[str, int]:
    """(Blocking) create a new file named ``name`` (or ``stem-N.suffix``) in ``dir_fd``; returns (name, fd).

    ``O_EXCL`` makes any existing entry, a symlink included, count as taken: nothing is
    overwritten and no link is followed.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    stem, dot, suffix = name.rpartition(".")
    if not dot or not stem:
        stem, suffix = name, ""
    else:
        suffix = "." + suffix
    candidate = name
    for counter in range(1, _MAX_NAME_TRIES + 1):
        try:
            return candidate, os.open(candidate, flags, 0o644, dir_fd=dir_fd)
        except FileExistsError:
            candidate = f"{stem}-{counter}{suffix}"
    candidate = f"{stem}-{uuid.uuid4().hex[:12]}{suffix}"
    return candidate, os.open(candidate, flags, 0o644, dir_fd=dir_fd)


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
                self._say(f"not attached: {shown(raw)} is not a file")
                continue
            mime, _ = mimetypes.guess_type(path.name)
            found.append(Attachment(name=path.name, size=path.stat().st_size, mime=mime, fetch=functools.partial(_file_fetcher, path)))
            self._say(f"attached: {shown(path.name)} (goes with your next message)")
        return found

    def outbox_for(self, key: ThreadKey) -> ConsoleAdapter | None:
        """This console when ``key`` is its thread (a resumed ``--thread``), else None."""
        return self if key == self.key else None

    # Outbox
    async def notify(self, text: str) -> None:
        """Print a notice."""
        self._say(text)

    async def post(self, reply: Reply) -> None:
        """Print the reply text; save images and files under the output folder."""
        self._say(reply.text)
        if not (reply.images or reply.files):
            return
        outputs: list[tuple[str, OpenReader]] = [
            (image.filename, functools.partial(io.BytesIO, image.data)) for image in reply.images
        ]
        outputs += [(file.name, file.open_reader) for file in reply.files]
        for name, open_reader in outputs:
            try:
                saved = await asyncio.to_thread(self._save, name, open_reader)
            except OSError as exc:
                self._say(f"not saved: {shown(name)} ({shown(exc.strerror or type(exc).__name__)})")
                continue
            self._say(f"saved: {saved}")

    def progress(self) -> _ConsoleProgress:
        """Status lines on stderr (terminal only)."""
        return _ConsoleProgress(self)

    def status(self, text: str) -> None:
        """Show a progress line when a person is watching."""
        if self._interactive:
            print(f"  … {text}", file=self._stderr, flush=True)

    def _say(self, text: str) -> None:
        print(text, file=self._stdout, flush=True)

    def _save(self, name: str, open_reader: OpenReader) -> Path:
        """(Blocking) copy what ``open_reader`` gives into a new file of the output folder.

        The file is always new (``O_CREAT | O_EXCL | O_NOFOLLOW``): an existing file, or a link
        planted under the name, is neither overwritten nor followed; the next free name is used.
        The name on disk is the escaped one (:func:`~bot.safetext.shown`), so the printed path is
        one line and the file really has that name.
        """
        self._out_dir.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(self._out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            target, fd = _create_free(dir_fd, _disk_name(name))
            try:
                with open_reader() as source, os.fdopen(fd, "wb", closefd=False) as sink:
                    shutil.copyfileobj(source, sink, CHUNK)
            except BaseException:
                os.unlink(target, dir_fd=dir_fd)
                raise
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)
        return self._out_dir / target
