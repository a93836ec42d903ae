"""What one turn records: the thread's transcript (its history for the model, the cells it ran,
its new messages) and its row in the usage ledger.

A turn opens its :class:`TurnRecord` as it starts (the usage row is made at once, so the
per-minute budget sees the turn on every replica) and writes through it, never through the
store as a whole: the runner holds only what a turn may touch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bot.database import Operation
from bot.events import ThreadKey
from bot.store import NOTICE_ROLE, Transcripts, UsageLedger
from bot.transcript import NewCell


class TurnRecords:
    """Opens each turn's :class:`TurnRecord` (one per process, over the store's repositories)."""

    def __init__(self, transcripts: Transcripts, usage: UsageLedger, write_all: Callable[..., Awaitable[None]]) -> None:
        """``write_all(*operations)`` runs the repositories' operations in one transaction
        (:meth:`~bot.store.Store.write_all`)."""
        self._transcripts = transcripts
        self._usage = usage
        self._write_all = write_all

    async def open(self, key: ThreadKey, *, model: str, user_id: str, at: float) -> TurnRecord:
        """The record of a turn of ``key`` starting now: its usage row made."""
        row = await self._usage.begin(key, model=model, user_id=user_id, at=at)
        return TurnRecord(key, row, self._transcripts, self._usage, self._write_all)


class TurnRecord:
    """One turn's writes (see the module docstring)."""

    def __init__(
        self,
        key: ThreadKey,
        row: int,
        transcripts: Transcripts,
        usage: UsageLedger,
        write_all: Callable[..., Awaitable[None]],
    ) -> None:
        self.key = key
        self._row = row
        self._transcripts = transcripts
        self._usage = usage
        self._write_all = write_all
        self._cells: list[asyncio.Task[None]] = []

    async def history(self) -> list[dict[str, Any]]:
        """The thread's earlier exchanges, as the model is sent them."""
        return await self._transcripts.history(self.key)

    async def ran_code_before(self) -> bool:
        """Whether the thread has run any code before this turn."""
        return await self._transcripts.cell_count(self.key) > 0

    def add_cell(self, cell: NewCell) -> None:
        """Store a cell that ran, while the turn goes on (the store keeps the order of its
        writes); :meth:`cells_stored` waits for them."""
        self._cells.append(asyncio.create_task(self._transcripts.add_cell(self.key, cell)))

    async def cells_stored(self) -> None:
        """Wait until every cell added is stored (a failed write surfaces here)."""
        await asyncio.gather(*self._cells)

    async def close(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        notice: str | None,
        user_id: str,
        prompt_tokens: int,
        completion_tokens: int,
        kernel_s: float,
    ) -> None:
        """The turn's end, in one transaction: its messages as the model said and saw them,
        then our own ``notice`` (a message of role ``notice``, which the history never gives
        back to the model), and what the turn spent, added to its usage row. No messages (a
        failed model request): nothing enters the transcript, not even the notice."""
        writes: list[Operation] = []
        if messages:
            noted = [{"role": NOTICE_ROLE, "content": notice}] if notice else []
            writes.append(self._transcripts.adding_messages(self.key, [*messages, *noted], user_id=user_id))
        writes.append(
            self._usage.adding(
                self._row, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, kernel_s=kernel_s
            )
        )
        await self._write_all(*writes)
