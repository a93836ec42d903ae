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

_SKIPPED = frozenset({"script", "style", "head", "title", "template", "noscript", "svg", "math"})
_BLOCKS = frozenset({
    "address", "article", "aside", "blockquote", "br", "caption", "dd", "div", "dl", "dt", "figcaption",
    "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li", "main", "nav",
    "ol", "p", "pre", "section", "table", "tbody", "tfoot", "thead", "ul",
})  # fmt: skip
_VOID = frozenset({"br", "hr", "img", "input", "meta", "link", "col", "area", "base", "wbr", "source"})
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
            if tag not in _VOID:
                self.skipping += 1
            return
        if self.skipping:
            return
        if tag == "tr":
            self._break()
            self.cells.append(self.cell)
            self.cell = None
            self.rows.append([])
        elif tag in ("td", "th") and self.rows:
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
        if tag in ("td", "th") and self.rows and self.cell is not None:
            self.rows[-1].append(_SPACES.sub(" ", "".join(self.cell)).strip())
            self.cell = None
        elif tag == "tr" and self.rows:
            row = self.rows.pop()
            self.cell = self.cells.pop()
            if any(row):
                self._emit(" | ".join(row))
            self._break()
        elif tag in _BLOCKS:
            if tag == "pre":
                self.pre = max(0, self.pre - 1)
            self._break()

    def handle_data(self, data: str) -> None:
        if self.skipping or self.full:
            return
        self._emit(data if self.pre else _SPACES.sub(" ", data))

    def text(self) -> str:
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
