"""Untrusted names (uploads, files a kernel wrote) made safe to show anywhere.

A file name can carry a newline (a fake ``saved:`` line in the console, a fake message line
in chat), a terminal escape, or a bidi override that makes ``evil‮txt.exe`` read as
``evilexe.txt``. :func:`shown` escapes every such character visibly (``\\n``, ``\\u202e``),
so what a person, the console or the model sees is the name as it really is.
"""

from __future__ import annotations

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
    text = "".join(out)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"
