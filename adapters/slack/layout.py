"""One reply as Slack messages, native blocks where Slack draws them (pure, no I/O).

The answer's Markdown is cut into prose and tables (:func:`bot.tables.answer_parts`). Each table
Slack draws natively becomes one message: the prose just before it (its last part) in a section,
then the ``table`` or ``data_table`` block (:mod:`adapters.slack.blocks`), then, for a table cut
to Slack's limits, a line saying how much is not shown — the whole table comes along as a CSV
file. The prose after the last table ends the answer as before: the last message, which also
carries the charts Slack draws (``data_visualization``), the 👍/👎 and the uploaded pictures and
files. Tables the code showed (``display_dataframe_to_user``) come first, one data table each.

Every message with a native block holds one kind of native block only, so a refusal names the
kind (:class:`NativeSupport`), and carries its fallback: the same content as today's text (the
table as an aligned code block). A table itself is the last block of its message but for that
line, in case Slack shows tables below a message's text.
"""

from __future__ import annotations

import functools
import io
import logging
from dataclasses import dataclass, field
from typing import Any

from adapters.slack.blocks import CHARTS_PER_MESSAGE, NativeKind, NativeTable, chart_block, table_block
from adapters.slack.render import Mrkdwn, mrkdwn, mrkdwn_chunks
from adapters.tables import aligned
from bot.events import FileOut, ImageOut, Reply, Table
from bot.safetext import inline_code
from bot.tables import answer_parts, to_csv

log = logging.getLogger("threadbook.slack")

#: A section block holds 3,000 characters.
SECTION_LIMIT = 2900
#: Slack's answers that mean "this block is not accepted" (out of schema, or not rolled out here).
BLOCK_REFUSALS = frozenset({"invalid_blocks", "invalid_blocks_format", "only_one_table_allowed"})


@dataclass(slots=True)
class NativeSupport:
    """Which native block kinds Slack refused (one per adapter, for the process's life): a kind
    refused once is not sent again, the answer goes out in its fallback form."""

    refused: dict[str, str] = field(default_factory=dict)

    def allows(self, kind: str) -> bool:
        """Whether ``kind`` may be sent."""
        return kind not in self.refused

    def refuse(self, kind: str, error: str) -> None:
        """Remember that Slack refused ``kind`` (``error``: its answer)."""
        if kind not in self.refused:
            log.warning("Slack refused %s blocks (%s): sent as text from now on", kind, error)
            self.refused[kind] = error


@dataclass(frozen=True, slots=True)
class Post:
    """One message: its text, its blocks (empty: the text alone), the native kind among them,
    and what to post instead when Slack refuses that kind (rendered text, made to fit a section
    block, or Markdown rendered only then: :meth:`fallback_texts`)."""

    text: Mrkdwn
    blocks: tuple[dict[str, Any], ...] = ()
    native: NativeKind | None = None
    fallback: tuple[Mrkdwn | str, ...] = ()

    def fallback_texts(self, *, last: int | None = None) -> list[Mrkdwn]:
        """The fallback as messages to post, the last one of at most ``last`` characters when
        given (a section block's, under buttons)."""
        texts: list[Mrkdwn] = []
        for number, item in enumerate(self.fallback, 1):
            end = last if number == len(self.fallback) else None
            texts += [item] if isinstance(item, Mrkdwn) else mrkdwn_chunks(item, last=end)
        return texts


@dataclass(frozen=True, slots=True)
class TablePiece:
    """A table of the answer that Slack draws, its block, and the file holding it whole when cut."""

    table: Table
    native: NativeTable
    csv: FileOut | None
    note: str


#: The answer as laid out: prose (Markdown) and tables Slack draws.
Piece = str | TablePiece


@dataclass(slots=True)
class Layout:
    """Messages to post, in order, then the last one: its text (a section), its chart blocks and
    the 👍/👎, shared with the reply's pictures and files (and the CSVs of cut tables)."""

    posts: list[Post]
    last: Mrkdwn | None
    charts: list[dict[str, Any]]
    files: list[FileOut]

    def final_blocks(self, feedback: list[dict[str, Any]], *, charts: bool = True) -> list[dict[str, Any]]:
        """The last message's blocks (without the charts when ``charts`` is False: refused)."""
        text = [section(self.last)] if self.last is not None else []
        return [*text, *(self.charts if charts else []), *feedback]


def section(text: Mrkdwn) -> dict[str, Any]:
    """A section block showing rendered text."""
    return {"type": "section", "text": {"type": "mrkdwn", "text": text.text}}


def pieces(text: str, support: NativeSupport) -> list[Piece]:
    """``text`` (Markdown) as prose and the tables Slack draws; a table of a refused kind stays
    in the prose (shown as an aligned code block)."""
    out: list[Piece] = []
    prose: list[str] = []
    number = 0
    for part in answer_parts(text):
        if isinstance(part, str):
            prose.append(part)
            continue
        native = table_block(part)
        if native.kind == "table" and not support.allows("table") and support.allows("data_table"):
            native = table_block(part, data_table=True)  # a workspace without table blocks may have data tables
        if not support.allows(native.kind):
            prose.append(_as_code(part))
            continue
        if prose:
            out.append("\n".join(prose))
            prose = []
        number += 1
        csv, note = None, ""
        if native.cut:
            data = to_csv(part)
            csv = FileOut(name=f"table-{number}.csv", size=len(data), open_reader=functools.partial(io.BytesIO, data))
            note = f"_{_not_shown(native)}; the whole table is attached as `{csv.name}`._"
        out.append(TablePiece(part, native, csv, note))
    if prose:
        out.append("\n".join(prose))
    return out


def lay_out(
    answer: list[Piece], reply: Reply, support: NativeSupport, feedback: list[dict[str, Any]]
) -> tuple[Layout, list[dict[str, Any]]]:
    """The messages for ``answer`` (pieces of the reply's text) and the rest of ``reply`` (the
    tables the code showed first, the charts last), and the 👍/👎 left over for whoever posts
    the last message (empty when it went onto the last table's message: the answer ends with a
    table and has nothing to share)."""
    posts = [_shown_table(table, support) for table in reply.tables]
    files: list[FileOut] = []
    pending: list[Mrkdwn] = []
    for piece in answer:
        if isinstance(piece, str):
            # Its last chunk goes into a section block: before a table, or at the end.
            pending += mrkdwn_chunks(piece, last=SECTION_LIMIT) if piece.strip() else []
            continue
        lead = pending.pop() if pending else None
        posts += [Post(chunk) for chunk in pending]
        pending = []
        posts.append(_answer_table(piece, lead))
        if piece.csv is not None:
            files.append(piece.csv)
    tail = pending.pop() if pending else None
    posts += [Post(chunk) for chunk in pending]
    charts = _chart_blocks(reply.images, support)
    for start in range(CHARTS_PER_MESSAGE, len(charts), CHARTS_PER_MESSAGE):
        group = tuple(charts[start : start + CHARTS_PER_MESSAGE])
        posts.append(Post(mrkdwn("Charts"), group, "data_visualization"))
    layout = Layout(posts, tail, charts[:CHARTS_PER_MESSAGE], files)
    shares = bool(reply.images or reply.files or files or layout.charts)
    if layout.last is None and not shares and posts and posts[-1].blocks and feedback:
        end = posts[-1]
        posts[-1] = Post(end.text, (*end.blocks, *feedback), end.native, end.fallback)
        return layout, []
    return layout, feedback


def _answer_table(piece: TablePiece, lead: Mrkdwn | None) -> Post:
    """A table of the answer: the prose before it, the table, how much is not shown."""
    blocks = [*([section(lead)] if lead is not None else []), piece.native.block]
    if piece.note:
        blocks.append(section(mrkdwn(piece.note)))
    table = _as_code(piece.table) + (f"\n\n{piece.note}" if piece.note else "")
    fallback: list[Mrkdwn | str] = [*([lead] if lead is not None else []), table]
    text = lead if lead is not None else mrkdwn(_summary(piece.table))
    return Post(text, tuple(blocks), piece.native.kind, tuple(fallback))


def _shown_table(table: Table, support: NativeSupport) -> Post:
    """A table the code showed: a data table captioned with the frame's name and size, and the
    file that holds it whole."""
    caption = f"📋 {inline_code(table.caption)}"
    native = table_block(table, caption=table.caption, data_table=True)
    note = ""
    if native.cut:
        where = f"; the whole table is attached as {inline_code(table.file)}" if table.file else ""
        note = f"_{_not_shown(native)}{where}._"
    fallback = f"{caption}\n\n{_as_code(table)}" + (f"\n\n{note}" if note else "")
    if not support.allows(native.kind):
        texts = tuple(mrkdwn_chunks(fallback))
        return Post(texts[0], (), None, texts)
    blocks = [native.block, *([section(mrkdwn(note))] if note else [])]
    return Post(mrkdwn(caption), tuple(blocks), native.kind, (fallback,))


def _chart_blocks(images: tuple[ImageOut, ...], support: NativeSupport) -> list[dict[str, Any]]:
    if not support.allows("data_visualization"):
        return []
    return [block for image in images if image.chart is not None and (block := chart_block(image.chart)) is not None]


def _not_shown(native: NativeTable) -> str:
    parts = []
    if native.hidden_rows:
        parts.append(f"{native.hidden_rows:,} more row{'s' if native.hidden_rows != 1 else ''}")
    if native.hidden_columns:
        parts.append(f"{native.hidden_columns:,} more column{'s' if native.hidden_columns != 1 else ''}")
    said = [f"{' and '.join(parts)} not shown"] if parts else []
    if native.cut_cells:
        said.append(f"{native.cut_cells:,} cell{'s' if native.cut_cells != 1 else ''} cut short")
    return ", ".join(said)


def _summary(table: Table) -> str:
    return f"A table of {len(table.rows):,} rows and {table.columns} columns."


def _as_code(table: Table) -> str:
    """``table`` as the aligned code block of its fallback, in Markdown: never as a Markdown table
    read again (a cell with a backtick can make that prose, its links and marks live)."""
    return "\n".join(aligned(table))
