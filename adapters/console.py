"""A local terminal as a chat platform: one thread, one message per stdin line.

``/attach PATH [PATH ...]`` attaches files to the next message. A line holding only three double
quotes opens a block and the next such line closes it: the lines between are one message (a pasted
code block). Replies go to stdout; images and files are saved under the output folder and
announced as ``saved: PATH`` lines. When stdin is not a terminal there are no prompts and the
console exits after answering the last line at EOF, so scripts can drive it through a pipe.

On a terminal (:mod:`adapters.console_terminal`) lines are edited and remembered per thread,
answers are rendered Markdown, each step's code and output show while it runs (``quiet``: one
line per step), and the ``--thread`` name to resume is printed on exit; ``thread_folders``
saves each thread's files in a folder of its own. Through a pipe everything is plain text, terminal control sequences left out as on a terminal.

Ctrl-C during a turn stops it (as the Stop button does); Ctrl-C again, Ctrl-C at the prompt,
or Ctrl-D quits. Input is read through the event loop (prompt_toolkit on a terminal,
``add_reader`` on a pipe), never by a thread blocked in ``readline``, so quitting never waits
for Enter.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import io
import logging
import mimetypes
import os
import select
import shlex
import shutil
import signal
import stat
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TextIO

from adapters.base import PlatformAdapter
from adapters.console_terminal import Terminal
from adapters.tables import render_table
from bot.dispatcher import Dispatcher
from bot.events import Attachment, CellProgress, InboundMessage, OpenReader, Reply, ThreadKey
from bot.safetext import shown, without_terminal_control
from bot.tables import hidden_note

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
_NAME_MAX_BYTES = 200  # below NAME_MAX (255), leaving room for a "-N" counter
_MAX_NAME_TRIES = 1000
BLOCK_FENCE = '"""'
#: What was typed in a thread, beside its saved files (terminal only).
HISTORY_NAME = ".history"
HELP_LINE = (
    'Type a question, `/attach FILE`, or `help`; paste several lines between two lines of just `"""`. '
    "Ctrl-C stops an answer; Ctrl-C at the prompt or Ctrl-D quits."
)
#: The one person at the console, as the core knows them.
USER_ID = "console"


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


def _pollable_fd(stream: TextIO) -> int | None:
    """The descriptor of ``stream`` when the event loop can wait on it (terminal, pipe, socket)."""
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None
    if os.isatty(fd) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return fd
    return None  # a regular file or /dev/null: epoll refuses them, and a read never waits anyway


class _LineReader:
    """Lines of a text stream, read without blocking the event loop.

    A terminal or pipe is read with ``loop.add_reader`` and ``os.read``, so a pending read is
    cancelled at once (Ctrl-C at the prompt quits without waiting for Enter). Anything else (a
    regular file, an in-memory stream) is read in a worker thread, where a read never waits.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._fd = _pollable_fd(stream)
        encoding = getattr(stream, "encoding", None) or "utf-8"
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._buffer = ""
        self._eof = False

    async def readline(self) -> str:
        """The next line with its newline; the last, unterminated piece at EOF; then ""."""
        if self._fd is None:
            return await asyncio.to_thread(self._stream.readline)
        while "\n" not in self._buffer and not self._eof:
            await self._readable(self._fd)
            chunk = os.read(self._fd, 65536)  # readable: returns at once (a line, on a terminal)
            self._eof = not chunk
            self._buffer += self._decoder.decode(chunk, final=self._eof)
        line, newline, self._buffer = self._buffer.partition("\n")
        return line + newline

    def pending(self) -> bool:
        """True when more input is already there (a paste in progress): no prompt is needed."""
        if self._fd is None:
            return False
        if "\n" in self._buffer or self._eof:
            return True
        return bool(select.select([self._fd], [], [], 0)[0])

    @staticmethod
    async def _readable(fd: int) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, wake)
        try:
            await ready
        finally:
            loop.remove_reader(fd)


class _ConsoleProgress:
    shows_drafts = False

    def __init__(self, console: ConsoleAdapter) -> None:
        self._console = console

    async def start(self, status: str) -> None:
        self._console.new_turn()
        self._console.status(status)

    async def update(self, status: str) -> None:
        self._console.status(status)

    async def cell(self, cell: CellProgress) -> None:
        self._console.cell(cell)

    async def finish(self, ok: bool) -> None:
        self._console.status("done" if ok else "stopped" if self._console.stopping else "failed")

    async def draft(self, text: str) -> None:
        """The console prints the answer once it is whole."""

    async def drop_draft(self) -> None:
        """Nothing was shown."""


class ConsoleAdapter(PlatformAdapter):
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
        log_path: Path | None = None,
        quiet: bool = False,
        thread_folders: bool = False,
    ) -> None:
        """``quiet``: on a terminal, one line per step instead of its code and output;
        ``thread_folders``: files go to a folder of the thread's own under ``out_dir``."""
        super().__init__(dispatcher, label="console")
        self.key = ThreadKey(
            "console", "local", "console", thread or time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        )
        self._out_dir = out_dir / _disk_name(self.key.thread) if thread_folders else out_dir
        self._stdin = stdin
        self._stdout = stdout
        self._stderr = stderr
        self._interactive = stdin.isatty()
        self._terminal = (
            Terminal(stdin, stdout, history=self._out_dir / HISTORY_NAME, show_code=not quiet)
            if self._interactive
            else None
        )
        self._log_path = log_path
        self._quit = asyncio.Event()
        self._quitting = False  # the person quit: nothing more is printed
        self._turn: asyncio.Future[None] | None = None
        self._stopping = False

    async def run(self) -> None:
        """Answer messages until EOF (Ctrl-D) or a quit (Ctrl-C at the prompt, or twice in a turn)."""
        reader = _LineReader(self._stdin)
        if self._terminal is not None:
            with self._terminal.attached(), self._interrupts():
                self._say(f"Threadbook console — thread {self.key.thread}. {HELP_LINE}")
                if self._log_path is not None:
                    self._say(f"Log: {self._log_path}")
                await self._converse(reader)
            self._say(f"Resume this thread with: python -m bot console --thread {shlex.quote(self.key.thread)}")
            return
        if self._log_path is not None:  # input from a pipe, answers on a terminal
            print(f"Log: {self._log_path}", file=self._stderr, flush=True)
        with self._interrupts():
            await self._converse(reader)

    async def _converse(self, reader: _LineReader) -> None:
        pending: list[Attachment] = []
        while True:
            line = await self._read(reader, "you> ")
            if line is None:
                return
            if line.strip() == BLOCK_FENCE:
                block: list[str] = []
                while (more := await self._read(reader, "...> ")) is not None and more.strip() != BLOCK_FENCE:
                    block.append(more)
                if self._quit.is_set():
                    return
                text = "\n".join(block).strip("\n")  # EOF inside a block sends what came
            else:
                text = line.strip()
                if text.startswith("/attach"):
                    pending.extend(await asyncio.to_thread(self._attachments, text))
                    continue
            if not text.strip():
                continue
            message = InboundMessage(
                key=self.key,
                message_id=uuid.uuid4().hex,
                user_id=USER_ID,
                user_name="you",
                text=text,
                attachments=tuple(pending),
                is_dm=True,
            )
            pending = []
            self._stopping = False
            self._turn = self.dispatch(message, self, name=f"console turn {message.message_id}")
            try:
                if not await self._unless_quit(self._turn):
                    return
            finally:
                self._turn = None

    async def _stop_intake(self) -> None:
        """Read no more input (the console's conversation ends after the turn under way)."""
        self._quit.set()

    async def _disconnect(self) -> None:
        """Nothing to close: stdin and stdout stay the process's."""

    async def _read(self, reader: _LineReader, prompt: str) -> str | None:
        """The next line without its newline; None at EOF or when the person quits."""
        if self._terminal is not None:
            return await self._terminal.read(prompt)
        if self._interactive and not reader.pending():
            self._stdout.write(prompt)
            self._stdout.flush()
        read = asyncio.ensure_future(reader.readline())
        if not await self._unless_quit(read):
            return None
        line = read.result()
        return line.rstrip("\r\n") if line else None

    async def _unless_quit(self, task: asyncio.Future[Any]) -> bool:
        """Wait for ``task``; True when it finished, False when the person quit first (it is cancelled)."""
        quit_wait = asyncio.ensure_future(self._quit.wait())
        try:
            if not self._quit.is_set():
                await asyncio.wait({task, quit_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            quit_wait.cancel()
            if not task.done() or self._quit.is_set():
                # A turn cancelled here says nothing (notify is silent once quitting) and
                # clears its in-flight mark: the person chose to leave, no restart notice is due.
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return not self._quit.is_set()

    @contextlib.contextmanager
    def _interrupts(self) -> Iterator[None]:
        """Route SIGINT to :meth:`_interrupt` while the console runs (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGINT)
        loop.add_signal_handler(signal.SIGINT, self._interrupt)
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            # Back to asyncio.run's own handler: a Ctrl-C during shutdown cancels it cleanly.
            signal.signal(signal.SIGINT, previous)

    def _interrupt(self) -> None:
        """Ctrl-C: the first during a turn stops it (the Stop button); any other quits."""
        if self._turn is not None and not self._turn.done() and not self._stopping:
            self._stopping = True
            self.status("stopping this answer (Ctrl-C again quits)")
            self._tasks.spawn(self._stop_turn(), name="console stop")
            return
        self._quitting = True
        self._quit.set()

    async def _stop_turn(self) -> None:
        try:
            await self._dispatcher.stop(self.key, user_id=USER_ID)
        except Exception:
            log.exception("could not stop the console's turn")

    def _attachments(self, line: str) -> list[Attachment]:
        """(Blocking: checks the files) the attachments named on an ``/attach`` line."""
        try:
            names = shlex.split(line)[1:]
        except ValueError as exc:  # unbalanced quotes
            self._say(f'not attached: {exc} (quote names with spaces, e.g. /attach "my file.csv")')
            return []
        found: list[Attachment] = []
        for raw in names:
            path = Path(raw).expanduser()
            if not path.is_file():
                self._say(f"not attached: {shown(raw)} is not a file")
                continue
            mime, _ = mimetypes.guess_type(path.name)
            found.append(
                Attachment(
                    name=path.name, size=path.stat().st_size, mime=mime, fetch=functools.partial(_file_fetcher, path)
                )
            )
            self._say(f"attached: {shown(path.name)} (goes with your next message)")
        return found

    @property
    def stopping(self) -> bool:
        """True once Ctrl-C asked the running turn to stop."""
        return self._stopping

    def outbox_for(self, key: ThreadKey) -> ConsoleAdapter | None:
        """This console when ``key`` is its thread (a resumed ``--thread``), else None."""
        return self if key == self.key else None

    async def thread_open(self, key: ThreadKey) -> bool:
        """A console thread is open while the console runs."""
        return True

    # Outbox
    async def notify(self, text: str) -> None:
        """Print a notice (nothing once the person quit)."""
        if self._quitting:
            return
        if self._terminal is not None:
            self._terminal.markdown(text)
        else:
            self._say(text)

    async def post(self, reply: Reply) -> None:
        """Print the tables the code showed and the reply text; save images and files under the
        output folder (the whole of each table among them, as CSV)."""
        if self._quitting:
            return
        for table in reply.tables:
            if self._terminal is not None:
                self._terminal.table(table)
            else:
                note = hidden_note(table)
                self._say("\n".join([table.caption, *render_table(table), *([note] if note else [])]))
        if self._terminal is not None:
            self._terminal.markdown(reply.text)
        else:
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
        if self._terminal is not None and not self._quitting:
            self._terminal.status(text)

    def new_turn(self) -> None:
        """A turn starts (its steps are shown from step 1 again)."""
        if self._terminal is not None:
            self._terminal.new_turn()

    def cell(self, cell: CellProgress) -> None:
        """Show the running cell (its code and output as it runs) when a person is watching."""
        if self._terminal is not None and not self._quitting:
            self._terminal.cell(cell)

    def _say(self, text: str) -> None:
        if self._terminal is not None:
            self._terminal.say(text)
        else:
            print(without_terminal_control(text), file=self._stdout, flush=True)

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
