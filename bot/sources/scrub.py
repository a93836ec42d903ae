"""Credentials out of every text that leaves the bot (to the model, the chat or the log)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlalchemy.engine import URL

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+")
_USER_AT_HOST = re.compile(r"\b[^\s@/:'\"]+:[^\s@/'\"]+@[^\s/'\"]+")
_SECRET_WORDS = re.compile(r"(?i)\b(password|passwd|pwd|secret|token)\s*[=:]\s*\S+")
#: Secrets shorter than this are not searched for by value (they would match ordinary words).
_MIN_SECRET = 4


def secrets_of(url: URL) -> list[str]:
    """The strings of ``url`` that must never be shown: the password, and the URL itself."""
    found = [url.render_as_string(hide_password=False), url.render_as_string(hide_password=True)]
    if url.password:
        found.append(str(url.password))
    for value in url.query.values():  # e.g. ?password=… or ?sslkey=…
        found.extend([value] if isinstance(value, str) else list(value))
    return [s for s in found if len(s) >= _MIN_SECRET]


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL, ``user:password@host``, ``password=…`` and each of ``secrets`` replaced."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "[hidden]")
    text = _URL.sub("[url hidden]", text)
    text = _USER_AT_HOST.sub("[hidden]", text)
    return _SECRET_WORDS.sub(lambda m: f"{m.group(1)}=[hidden]", text)
