"""Plain data types shared by the adapters and the bot core.

Adapters turn platform events into :class:`InboundMessage` values and implement
:class:`Outbox` so the core can answer in the same thread. Nothing here imports a
chat SDK, an LLM client or the kernel layer.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import BinaryIO, Literal, Protocol

from bot.safetext import cut

#: Streams an attachment's bytes; the adapter knows how to authenticate.
FetchBytes = Callable[[], AsyncIterator[bytes]]


class FetchRefused(Exception):
    """An adapter would not fetch an attachment (e.g. its link is not the platform's own);
    ``str()`` is the reason, one sentence for the person who attached it."""


#: Whether the message's author is a member of a channel (its ``platform:channel`` key) now, as
#: the platform says (cached briefly); None when it could not be asked.
LookUpMembership = Callable[[str], Awaitable[bool | None]]

#: Looks up the time zone (an IANA name such as ``Europe/Paris``) the message's author set on
#: the platform; None when the platform does not say. Asked only by the commands that need it.
LookUpTimezone = Callable[[], Awaitable[str | None]]


@dataclass(frozen=True, slots=True)
class ThreadKey:
    """Identifies one chat thread, and so one kernel session and one workspace."""

    platform: str
    workspace: str
    channel: str
    thread: str

    def __str__(self) -> str:
        return f"{self.platform}:{self.workspace}:{self.channel}:{self.thread}"

    @classmethod
    def parse(cls, text: str) -> ThreadKey:
        """Invert :meth:`__str__` (``slack:T1:C1:1700000000.000100``)."""
        parts = text.split(":", 3)
        if len(parts) != 4 or not all(parts):
            raise ValueError(f"not a thread key: {text!r}")
        return cls(*parts)

    @property
    def channel_key(self) -> str:
        """The ``platform:channel`` form used by the ``channels:`` config section."""
        return f"{self.platform}:{self.channel}"


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file attached to a chat message, not yet downloaded."""

    name: str
    size: int | None
    mime: str | None
    fetch: FetchBytes


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """One user message, normalised by an adapter."""

    key: ThreadKey
    message_id: str
    user_id: str
    user_name: str
    text: str
    attachments: tuple[Attachment, ...] = ()
    mentioned: bool = True
    is_dm: bool = False
    is_bot: bool = False
    received_at: float = field(default_factory=time.time)
    #: The author's time zone, where the platform can say (Slack's user ``tz``).
    timezone: LookUpTimezone | None = None
    #: A scheduled run of this question (the schedule in words), not a person writing now.
    scheduled: str | None = None
    #: In a direct message: the channel the person was looking at when they wrote, where the
    #: platform says so and that channel has a policy (Slack's agent context).
    viewing: ViewedChannel | None = None
    #: Asks the platform whether the author is a member of a channel (a direct message's
    #: thread that took a viewed channel's policy asks on every turn); None: it cannot say.
    member_of: LookUpMembership | None = None


@dataclass(frozen=True, slots=True)
class ViewedChannel:
    """The channel a person views while writing to the bot in a direct message."""

    #: Its ``platform:channel`` key (the ``channels:`` config section's form).
    key: str
    #: Its name to show (``sales``), or its id when the platform did not say.
    name: str
    #: Whether the platform says the person is a member of it.
    member: bool


@dataclass(frozen=True, slots=True)
class Number:
    """A table cell that is a number: its value (finite) and the text it is shown as."""

    value: float
    text: str


#: A table cell: text, or a :class:`Number`.
Cell = str | Number

Align = Literal["left", "right", "center"]


@dataclass(frozen=True, slots=True)
class Table:
    """A table to show, as data (never markup): a header row and body rows of :data:`Cell` s.

    Made from a Markdown table in an answer (:func:`bot.tables.answer_parts`) or from a
    DataFrame the code showed (``display_dataframe_to_user``, :func:`bot.displays.table_from`).
    Every text in it is untrusted: platforms show it as plain text, never as markup.
    """

    header: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    #: What the table is (a DataFrame's name and size); empty for a table in an answer.
    caption: str = ""
    #: One alignment per column, where the Markdown said.
    aligns: tuple[Align, ...] = ()
    #: The whole table's size when ``rows`` / ``header`` are its beginning (a DataFrame shown by code).
    total_rows: int | None = None
    total_columns: int | None = None
    #: The name of the file in the reply that holds the whole table (empty: none).
    file: str = ""

    @property
    def columns(self) -> int:
        """How many columns the widest row has."""
        return max([len(self.header), *(len(row) for row in self.rows)])


ChartKind = Literal["bar", "line", "area", "pie"]


@dataclass(frozen=True, slots=True)
class Series:
    """One named series of a chart: one value per category (finite; a pie's > 0)."""

    name: str
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Chart:
    """A chart's data beside its picture (:attr:`ImageOut.chart`), read from the kernel's chart
    bundle (:func:`bot.displays.chart_from`); platforms that draw charts themselves use it."""

    kind: ChartKind
    title: str
    categories: tuple[str, ...]
    series: tuple[Series, ...]
    x_label: str = ""
    y_label: str = ""


@dataclass(frozen=True, slots=True)
class ImageOut:
    """An image to post into the thread (PNG unless ``mime`` says otherwise), and the chart's
    data when the picture is a chart the kernel could read."""

    data: bytes
    title: str
    mime: str = "image/png"
    chart: Chart | None = None

    @property
    def filename(self) -> str:
        """A file name for platforms that upload images as files."""
        suffix = {"image/png": ".png", "image/jpeg": ".jpg", "image/svg+xml": ".svg"}.get(self.mime, "")
        return self.title if self.title.endswith(suffix) else f"{self.title}{suffix}"


#: Opens a fresh binary reader positioned at the start of a file to send.
OpenReader = Callable[[], BinaryIO]


@dataclass(frozen=True, slots=True)
class FileOut:
    """A file to upload into the thread: a name safe to show, its size, and a way to read it.

    Adapters never get a path: the core opened the file without following links, and
    ``open_reader`` gives a new reader over that open file (at most ``size`` bytes) each
    time it is called. The reader is the adapter's to close; the file is the core's.
    """

    name: str
    size: int
    open_reader: OpenReader


@dataclass(frozen=True, slots=True)
class Reply:
    """Everything one turn sends back: markdown text, images (charts with their data) and files,
    and the tables the code showed."""

    text: str
    images: tuple[ImageOut, ...] = ()
    files: tuple[FileOut, ...] = ()
    #: Tables the code showed (``display_dataframe_to_user``), each file in ``files`` too.
    tables: tuple[Table, ...] = ()
    ok: bool = True
    #: The model's answer to a question: platforms offer 👍/👎 under it (not under notices or commands).
    rateable: bool = False


#: How much of each output line a running cell's status shows.
LINE_CHARS = 160


@dataclass(frozen=True, slots=True)
class CellProgress:
    """A cell while it runs: which step, what it does, how long it has run, what it printed last."""

    round: int
    #: What the step does, in the model's words when it gave them (else a telling line of code).
    label: str
    code: str
    elapsed_s: float
    #: The latest lines it printed (stdout and stderr; a redrawn progress bar as it is now).
    lines: tuple[str, ...] = ()
    #: How many lines it has ended so far (those before ``lines`` were shown earlier, or skipped).
    ended_lines: int = 0
    #: How many of ``lines`` (the last ones) are not ended yet: a progress bar redrawn in place.
    unfinished_lines: int = 0
    #: ``running``; once the cell ended, ``complete`` (it ran) or ``error`` (an error, a stop, a
    #: lost kernel). Status messages ignore an ended cell with nothing new to show.
    state: Literal["running", "complete", "error"] = "running"

    @property
    def for_status(self) -> bool:
        """Whether a status message shows this: a running cell, or an ended one's last lines
        (an ended cell that printed nothing changes no status)."""
        return self.state == "running" or bool(self.lines)

    def shown_lines(self) -> tuple[str, ...]:
        """``lines`` cut to :data:`LINE_CHARS` each, as a status shows them. Platforms call this
        after the outbound rewrite (host paths) has seen the lines whole."""
        return tuple(cut(line, LINE_CHARS) for line in self.lines)

    def headline(self) -> str:
        """One line: the step, its time and the last line it printed."""
        lines = self.shown_lines()
        last = f" · {lines[-1].strip()}" if lines and lines[-1].strip() else ""
        return f"Running step {self.round} ({elapsed(self.elapsed_s)}): {self.label}{last}"

    def markdown(self) -> str:
        """The status in Markdown: the step and its time, then its latest lines as a code block."""
        head = f"Running step {self.round} ({elapsed(self.elapsed_s)}): {self.label}"
        if not self.lines:
            return head
        body = "\n".join(self.shown_lines())
        longest = max((len(run) for run in _BACKTICKS.findall(body)), default=0)
        fence = "`" * max(3, longest + 1)
        return f"{head}\n{fence}\n{body}\n{fence}"


_BACKTICKS = re.compile(r"`+")


def elapsed(seconds: float) -> str:
    """``7 s``, ``1:05 min``, ``1:02:05 h``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}:{secs:02d} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d} h"


class Progress(Protocol):
    """A live status for a running turn (Slack edits one message, Discord too)."""

    @property
    def shows_drafts(self) -> bool:
        """Whether :meth:`draft` shows anything (else the model's replies are not streamed)."""

    async def start(self, status: str) -> None:
        """Show the first status."""

    async def update(self, status: str) -> None:
        """Replace the status; implementations throttle."""

    async def cell(self, cell: CellProgress) -> None:
        """Show the running cell (sent about once a second while it runs; only the newest
        matters, so implementations throttle and drop older ones)."""

    async def finish(self, ok: bool) -> None:
        """Remove or close the status and mark the turn as done or failed."""

    async def draft(self, text: str) -> None:
        """Show the model's reply as it is written (the whole text so far, each time); a
        platform that cannot stream ignores it, and :meth:`Outbox.post` posts the answer."""

    async def drop_draft(self) -> None:
        """The reply shown by :meth:`draft` is not the answer after all (it runs code): remove it."""


class Outbox(Protocol):
    """Where the core sends what it has to say about one inbound message."""

    async def notify(self, text: str) -> None:
        """Post a short notice (queued, refused file, error) into the thread."""

    async def post(self, reply: Reply) -> None:
        """Post the turn's final reply: text, then images and files."""

    def progress(self) -> Progress:
        """A progress handle for this turn."""


class ThreadReach(Protocol):
    """Reaches a thread with no inbound message to answer (start-up notices, scheduled runs);
    every platform adapter is one."""

    def outbox_for(self, key: ThreadKey) -> Outbox | None:
        """An outbox that posts into thread ``key``; None when ``key`` is not one this adapter serves.

        Its ``notify`` and ``post`` work; there is no user message to mark with reactions.
        """

    async def thread_open(self, key: ThreadKey) -> bool:
        """False when the platform says thread ``key`` (one :meth:`outbox_for` serves) is gone:
        deleted, or archived or locked so that nothing can be posted there. True otherwise,
        also when the platform could not be asked (a failed request is not a gone thread)."""
