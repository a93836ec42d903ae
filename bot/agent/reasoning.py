"""Reasoning is never shown: the part of a reply's text that is the answer.

Servers that parse a reasoning model's thinking put it in a field of its own
(``reasoning_content`` on chat completions, ``reasoning`` items on the Responses API), which
the readers of both wires never take as text. A server without a reasoning parser leaves it in
the text as a leading ``<think>…</think>`` block (Qwen3, DeepSeek-R1 distills): that block is
cut here, and while it is still open (a reply streaming in) nothing of the text is shown.
"""

from __future__ import annotations

import re

_OPENS = re.compile(r"\s*<think>")
_CLOSE = "</think>"


def visible_text(text: str) -> str:
    """``text`` without a leading ``<think>`` block; ``""`` while that block is still open."""
    if _OPENS.match(text) is None:
        return text
    end = text.find(_CLOSE)
    return "" if end < 0 else text[end + len(_CLOSE) :].lstrip()
