"""What every chat platform adapter offers the application runner."""

from __future__ import annotations

from typing import Protocol


class Adapter(Protocol):
    """A platform edge: translates events for the dispatcher and posts its replies."""

    async def start(self) -> None:
        """Connect or start listening; return once running."""

    async def stop(self) -> None:
        """Disconnect and finish or cancel the turns it started."""
