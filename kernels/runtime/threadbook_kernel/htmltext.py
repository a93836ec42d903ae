"""Readable plain text from an HTML output (a pandas Styler, ``IPython.display.HTML``).

Runs inside the kernel with the standard library's :mod:`html.parser` only: scripts and
styles are dropped, block elements become line breaks, list items get a dash and table
rows become one line each with ``|`` between cells. Input and output are both capped, so a
huge or crafted page costs bounded time.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

__all__ = ["MAX_HTML_CHARS", "MAX_TEXT_CHARS", "html_to_text"]

#: Only this much of an HTML payload is parsed.
MAX_HTML_CHARS = 1_000_000
#: The text made from it is cut here (the model reads far less).
MAX_TEXT_CHARS = 20_000

#: Elements whose text is never shown (each needs its end tag; ``head``, whose end tag may be
#: left out, is not one: its title, styles and scripts are skipped one by one).
_SKIPPED = frozenset({"script", "style", "title", "template", "noscript", "svg", "math"})
_BLOCKS = frozenset(
    {
        "address",
        "article",
        "aside",
        "blockquote",
        "br",
        "caption",
        "dd",
        "div",
        "dl",
        "dt",
        "figcaption",
        "figure",
        "footer",
        "form",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "header",
        "hr",
        "li",
        "main",
        "nav",
        "ol",
        "p",
        "pre",
        "section",
        "table",
        "tbody",
        "tfoot",
        "thead",
        "ul",
    }
)
_SPACES = re.compile(r"[ \t\r\f\v\n]+")


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.line: list[str] = []
        self.skipping = 0
        self.pre = 0
        self.rows: list[list[str]] = []  # one open row per open <tr> (nested tables)
        self.cell: list[str] | None = None
        self.cells: list[list[str] | None] = []  # the enclosing cell of each open row
        self.row_tables: list[int] = []  # the table depth of each open row
        self.tables = 0
        self.size = 0

    @property
    def full(self) -> bool:
        return self.size >= MAX_TEXT_CHARS

    def _emit(self, text: str) -> None:
        target = self.cell if self.cell is not None else self.line
        target.append(text)
        self.size += len(text)

    def _break(self) -> None:
        if self.cell is not None:
            self.cell.append(" ")
            return
        text = "".join(self.line).strip() if not self.pre else "".join(self.line).rstrip()
        self.line = []
        if text:
            self.lines.append(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED:
            self.skipping += 1
            return
        if self.skipping:
            return
        if tag == "table":
            self.tables += 1
        if tag == "tr":
            self._close_rows(self.tables)  # a <tr> ends the previous row of its table (its </tr> is optional)
            self._break()
            self.cells.append(self.cell)
            self.cell = None
            self.rows.append([])
            self.row_tables.append(self.tables)
        elif tag in ("td", "th") and self.rows:
            if self.row_tables[-1] == self.tables:
                self._close_cell()  # a <td> ends the previous cell of its row (its </td> is optional)
            self.cell = []
        elif tag in _BLOCKS:
            self._break()
            if tag == "li":
                self._emit("- ")
            elif tag == "pre":
                self.pre += 1
        elif tag == "img":
            alt = dict(attrs).get("alt")
            if alt:
                self._emit(f"[image: {alt}]")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self.skipping = max(0, self.skipping - 1)
            return
        if self.skipping:
            return
        if tag in ("td", "th"):
            self._close_cell()
        elif tag == "tr" and self.rows:
            self._close_row()
        elif tag == "table":
            self._close_rows(self.tables)
            self.tables = max(0, self.tables - 1)
            self._break()
        elif tag in _BLOCKS:
            if tag == "pre":
                self.pre = max(0, self.pre - 1)
            self._break()

    def handle_data(self, data: str) -> None:
        if self.skipping or self.full:
            return
        self._emit(data if self.pre else _SPACES.sub(" ", data))

    def _close_cell(self) -> None:
        if self.rows and self.cell is not None:
            self.rows[-1].append(_SPACES.sub(" ", "".join(self.cell)).strip())
            self.cell = None

    def _close_row(self) -> None:
        self._close_cell()
        row = self.rows.pop()
        self.row_tables.pop()
        self.cell = self.cells.pop()
        if any(row):
            self._emit(" | ".join(row))
        self._break()

    def _close_rows(self, depth: int) -> None:
        """Close the open rows of tables at ``depth`` and deeper."""
        while self.rows and self.row_tables[-1] >= depth:
            self._close_row()

    def text(self) -> str:
        self._close_rows(0)
        self._break()
        return "\n".join(self.lines).strip()


def html_to_text(html: str) -> str:
    """Plain text of ``html`` (at most about :data:`MAX_TEXT_CHARS` characters)."""
    parser = _TextParser()
    parser.feed(html[:MAX_HTML_CHARS])
    parser.close()
    text = parser.text()
    if len(text) > MAX_TEXT_CHARS or len(html) > MAX_HTML_CHARS:
        text = text[:MAX_TEXT_CHARS] + "\n… [cut]"
    return text
