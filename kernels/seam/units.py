"""Units shown to people: the one way Threadbook writes a size in bytes, and an age.

This module sits in the lowest layer (it imports nothing from the project) so that the kernel
layer, the bot core and, through :mod:`bot.attachments`, the chat adapters all write sizes
the same way.
"""

from __future__ import annotations

__all__ = ["human_age", "human_size"]

_UNITS = ("B", "KB", "MB", "GB", "TB")


def human_size(size: int) -> str:
    """A size in bytes for people: binary multiples (1 KB = 1024 B) with one decimal, and a
    whole number of bytes below 1 KB.

    >>> human_size(12)
    '12 B'
    >>> human_size(1536)
    '1.5 KB'
    >>> human_size(5 * 2**20)
    '5.0 MB'
    >>> human_size(3 * 2**40)
    '3.0 TB'
    """
    value, unit = float(size), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{size} B" if unit == 0 else f"{value:.1f} {_UNITS[unit]}"


def human_age(seconds: float) -> str:
    """A time span for people, in its largest whole unit.

    >>> human_age(42)
    '42 seconds'
    >>> human_age(3 * 3600 + 5)
    '3 hours'
    >>> human_age(86_400)
    '1 day'
    """
    seconds = max(seconds, 0.0)
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{int(seconds)} seconds"
