"""The MCP servers' credentials out of every text the bot passes on: to the model, the
chat, the workspace or the log.

A server's URL, header values and stdio environment (:meth:`McpServerSettings.secrets`) are
replaced wherever they appear, so that not even a server that echoes its own token gets it
to the model. Error messages are cut to one line first; where nothing of a server's own
words is needed, only the exception's type is told.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

HIDDEN = "[hidden]"


class Hider:
    """Replaces a set of secret strings (longest first) in texts and bytes."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._encoded = [s.encode() for s in self._secrets]

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def hide(self, text: str) -> str:
        """``text`` with every secret replaced (the same object when none occurs)."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, HIDDEN)
        return text

    def hide_bytes(self, data: bytes) -> bytes:
        """``data`` with every secret's UTF-8 bytes replaced (the same object when none occurs)."""
        for secret in self._encoded:
            if secret in data:
                data = data.replace(secret, HIDDEN.encode())
        return data

    def line(self, text: str, limit: int = 300) -> str:
        """``text`` as one line of at most ``limit`` characters, secrets hidden: before the cut,
        which could leave a secret's beginning that no longer matches (and again after the
        spaces are joined, which could make one)."""
        return self.hide(one_line(self.hide(text), limit))

    def with_more(self, secrets: Iterable[str]) -> Hider:
        """A hider of these secrets and ``secrets``."""
        return Hider([*self._secrets, *secrets])


def one_line(text: str, limit: int = 300) -> str:
    """``text`` as one line of at most ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class HidingFilter(logging.Filter):
    """A log filter that replaces the secrets in each record's message (attached to the
    loggers of the HTTP client the MCP SDK uses, which logs each request's URL)."""

    def __init__(self, hider: Hider) -> None:
        super().__init__()
        self.hider = hider

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.hider:
            return True
        message = record.getMessage()
        hidden = self.hider.hide(message)
        if hidden is not message:
            record.msg, record.args = hidden, None
        return True


#: The loggers that can write a server's URL (the SDK's HTTP client logs every request).
URL_LOGGERS = ("httpx2", "mcp.client.streamable_http", "mcp.client.stdio", "client")
