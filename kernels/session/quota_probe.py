"""A cheap, frequent look at whether a running kernel may have outgrown its workspace quota.

Walking a workspace costs up to tens of milliseconds, so the session walks it only every
watchdog tick (0.25 s); a writer as fast as the disk allows writes hundreds of MiB in that
time. While a kernel can run, the bot looks at the file system's own count of used blocks
(``statvfs``: about a microsecond, and page-cache writes count at once) every
:data:`PROBE_S`; when it grew by more than the room the quota left at the last walk, the
probe *trips*: it freezes the kernel at once, from a thread (``on_trip``), and the session
walks the workspace, then kills the kernel or thaws it and re-arms the probe. Other writers
on the same file system can only cause an early walk, never a missed one.

One thread looks for every probe of the process (:class:`_Prober`), with one ``statvfs``
per file system and look, however many kernels run at once: a thread per running cell,
each waking every 2 ms, cost a crowd of 100 turns more CPU than everything else the bot
did for them (issue 44). A trip freezes its kernel in a thread of its own, so a slow freeze
(a tree stopped by signals) delays no other probe.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kernels.host import safefs

log = logging.getLogger(__name__)

#: How often the file system's used space is looked at while a kernel can run.
PROBE_S = 0.002


def _used_bytes(fd: int) -> int:
    stats = os.fstatvfs(fd)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


class QuotaProbe:
    """Watches the file system holding a workspace while a kernel runs."""

    def __init__(self, path: Path, room: int, on_trip: Callable[[], object]) -> None:
        """(Blocking: opens ``path``, one ``statvfs``) ``room``: bytes the quota leaves now;
        ``on_trip`` (the kernel's blocking freeze) is called once per trip, from a thread of
        its own, and has returned (or failed) before :attr:`tripped` is set."""
        self._fd = safefs.open_dir(path)  # held open: the file system is looked at through it
        self._on_trip = on_trip
        self.tripped = threading.Event()
        #: Set while no trip is under way (the freeze has returned).
        self._settled = threading.Event()
        self._settled.set()
        self._room = 0
        self._base = 0
        self._stopped = False
        try:
            self._device = os.fstat(self._fd).st_dev
            self.rearm(room)
        except BaseException:
            os.close(self._fd)
            raise

    def rearm(self, room: int) -> None:
        """(Blocking) count again from now, after a walk that left ``room`` bytes."""
        with _PROBER.lock:
            if self._stopped:
                return
            self._room = max(room, 0)
            self._base = _used_bytes(self._fd)
            self.tripped.clear()
            _PROBER.add_locked(self)

    def stop(self) -> None:
        """(Blocking) stop looking: returns once no look at it is under way and a freeze under
        way has returned, so no trip freezes the kernel afterwards."""
        if not self.stop_unless_tripping():
            self._settled.wait()
            self._close()

    def stop_unless_tripping(self) -> bool:
        """Stop looking without waiting: True when it is stopped (no freeze was under way);
        False when a trip's freeze is still running (call :meth:`stop`, which waits for it)."""
        with _PROBER.lock:
            self._stopped = True
            _PROBER.remove_locked(self)
            settled = self._settled.is_set()
        if settled:
            self._close()
        return settled

    def _close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def _grown(self, used: int | None) -> bool:
        """(Under the prober's lock) whether the file system grew past the room (``used``
        None: it could not be read)."""
        return used is None or used - self._base > self._room

    def _trip(self) -> None:
        """(A thread of its own) freeze the kernel, then say so."""
        try:
            self._on_trip()
        except Exception:  # fail closed: tripped all the same, the session walks (and stops) the kernel
            log.exception("the quota probe could not freeze the kernel")
        finally:
            self.tripped.set()
            self._settled.set()


class _Prober:
    """The one thread that looks at every armed probe's file system every :data:`PROBE_S`;
    it sleeps while no probe is armed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._armed: dict[QuotaProbe, None] = {}  # armed probes, in arming order
        self._wake = threading.Condition(self.lock)
        self._thread: threading.Thread | None = None

    def add_locked(self, probe: QuotaProbe) -> None:
        """(Under :attr:`lock`) look at ``probe`` from now on (until it trips or is removed)."""
        self._armed[probe] = None
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._watch, name="quota-probe", daemon=True)
            self._thread.start()
        self._wake.notify()

    def remove_locked(self, probe: QuotaProbe) -> None:
        """(Under :attr:`lock`) look at ``probe`` no more: no look at it is under way then."""
        self._armed.pop(probe, None)

    def _watch(self) -> None:
        while True:
            with self.lock:
                while not self._armed:
                    self._wake.wait()
            time.sleep(PROBE_S)  # a probe armed meanwhile is looked at within PROBE_S all the same
            with self.lock:
                tripped = self._look()
            for probe in tripped:
                threading.Thread(target=probe._trip, name="quota-trip", daemon=True).start()

    def _look(self) -> list[QuotaProbe]:
        """(Under the lock) one ``statvfs`` per file system; the probes that trip now, no
        longer armed and marked as tripping."""
        used: dict[int, int | None] = {}
        tripped = []
        for probe in self._armed:
            if probe._device not in used:
                try:
                    used[probe._device] = _used_bytes(probe._fd)
                except OSError:
                    used[probe._device] = None  # gone or unreadable: let the walk decide
            if probe._grown(used[probe._device]):
                tripped.append(probe)
        for probe in tripped:
            del self._armed[probe]
            probe._settled.clear()
        return tripped


_PROBER = _Prober()
