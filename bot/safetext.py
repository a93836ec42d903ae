"""Untrusted names (uploads, files a kernel wrote) made safe to show anywhere.

A file name can carry a newline (a fake ``saved:`` line in the console, a fake message line
in chat), a terminal escape, or a bidi override that makes ``evil‮txt.exe`` read as
``evilexe.txt``. :func:`shown` escapes every such character visibly (``\\n``, ``\\u202e``),
so what a person, the console or the model sees is the name as it really is.
"""

from __future__ import annotations

import re
import unicodedata

#: Unicode categories escaped: controls, format characters (bidi overrides and isolates,
#: zero-width joiners), line/paragraph separators, surrogates, private use, unassigned.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
MAX_SHOWN_CHARS = 200


def shown(name: str, *, max_chars: int = MAX_SHOWN_CHARS) -> str:
    """``name`` with control, format and bidi characters escaped, cut to ``max_chars`` characters (``…`` marks the cut)."""
    out: list[str] = []
    for ch in name:
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif unicodedata.category(ch) in _ESCAPED_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return cut("".join(out), max_chars)


def cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ``…`` marking the cut.

    A word the cut would split is left out whole when it could hold a path (it has a ``/``):
    the head of a host path left at a cut is no longer recognised by the rewrite that hides
    host paths (:mod:`bot.hostpaths`), so no cut may leave one behind."""
    if len(text) <= limit:
        return text
    head = text[: max(limit - 1, 0)]
    if not text[len(head)].isspace() and (split := _LAST_WORD.search(head)) and "/" in split.group():
        head = head[: split.start()]
    return head + "…"


#: The last word of a text (what a cut may have split).
_LAST_WORD = re.compile(r"\S+\Z")


#: Terminal control sequences whole: CSI (``ESC [`` or 8-bit ``\x9b`` … final byte), OSC, DCS,
#: SOS, PM and APC strings (up to BEL or ST, or the end of the text), then any other escape with
#: the one character it takes.
_SEQUENCES = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?"
)
#: C0 and C1 control characters, ``\n`` and ``\t`` excepted.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def without_terminal_control(text: str) -> str:
    """``text`` without terminal control: CSI, OSC (a clipboard write, a hyperlink, a title), DCS,
    SOS/PM/APC sequences, whole, and every other C0/C1 control character but ``\\n`` and ``\\t``
    (``\\r`` too: it would let later text overwrite a line). What a terminal would obey, nobody
    sees as text either."""
    if not _CONTROLS.search(text):
        return text
    return _CONTROLS.sub("", _SEQUENCES.sub("", text))


def inline_code(text: str) -> str:
    """Untrusted text as one Markdown inline code span: its backticks are shown as ``ˋ``, since a
    run of them could end the span early and let the rest (a link, marks) out as prose."""
    return f"`{text.replace('`', 'ˋ')}`"
