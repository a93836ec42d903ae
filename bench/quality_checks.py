"""How the quality bench grades a reply: numbers and words from the text, charts and files.

Every question asks the model to end with a line ``ANSWER: <value>``. A check reads that
line (the last one when there are several); when the reply has none, it falls back to the
whole text and the result says so (``answer_line: false``), which is more lenient: the
expected value only has to appear somewhere. Charts and files are graded from the
:class:`~bot.events.Reply` itself, never from what the text claims.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pandas as pd
from PIL import Image

from bot.events import Reply

_ANSWER_LINE = re.compile(r"^[\W_]*answer[\W_]*[:：]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"(?<![\w.])[-−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])[-−]?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Verdict:
    """One reply graded: passed or not, why, and whether the ``ANSWER:`` line was used."""

    passed: bool
    detail: str
    answer_line: bool | None = None  # None: the check does not read the text


@dataclass(frozen=True)
class ReplyFiles:
    """A reply's images and files as bytes (read once, right after the turn)."""

    text: str
    images: tuple[bytes, ...]
    files: dict[str, bytes]

    @classmethod
    def of(cls, reply: Reply) -> ReplyFiles:
        """(Blocking) read the images and files of ``reply``."""
        files: dict[str, bytes] = {}
        for out in reply.files:
            with out.open_reader() as reader:
                files[out.name] = reader.read()
        return cls(text=reply.text, images=tuple(i.data for i in reply.images), files=files)


class Check(Protocol):
    """Grades one reply."""

    def grade(self, reply: ReplyFiles) -> Verdict:
        """The verdict on ``reply``."""
        ...

    def describe(self) -> str:
        """The expected value, for the results table and JSON."""
        ...


def answer_text(text: str) -> tuple[str, bool]:
    """The value of the last ``ANSWER:`` line, cleaned of Markdown; else the whole text. Second: line found."""
    found = _ANSWER_LINE.findall(text)
    if not found:
        return text, False
    return found[-1].replace("**", "").replace("`", "").strip(), True


def numbers_in(text: str) -> list[float]:
    """Every number in ``text`` in order; ``1,234.5`` is one number, ``12%`` is 12."""
    values = []
    for match in _NUMBER.findall(text):
        values.append(float(match.replace(",", "").replace("−", "-")))
    return values


def _close(value: float, expected: float, tolerance: float) -> bool:
    return math.isclose(value, expected, rel_tol=0.0, abs_tol=tolerance + 1e-9)


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s-]", " ", text.lower())).strip()


@dataclass(frozen=True)
class Number:
    """One number, within ``tolerance`` (absolute)."""

    expected: float
    tolerance: float = 0.0

    def grade(self, reply: ReplyFiles) -> Verdict:
        text, line = answer_text(reply.text)
        found = numbers_in(text)
        candidates = found[:1] if line else found  # the ANSWER line's first number, else any number
        ok = any(_close(v, self.expected, self.tolerance) for v in candidates)
        shown = [f"{v:.12g}" for v in candidates]
        got = (shown[0] if line else ", ".join(shown[:8])) if shown else "no number"
        return Verdict(ok, f"expected {self.describe()}, got {got}", line)

    def describe(self) -> str:
        return f"{self.expected:.12g} ± {self.tolerance:g}" if self.tolerance else f"{self.expected:.12g}"


@dataclass(frozen=True)
class Word:
    """A name (a region, a month, an id): one of ``accepted``, as a whole word, case-insensitive."""

    accepted: tuple[str, ...]

    def grade(self, reply: ReplyFiles) -> Verdict:
        text, line = answer_text(reply.text)
        value = f" {_normal(text)} "
        ok = any(f" {_normal(a)} " in value for a in self.accepted)
        return Verdict(ok, f"expected {self.describe()}, got {text[:60]!r}", line)

    def describe(self) -> str:
        return " / ".join(self.accepted)


@dataclass(frozen=True)
class Words:
    """Several names in this order (e.g. a top 3), separated by anything."""

    expected: tuple[str, ...]

    def grade(self, reply: ReplyFiles) -> Verdict:
        text, line = answer_text(reply.text)
        tokens = _normal(text).split()
        wanted = [_normal(w) for w in self.expected]
        positions = [tokens.index(w) if w in tokens else -1 for w in wanted]
        ok = all(p >= 0 for p in positions) and positions == sorted(positions)
        return Verdict(ok, f"expected {self.describe()}, got {text[:60]!r}", line)

    def describe(self) -> str:
        return ", ".join(self.expected)


@dataclass(frozen=True)
class Chart:
    """At least ``count`` images came back, each a readable image at least 200 px wide."""

    count: int = 1

    def grade(self, reply: ReplyFiles) -> Verdict:
        sizes = []
        for data in reply.images:
            try:
                with Image.open(io.BytesIO(data)) as image:
                    sizes.append(image.size)
            except Exception as exc:
                return Verdict(False, f"an image could not be read: {type(exc).__name__}")
        ok = len(sizes) >= self.count and all(w >= 200 and h >= 100 for w, h in sizes)
        return Verdict(ok, f"expected {self.describe()}, got {len(sizes)} image(s) {sizes}")

    def describe(self) -> str:
        return f"{self.count} chart image(s)"


TableCheck = Callable[[pd.DataFrame], str | None]  # None when the table is right, else what is wrong


@dataclass(frozen=True)
class SavedFile:
    """A file named ``name`` came back and ``check`` accepts its table (CSV or XLSX)."""

    name: str
    check: TableCheck
    what: str = ""

    def grade(self, reply: ReplyFiles) -> Verdict:
        data = next((content for n, content in reply.files.items() if n.lower() == self.name.lower()), None)
        if data is None:
            return Verdict(False, f"no file {self.name} came back (got {sorted(reply.files)})")
        try:
            if self.name.lower().endswith((".xlsx", ".xlsm")):
                frame = pd.read_excel(io.BytesIO(data))
            else:
                frame = pd.read_csv(io.BytesIO(data))
        except Exception as exc:
            return Verdict(False, f"{self.name} could not be read: {type(exc).__name__}: {exc}"[:200])
        frame.columns = [str(c).strip().lower() for c in frame.columns]
        problem = self.check(frame)
        return Verdict(problem is None, problem or f"{self.name} is right")

    def describe(self) -> str:
        return f"file {self.name}" + (f" ({self.what})" if self.what else "")


def column_values(
    frame: pd.DataFrame, key: str, value: str, expected: dict[str, float], *, tolerance: float, ordered: bool
) -> str | None:
    """None when ``frame`` maps column ``key`` to column ``value`` exactly as ``expected``."""
    missing = [c for c in (key, value) if c not in frame.columns]
    if missing:
        return f"missing column(s) {missing}; columns are {list(frame.columns)}"
    got = [(str(k), v) for k, v in zip(frame[key], frame[value])]
    keys = [k for k, _ in got]
    if (keys != list(expected)) if ordered else (sorted(keys) != sorted(expected)):
        return f"rows {[k for k, _ in got][:10]} instead of {list(expected)[:10]}"
    for k, v in got:
        try:
            number = float(v)
        except (TypeError, ValueError):
            return f"{value} of {k} is {v!r}, not a number"
        if not _close(number, expected[k], tolerance):
            return f"{value} of {k} is {number}, expected {expected[k]}"
    return None


@dataclass(frozen=True)
class AllOf:
    """Every one of ``checks`` passes (e.g. a chart and a number)."""

    checks: Sequence[Check] = field(default_factory=tuple)

    def grade(self, reply: ReplyFiles) -> Verdict:
        verdicts = [c.grade(reply) for c in self.checks]
        lines = [v.answer_line for v in verdicts if v.answer_line is not None]
        return Verdict(
            all(v.passed for v in verdicts), "; ".join(v.detail for v in verdicts), all(lines) if lines else None
        )

    def describe(self) -> str:
        return " and ".join(c.describe() for c in self.checks)
