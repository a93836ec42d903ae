"""A cheap, frequent look at whether a running kernel may have outgrown its workspace quota.

Walking a workspace costs up to tens of milliseconds, so the session walks it only every
watchdog tick (0.25 s); a writer as fast as the disk allows writes hundreds of MiB in that
time. While a kernel can run, a thread of the bot looks at the file system's own count of
used blocks (``statvfs``: about a microsecond, and page-cache writes count at once) every
:data:`PROBE_S`; when it grew by more than the room the quota left at the last walk, the
probe *trips*: it freezes the kernel at once, from its thread (``on_trip``), and the session walks the
workspace, then kills the kernel or thaws it and re-arms the probe. Other writers on the
same file system can only cause an early walk, never a missed one.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from kernels import safefs

log = logging.getLogger(__name__)

#: How often the file system's used space is looked at while a kernel can run.
PROBE_S = 0.002


def _used_bytes(fd: int) -> int:
    stats = os.fstatvfs(fd)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


class QuotaProbe:
    """Watches the file system holding a workspace from a thread while a kernel runs."""

    def __init__(self, path: Path, room: int, on_trip: Callable[[], object]) -> None:
        """(Blocking: opens ``path``, one ``statvfs``) ``room``: bytes the quota leaves now;
        ``on_trip`` (the kernel's blocking freeze) is called once per trip, from the probe's
        thread, and has returned (or failed) before :attr:`tripped` is set."""
        self._fd = safefs.open_dir(path)  # held open: the file system is looked at through it
        self._on_trip = on_trip
        self.tripped = threading.Event()
        self._stop = threading.Event()
        self._room = 0
        self._base = 0
        try:
            self.rearm(room)
        except BaseException:
            os.close(self._fd)
            raise
        self._thread = threading.Thread(target=self._watch, name="quota-probe", daemon=True)
        self._thread.start()

    def rearm(self, room: int) -> None:
        """(Blocking) count again from now, after a walk that left ``room`` bytes."""
        self._room = max(room, 0)
        self._base = _used_bytes(self._fd)
        self.tripped.clear()

    def stop(self) -> None:
        """(Blocking) stop looking: returns once the thread has ended (within :data:`PROBE_S`,
        or once a freeze under way returned), so no trip freezes the kernel afterwards."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def _watch(self) -> None:
        while not self._stop.wait(PROBE_S):
            if self.tripped.is_set():
                continue
            try:
                grown = _used_bytes(self._fd) - self._base > self._room
            except OSError:
                grown = True  # the workspace's file system is gone or unreadable: let the walk decide
            if grown:
                try:
                    self._on_trip()
                except Exception:  # fail closed: tripped all the same, the session walks (and stops) the kernel
                    log.exception("the quota probe could not freeze the kernel")
                finally:
                    self.tripped.set()
