"""What the kernel hands back to the bot, and the small helpers its answers share."""

from __future__ import annotations

import json

__all__ = ["Answer", "first_line", "human_size"]

_UNITS = ("B", "KB", "MB", "GB", "TB")


class Answer:
    """A value for the bot's user expression: its ``repr`` (the ``text/plain`` the bot reads)
    is the value as JSON, so the bot never evaluates Python text."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __repr__(self) -> str:
        return json.dumps(self.value)


def human_size(size: int) -> str:
    """A size for people, written as the bot writes sizes (``kernels.units.human_size``)."""
    value, unit = float(size), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{size} B" if unit == 0 else f"{value:.1f} {_UNITS[unit]}"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (at most 200 characters), else its type."""
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
