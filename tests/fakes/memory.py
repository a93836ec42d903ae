"""An in-memory chat platform for tests: pushes messages into the dispatcher, records replies.

Like errbot's test backend: ``chat.say("...")`` runs one message through the real dispatcher
and returns the :class:`MemoryOutbox` that recorded what the bot said back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import itertools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.dispatcher import Dispatcher
from bot.events import Attachment, CellProgress, FileOut, InboundMessage, Reply, ThreadKey


def _uploaded(file: FileOut) -> FileOut:
    """(Blocking) ``file`` as it arrived: its bytes, readable again at any time."""
    with file.open_reader() as reader:
        data = reader.read()
    return FileOut(name=file.name, size=len(data), open_reader=lambda: io.BytesIO(data))


@dataclass
class MemoryProgress:
    """Records progress calls as (event, text) pairs."""

    log: list[tuple[str, str]]
    shows_drafts: bool = True

    async def start(self, status: str) -> None:
        self.log.append(("start", status))

    async def update(self, status: str) -> None:
        self.log.append(("update", status))

    async def cell(self, cell: CellProgress) -> None:
        self.log.append(("cell", cell.markdown()))

    async def finish(self, ok: bool) -> None:
        self.log.append(("finish", "ok" if ok else "failed"))

    async def draft(self, text: str) -> None:
        self.log.append(("draft", text))

    async def drop_draft(self) -> None:
        self.log.append(("drop_draft", ""))


@dataclass
class MemoryOutbox:
    """Everything the bot said about one inbound message."""

    notices: list[str] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    progress_log: list[tuple[str, str]] = field(default_factory=list)

    async def notify(self, text: str) -> None:
        self.notices.append(text)

    async def post(self, reply: Reply) -> None:
        # Like a platform, take the files' bytes now: the core closes them once posted.
        files = tuple([await asyncio.to_thread(_uploaded, file) for file in reply.files])
        self.replies.append(dataclasses.replace(reply, files=files))

    def progress(self) -> MemoryProgress:
        return MemoryProgress(self.progress_log)

    @property
    def reply(self) -> Reply:
        """The single final reply (fails the test if there is not exactly one)."""
        assert len(self.replies) == 1, f"expected one reply, got {self.replies!r} (notices {self.notices!r})"
        return self.replies[0]


def bytes_attachment(name: str, data: bytes, *, declared_size: int | None = -1, mime: str | None = None) -> Attachment:
    """An attachment whose bytes come from memory (``declared_size=-1`` means the real size)."""

    async def fetch() -> AsyncIterator[bytes]:
        for start in range(0, len(data), 65536):
            yield data[start : start + 65536]

    size = len(data) if declared_size == -1 else declared_size
    return Attachment(name=name, size=size, mime=mime, fetch=fetch)


class MemoryChat:
    """A fake platform in front of a real dispatcher."""

    _ids = itertools.count(1)

    def __init__(
        self, dispatcher: Dispatcher, *, platform: str = "test", workspace: str = "W1", channel: str = "C1"
    ) -> None:
        self.dispatcher = dispatcher
        self.platform = platform
        self.workspace = workspace
        self.channel = channel

    def key(self, thread: str = "t1") -> ThreadKey:
        return ThreadKey(self.platform, self.workspace, self.channel, thread)

    def message(
        self,
        text: str,
        *,
        thread: str = "t1",
        user: str = "U1",
        attachments: Sequence[Attachment] = (),
        message_id: str | None = None,
        **extra: Any,
    ) -> InboundMessage:
        return InboundMessage(
            key=self.key(thread),
            message_id=message_id or f"m{next(self._ids)}",
            user_id=user,
            user_name=user.lower(),
            text=text,
            attachments=tuple(attachments),
            **extra,
        )

    async def say(self, text: str, **kwargs: Any) -> MemoryOutbox:
        """Send one message and wait for the turn to finish."""
        outbox = MemoryOutbox()
        await self.dispatcher.handle(self.message(text, **kwargs), outbox)
        return outbox

    async def send(self, message: InboundMessage) -> MemoryOutbox:
        """Send a prepared message and wait for the turn to finish."""
        outbox = MemoryOutbox()
        await self.dispatcher.handle(message, outbox)
        return outbox
