"""Log lines as text or JSON, each carrying the thread and turn it was logged for.

The dispatcher marks the message it is handling (:func:`enter_turn`, :func:`leave_turn`)
in two context variables; everything logged while that message is handled (the turn, the
agent, the kernel calls it awaits, and tasks it starts, which copy the context) is stamped
with the thread key and the turn id (the inbound message id). ``logging.format: json``
writes one JSON object a line (docs/operations.md)::

    {"time": "2025-01-31T12:00:00.123Z", "level": "INFO", "logger": "bot.turn",
     "message": "turn in …: answer after 1 cells, 2.0s", "thread": "slack:T1:C1:17.1",
     "turn": "17.2"}

``exception`` is added when the line carries a traceback; ``thread`` and ``turn`` only
while a message is being handled. The text format appends ``[thread=… turn=…]`` then.
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar, Token
from typing import Literal

#: The thread key (``str(ThreadKey)``) of the message being handled in this context.
current_thread: ContextVar[str | None] = ContextVar("threadbook_log_thread", default=None)
#: Its turn id: the inbound message's platform id.
current_turn: ContextVar[str | None] = ContextVar("threadbook_log_turn", default=None)

#: What ``python -m bot`` has always written (the text format, before the context).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

LogFormat = Literal["text", "json"]
_Tokens = tuple[Token[str | None], Token[str | None]]


def enter_turn(thread: object, turn: str) -> _Tokens:
    """Stamp what is logged from here on in this context with ``thread`` and ``turn``;
    hand the result to :func:`leave_turn`."""
    return current_thread.set(str(thread)), current_turn.set(turn)


def leave_turn(tokens: _Tokens) -> None:
    """Undo :func:`enter_turn` (the context is as before it)."""
    thread, turn = tokens
    current_turn.reset(turn)
    current_thread.reset(thread)


def _context() -> tuple[str | None, str | None]:
    """The thread and turn of the context formatting runs in (the logging call's)."""
    return current_thread.get(), current_turn.get()


class TextFormatter(logging.Formatter):
    """The text format, with ``[thread=… turn=…]`` appended to lines logged during a turn."""

    def __init__(self, fmt: str = TEXT_FORMAT) -> None:
        super().__init__(fmt)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        thread, turn = _context()
        if thread is None and turn is None:
            return line
        return f"{line} [thread={thread} turn={turn}]"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601, milliseconds), level, logger, message,
    exception (when there is one), thread and turn (during a turn)."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        line: dict[str, str] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        thread, turn = _context()
        if thread is not None:
            line["thread"] = thread
        if turn is not None:
            line["turn"] = turn
        # default=str: a message built from an odd object still makes one valid line.
        return json.dumps(line, ensure_ascii=False, default=str)


def formatter(kind: LogFormat) -> logging.Formatter:
    """The formatter of ``logging.format``."""
    return JsonFormatter() if kind == "json" else TextFormatter()


def use_format(kind: LogFormat, logger: logging.Logger | None = None) -> None:
    """Give every handler of ``logger`` (default: the root logger) the ``kind`` formatter."""
    for handler in (logger or logging.getLogger()).handlers:
        handler.setFormatter(formatter(kind))
