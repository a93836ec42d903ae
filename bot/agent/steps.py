"""The label a running step gets in the status: what it does, in few words.

The model's own words come first: the text it sent with the tool call, else a comment on the
first line of the code. Without them, the first line of code that does something telling:
not an import, a magic, a comment or a setting such as ``warnings.filterwarnings(...)``.
"""

from __future__ import annotations

import re

from bot.safetext import cut
from bot.sources.cell import code_span

LABEL_CHARS = 80
_COMMENT = re.compile(r"^#+\s*")
_DULL = re.compile(
    r"^(import\s|from\s+\S+\s+import\s|%|!|#|@|"
    r"(warnings|pd\.set_option|np\.set_printoptions|plt\.style|plt\.rcParams|matplotlib\.use|sns\.set)\b)"
)
_EMPHASIS = re.compile(r"\*+|__")
_SENTENCE_END = re.compile(r"(?<=[.!?:])\s")


def step_label(code: str, said: str | None = None) -> str:
    """What the step running ``code`` does; ``said``: the model's text sent with the code."""
    if said and (words := _first_sentence(said)):
        return words
    lines = [line.strip() for line in code.splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].startswith("#") and (comment := _COMMENT.sub("", lines[0]).strip()) and not comment.startswith("!"):
        return _short(comment)
    telling = next((line for line in lines if not _DULL.match(line)), lines[0])
    return code_span(telling, LABEL_CHARS)


def _first_sentence(text: str) -> str:
    """The first line (or sentence) of ``text`` with Markdown emphasis left out, shortened."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("```")), "")
    line = _EMPHASIS.sub("", line).strip("_# ").strip()
    line = _SENTENCE_END.split(line, maxsplit=1)[0].rstrip(":")
    return _short(line)


def _short(text: str, limit: int = LABEL_CHARS) -> str:
    return cut(text, limit)
