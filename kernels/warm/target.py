"""How many warm kernels to keep when ``kernels.warm_pool`` is ``auto``.

:class:`WarmTarget` is pure bookkeeping (no tasks, no kernels; time from an injectable
monotonic clock), asked by :class:`kernels.warm.pool.WarmPool`:

* **Demand.** Every new thread the warm pool could serve is an arrival (:meth:`record`),
  counted per minute. The demand is the busiest minute of the last hour: a burst of 20 new
  threads keeps 20 kernels warm for the next hour, in case it comes again. It is never below
  ``floor`` (1): a quiet bot still answers its next new thread from a warm kernel.
* **Caps**, which win over the floor: ``max_kernels`` minus the threads' kernels (warm
  kernels count toward ``max_kernels``), and memory: at most as many kernels in all as fit
  in the memory that is available (:func:`available_memory`) less :data:`RESERVE_BYTES`,
  at the measured footprint of one warm kernel (its PSS; :data:`KERNEL_BYTES` until one was
  measured). Memory is read at most every :data:`MEMORY_EVERY_S`; the reading is blocking
  file I/O, so the pool does it off the event loop (:meth:`read_memory`).
* **Quiet shrink.** When the target falls below the number of ready kernels, the extra ones
  go only once it has stayed lower for :data:`QUIET_S` (:meth:`surplus`), so a target that
  dips for a moment causes no churn.

Every window is a constructor argument: tests and the ``warm_trace`` benchmark compress an
hour into seconds.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

MiB = 1024 * 1024
#: One warm kernel's memory until a warm kernel was measured: the idle PSS of a spawned
#: kernel with pandas, numpy and pyplot imported (117 MiB, the default ``preload``), rounded
#: up. Forked kernels share most of theirs with the fork server (~30 MiB PSS each).
KERNEL_BYTES = 120 * MiB
#: Memory never handed to warm kernels: the bot's own, and room for the threads' kernels to grow.
RESERVE_BYTES = 512 * MiB
#: Demand is the busiest ``BUCKET_S`` of the last ``WINDOW_S``.
WINDOW_S = 3600.0
BUCKET_S = 60.0
#: A target below the ready count this long discards the extra warm kernels.
QUIET_S = 60.0
#: The warm pool looks at its target at least this often (and whenever it is kicked).
EVALUATE_EVERY_S = 5.0
#: Available memory is read at most this often.
MEMORY_EVERY_S = 5.0
#: The least demand: one warm kernel for the next new thread.
FLOOR = 1

#: Returns the bytes of memory available to new kernels now, or None when unknown (no cap).
MemoryReader = Callable[[], int | None]
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63


class WarmTarget:
    """The adaptive size of a warm pool: the last hour's busiest minute of new threads, capped."""

    def __init__(
        self,
        *,
        max_kernels: int,
        floor: int = FLOOR,
        window_s: float = WINDOW_S,
        bucket_s: float = BUCKET_S,
        quiet_s: float = QUIET_S,
        evaluate_every_s: float = EVALUATE_EVERY_S,
        memory: MemoryReader | None = None,
        memory_every_s: float = MEMORY_EVERY_S,
        reserve_bytes: int = RESERVE_BYTES,
        kernel_bytes: int = KERNEL_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``memory``: where available memory is read (:func:`available_memory`); None: no
        memory cap (kernels run elsewhere, on a gateway). ``clock``: monotonic seconds."""
        self.max_kernels = max_kernels
        self.floor = floor
        self.bucket_s = bucket_s
        self.buckets = max(1, round(window_s / bucket_s))
        self.quiet_s = quiet_s
        self.evaluate_every_s = evaluate_every_s
        self.reserve_bytes = reserve_bytes
        self.kernel_bytes = kernel_bytes
        self._memory = memory
        self._memory_every_s = memory_every_s
        self._clock = clock
        #: [minute index, arrivals in it], oldest first; only minutes with arrivals.
        self._arrivals: deque[list[int]] = deque()
        #: (available bytes, kernels running then, when read) of the last memory reading.
        self._reading: tuple[int, int, float] | None = None
        self._low_since: float | None = None

    def _bucket(self) -> int:
        return int(self._clock() // self.bucket_s)

    def record(self) -> None:
        """One new thread arrived now."""
        bucket = self._bucket()
        if self._arrivals and self._arrivals[-1][0] == bucket:
            self._arrivals[-1][1] += 1
        else:
            self._arrivals.append([bucket, 1])

    def demand(self) -> int:
        """The most new threads in one minute (bucket) of the last hour (window), at least ``floor``."""
        oldest = self._bucket() - self.buckets + 1
        while self._arrivals and self._arrivals[0][0] < oldest:
            self._arrivals.popleft()
        return max(self.floor, max((count for _, count in self._arrivals), default=0))

    @property
    def memory_stale(self) -> bool:
        """Whether :meth:`read_memory` is due (never when there is no memory cap)."""
        if self._memory is None:
            return False
        return self._reading is None or self._clock() - self._reading[2] >= self._memory_every_s

    def read_memory(self, kernels: int) -> None:
        """(Blocking) read the available memory; ``kernels``: how many run now (warm ones included)."""
        if self._memory is None:
            return
        available = self._memory()
        self._reading = None if available is None else (available, kernels, self._clock())

    def note_kernel_bytes(self, footprint: int) -> None:
        """A warm kernel was measured ready at ``footprint`` bytes (PSS): the estimate from now on."""
        if footprint > 0:
            self.kernel_bytes = footprint

    def memory_cap(self) -> int | None:
        """How many kernels may run in all (threads' and warm), by the last memory reading; None: no cap."""
        if self._reading is None:
            return None
        available, kernels, _ = self._reading
        return kernels + (available - self.reserve_bytes) // max(1, self.kernel_bytes)

    def size(self, *, sessions: int) -> int:
        """How many warm kernels to keep now, while ``sessions`` threads have kernels."""
        target = min(self.demand(), self.max_kernels - sessions)
        cap = self.memory_cap()
        if cap is not None:
            target = min(target, cap - sessions)
        return max(0, target)

    def surplus(self, *, ready: int, size: int) -> int:
        """How many of ``ready`` warm kernels to discard now: none until ``size`` has stayed
        below ``ready`` for ``quiet_s``, then all above ``size``."""
        if ready <= size:
            self._low_since = None
            return 0
        now = self._clock()
        if self._low_since is None:
            self._low_since = now
        return ready - size if now - self._low_since >= self.quiet_s else 0


def available_memory(
    meminfo: Path = Path("/proc/meminfo"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
) -> int | None:
    """(Blocking) the bytes new kernels may use: ``MemAvailable`` of ``/proc/meminfo``, or less
    where the bot's memory cgroup (or one above it) has a limit — in a container the host's
    ``MemAvailable`` says nothing about the container's limit. None when neither can be read."""
    found: list[int] = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    headroom = _cgroup_headroom(proc_cgroup, cgroup_root)
    if headroom is not None:
        found.append(headroom)
    return min(found, default=None)


def _cgroup_headroom(proc_cgroup: Path, root: Path) -> int | None:
    """The least (limit − working set) over the bot's memory cgroup and its ancestors, where a
    limit is set: cgroup v2 (``memory.max``), else v1's memory hierarchy
    (``memory.limit_in_bytes``). The working set is usage less inactive page cache (as the
    kubelet counts it: the kernel reclaims that cache before it kills). None: no limit found."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "" and (root / "cgroup.controllers").exists():
            mount, names = root, ("memory.max", "memory.current", "inactive_file")
            break
        if "memory" in controllers.split(","):
            mount, names = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            break
    else:
        return None
    limit_name, usage_name, inactive_name = names
    least: int | None = None
    folder = mount / path.lstrip("/")
    while True:
        try:
            raw = (folder / limit_name).read_text().strip()
            if raw != "max" and int(raw) < _UNLIMITED:
                usage = int((folder / usage_name).read_text())
                inactive = 0
                for row in (folder / "memory.stat").read_text().splitlines():
                    name, _, value = row.partition(" ")
                    if name == inactive_name:
                        inactive = int(value)
                headroom = int(raw) - max(0, usage - inactive)
                least = headroom if least is None else min(least, headroom)
        except (OSError, ValueError):
            pass
        if folder == mount or mount not in folder.parents:
            return least
        folder = folder.parent
