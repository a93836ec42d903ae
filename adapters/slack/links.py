"""What an ``@`` may become in a Slack message (pure, no I/O).

An ``@`` that starts a word gets an invisible word joiner after it, so ``@here`` or
``@channel`` in text never notifies. What a link may become is :mod:`adapters.links`.
"""

from __future__ import annotations

import re

#: Shown between ``@`` (or ``<``) and what follows: invisible, and no mention or link starts there.
WORD_JOINER = "\u2060"

_AT_WORD = re.compile(r"(?<![\w@.+-])@(?=[\w!^])")


def quiet_mentions(text: str) -> str:
    """``text`` with a word joiner after each ``@`` that starts a word (``@here``, ``@channel``,
    ``@someone``): read the same, notify no one. E-mail addresses are left alone."""
    return _AT_WORD.sub("@" + WORD_JOINER, text)
