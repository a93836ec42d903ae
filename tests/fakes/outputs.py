"""Helpers for tests of what adapters send: files as the core hands them over, and peak memory.

:func:`file_out` opens a file the way the core does (``kernels.host.safefs.pin``) and gives the
:class:`~bot.events.FileOut` adapters receive; :func:`big_random_file` writes a large file
without holding it in memory; :class:`PeakRss` measures how far this process's resident
memory rose while a block ran.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from bot.events import FileOut
from bot.safetext import shown
from kernels.host.safefs import pin


@contextmanager
def file_out(path: Path, name: str | None = None) -> Iterator[FileOut]:
    """The :class:`FileOut` for ``path`` (opened, pinned and named like the core does:
    :func:`bot.safetext.shown`); closed afterwards."""
    shown_name = shown(name if name is not None else path.name)
    pinned = pin(os.open(path, os.O_RDONLY | os.O_CLOEXEC), shown_name)
    try:
        yield FileOut(name=shown_name, size=pinned.size, open_reader=pinned.reader)
    finally:
        pinned.close()


def big_random_file(path: Path, size: int, *, chunk: int = 1 << 20) -> str:
    """Write ``size`` random bytes to ``path`` chunk by chunk; returns their sha256."""
    digest = hashlib.sha256()
    with path.open("wb") as out:
        left = size
        while left:
            block = os.urandom(min(chunk, left))
            digest.update(block)
            out.write(block)
            left -= len(block)
    return digest.hexdigest()


class PeakRss:
    """How far this process's resident set rose above its level at entry, while the block ran.

    Samples RSS every few milliseconds in a thread; where Linux lets us reset the peak
    (``/proc/self/clear_refs`` ← ``5``), ``VmHWM`` also catches spikes between samples.
    """

    def __init__(self, interval_s: float = 0.002) -> None:
        self._interval = interval_s
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hwm_reset = False
        self.baseline = 0
        self.peak = 0

    @property
    def growth(self) -> int:
        """Peak minus baseline, in bytes."""
        return max(0, self.peak - self.baseline)

    def __enter__(self) -> PeakRss:
        self.baseline = self.peak = self._process.memory_info().rss
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self._hwm_reset = True
        except OSError:
            self._hwm_reset = False
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)
        if self._hwm_reset:
            self.peak = max(self.peak, _vm_hwm())

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(self._interval)


def _vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0
