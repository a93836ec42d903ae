"""What every chat platform adapter offers the application runner."""

from __future__ import annotations

from typing import Protocol


class AdapterStartError(Exception):
    """A platform refused to start (bad token, missing permission); ``str()`` is one line naming the setting."""


class Adapter(Protocol):
    """A platform edge: translates events for the dispatcher and posts its replies."""

    async def start(self) -> None:
        """Connect or start listening; return once running. Raises :class:`AdapterStartError`."""

    async def stop(self) -> None:
        """Disconnect and finish or cancel the turns it started."""
