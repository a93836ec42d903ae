"""The line of new threads waiting for a kernel: first come, first served, with a cap on its
length, a timeout, and the waits of the threads it served lately (for ``status``).

The :class:`~kernels.pool.pool.KernelPool` decides who gets a kernel; the line only keeps the
order, wakes the waiting threads when room may have come free, and tells each its place.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kernels.seam.result import QueueFullError, QueueLeftError, QueueTimeoutError
from kernels.seam.settings import KernelSettings

log = logging.getLogger(__name__)

#: Called with the number of threads ahead whenever a waiting thread's place changes.
OnWait = Callable[[int], Awaitable[None]]
#: A waiting thread re-checks for room at least this often (a kernel that finished an
#: execution outside any lease wakes nobody).
_RECHECK_S = 0.5
_WAITS_KEPT = 200


@dataclass(eq=False)
class Ticket:
    """One thread's place in the line."""

    key: str
    queued_at: float = field(default_factory=time.monotonic)
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    told: int | None = None  # the place last reported to ``on_wait``


@dataclass(frozen=True)
class QueueStats:
    """The queue now and the waits of the threads that got a kernel lately."""

    waiting: int
    recent_waits: int
    p50_wait_s: float
    max_wait_s: float


class WaitingLine:
    """New threads waiting for a kernel, in the order they came."""

    def __init__(self, settings: KernelSettings) -> None:
        """Its cap and timeout come from ``settings`` (``max_queue``, ``queue_timeout_s``)."""
        self._settings = settings
        self._tickets: deque[Ticket] = deque()
        self._waits: deque[float] = deque(maxlen=_WAITS_KEPT)

    @property
    def max_queue(self) -> int:
        """How many threads may wait for a kernel at once."""
        configured = self._settings.max_queue
        return 4 * self._settings.max_kernels if configured is None else configured

    @property
    def waiting(self) -> int:
        """How many threads wait now."""
        return len(self._tickets)

    def first(self, ticket: Ticket) -> bool:
        """Whether ``ticket`` is at the head of the line."""
        return bool(self._tickets) and self._tickets[0] is ticket

    def stats(self) -> QueueStats:
        """The line's length and the recent waits."""
        waits = list(self._waits)
        return QueueStats(
            waiting=len(self._tickets),
            recent_waits=len(waits),
            p50_wait_s=statistics.median(waits) if waits else 0.0,
            max_wait_s=max(waits, default=0.0),
        )

    def join(self, key: str) -> Ticket:
        """``key`` joins the end of the line; :class:`QueueFullError` when ``max_queue`` wait already."""
        if len(self._tickets) >= self.max_queue:
            raise QueueFullError(
                f"all {self._settings.max_kernels} kernels are in use and {len(self._tickets)} threads wait already"
            )
        ticket = Ticket(key)
        self._tickets.append(ticket)
        log.info("thread %s waits for a kernel (%d in the queue)", key, len(self._tickets))
        return ticket

    def leave(self, ticket: Ticket, *, served: bool) -> None:
        """``ticket`` leaves the line (``served``: its thread got a kernel; its wait counts)."""
        if ticket in self._tickets:
            self._tickets.remove(ticket)
        if served:
            self._waits.append(time.monotonic() - ticket.queued_at)
        self.wake()

    def wake(self) -> None:
        """Tell every waiting thread to look again (room may have come free, places moved)."""
        for ticket in self._tickets:
            ticket.woken.set()

    async def wait(self, ticket: Ticket, on_wait: OnWait | None, leave: asyncio.Event | None) -> None:
        """Wait until woken, ``_RECHECK_S`` passed, ``leave`` is set or the queue timeout ends."""
        if ticket not in self._tickets:
            return
        ahead = self._tickets.index(ticket)
        if on_wait is not None and ahead != ticket.told:
            ticket.told = ahead
            await on_wait(ahead)
        remaining = ticket.queued_at + self._settings.queue_timeout_s - time.monotonic()
        if remaining <= 0:
            raise QueueTimeoutError(f"no kernel came free within {self._settings.queue_timeout_s:g} s")
        if leave is not None and leave.is_set():
            raise QueueLeftError("stopped while waiting for a kernel")
        ticket.woken.clear()
        waiters = [asyncio.ensure_future(ticket.woken.wait())]
        if leave is not None:
            waiters.append(asyncio.ensure_future(leave.wait()))
        try:
            await asyncio.wait(waiters, timeout=min(remaining, _RECHECK_S), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        if leave is not None and leave.is_set():
            raise QueueLeftError("stopped while waiting for a kernel")
