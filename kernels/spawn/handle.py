"""The handle of a started local kernel (:class:`~kernels.seam.plan.KernelHandle`): its
``jupyter_client`` manager and client, its process tree, cgroup and run dir.

Every local launcher's start ends in one of these, whether the kernel was spawned, spawned in
bubblewrap or forked: a session drives them all alike. Freezes run in threads of their own
(:func:`_freezers`); the kernel's own stdout/stderr are read back from :data:`KERNEL_LOG`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

import psutil
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

from kernels.host import freezing, leftovers, safefs
from kernels.host.cgroups import KernelCgroup
from kernels.host.lifeline import Lifeline
from kernels.seam.result import KernelStartError
from kernels.seam.wire import shell_reply

#: The kernel's own stdout/stderr (crash messages such as "Fatal Python error") land here.
KERNEL_LOG = "kernel.log"


@dataclass
class LocalKernelHandle:
    """A started, ready local kernel (:class:`kernels.seam.plan.KernelHandle`): its manager, a
    connected client and its process."""

    manager: AsyncKernelManager
    client: AsyncKernelClient
    run_dir: Path
    #: The kernel's own processes, recorded when it became ready (see :mod:`kernels.host.leftovers`).
    infrastructure: frozenset[int] = frozenset()
    #: The kernel's CPU time read right after its last freeze (None: not frozen by :meth:`freeze`
    #: since): a frozen kernel uses none, so :meth:`cpu_seconds` needs no second trip to a thread.
    _frozen_cpu: float | None = None

    @property
    def pid(self) -> int | None:
        """The kernel (or sandbox) process id."""
        return getattr(self.manager.provisioner, "pid", None)

    @property
    def remote_id(self) -> str | None:
        """None: a local kernel is driven only by the process that started it."""
        return None

    @property
    def cgroup(self) -> KernelCgroup | None:
        """The kernel's cgroup, if it has one."""
        return getattr(self.manager.provisioner, "cgroup", None)

    async def reply(self, msg_id: str, timeout: float) -> dict[str, Any] | None:
        """The shell reply to request ``msg_id`` (see :func:`shell_reply`)."""
        return await shell_reply(self.client, msg_id, timeout)

    async def renew_iopub(self, timeout: float = 5.0) -> bool:
        """Reconnect iopub after its socket refused an oversized message; False when the new
        subscription did not come alive within ``timeout``.

        ZMQ treats a message over ``MAXMSGSIZE`` as a protocol error and drops that connection
        for good, so the channel is replaced by a new one; then ``kernel_info`` is asked until
        its status message arrives on the new subscription (as at start).
        """
        client = self.client
        old = client._iopub_channel  # jupyter_client has no public way to renew one channel
        if old is not None:
            old.close()
            client._iopub_channel = None
        client.iopub_channel.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            probe = client.kernel_info()
            until = time.monotonic() + 0.25
            while (remaining := until - time.monotonic()) > 0:
                try:
                    msg = await client.get_iopub_msg(timeout=remaining)
                except Empty:
                    break
                if msg["parent_header"].get("msg_id") == probe:
                    return True
        return False

    async def record_infrastructure(self) -> None:
        """Remember the kernel's own processes (call once it is ready, before any user code)."""
        self.infrastructure = await asyncio.to_thread(leftovers.infrastructure, self.cgroup, self.pid)

    async def out_of_memory(self) -> bool:
        """Whether the OOM killer of the kernel's memory cgroup has killed any of its processes."""
        cgroup = self.cgroup
        return cgroup is not None and await asyncio.to_thread(cgroup.oom_kills) > 0

    async def stop_leftovers(self) -> int:
        """SIGKILL every process of the kernel but its own (what user code left running:
        background jobs, daemons that left the process group); returns how many."""
        if not self.infrastructure:
            return 0
        return await asyncio.to_thread(leftovers.stop, self.cgroup, self.pid, self.infrastructure)

    async def is_alive(self) -> bool:
        """Whether the kernel process is still running."""
        return bool(await self.manager.is_alive())

    async def exit_code(self) -> int | None:
        """The kernel process's exit code once it has ended (negative: killed by that signal)."""
        provisioner = self.manager.provisioner
        return None if provisioner is None else await provisioner.poll()

    async def interrupt(self) -> None:
        """Send an interrupt (signal or message, as the kernel spec says)."""
        await self.manager.interrupt_kernel()

    async def shutdown(self) -> None:
        """Kill the kernel and everything it started; close channels; remove the run dir."""
        try:
            self.client.stop_channels()
        finally:
            try:
                if self.manager.has_kernel:
                    await self.manager.shutdown_kernel(now=True)
            finally:
                await asyncio.to_thread(shutil.rmtree, self.run_dir, True)

    async def log_tail(self, max_bytes: int = 2000) -> str:
        """The end of the kernel process's own stderr/stdout (for death notices).

        The run dir is the kernel's to write: the log is read like any kernel-written file
        (:mod:`kernels.host.safefs`), so a FIFO or a link planted in its place yields nothing.
        """
        data = await asyncio.to_thread(safefs.tail_file, self.run_dir, KERNEL_LOG, max_bytes)
        return data.decode(errors="replace")

    async def memory_bytes(self) -> int | None:
        """PSS of the kernel's process tree, or None when unknown."""
        return await asyncio.to_thread(tree_pss, self.pid)

    async def freeze(self) -> bool:
        """Freeze the kernel's cgroup; without one, SIGSTOP its process tree. True once frozen
        (its CPU time is read in the same trip to a thread: see :meth:`cpu_seconds`)."""
        loop = asyncio.get_running_loop()
        frozen, self._frozen_cpu = await loop.run_in_executor(_freezers(), self._freeze_and_read)
        return frozen

    def _freeze_and_read(self) -> tuple[bool, float | None]:
        frozen = self.freeze_blocking()
        return frozen, freezing.cpu_seconds(self.cgroup, self.pid) if frozen else None

    def freeze_blocking(self) -> bool:
        """(Blocking, any thread) :meth:`freeze`. Never without a kernel warden (it kills a
        frozen kernel if the bot dies): raises
        :class:`~kernels.host.lifeline.WardenUnavailableError` when none can run."""
        lifeline: Lifeline | None = getattr(self.manager.provisioner, "lifeline", None)
        if lifeline is None:
            raise KernelStartError("a kernel without a kernel warden is never frozen")
        lifeline.ensure()
        return freezing.freeze(self.cgroup, self.pid)

    async def thaw(self) -> None:
        """Thaw the kernel's cgroup; without one, SIGCONT its process tree."""
        self._frozen_cpu = None
        await asyncio.to_thread(freezing.thaw, self.cgroup, self.pid)

    async def cpu_seconds(self) -> float | None:
        """CPU time of the kernel's cgroup (ended processes included); without one, of its
        process tree and the children it reaped. While frozen since :meth:`freeze`, the
        reading that freeze took."""
        if self._frozen_cpu is not None:
            return self._frozen_cpu
        return await asyncio.to_thread(freezing.cpu_seconds, self.cgroup, self.pid)


#: Threads that freeze kernels (:func:`_freezers`).
FREEZER_THREADS = 32
_freezer_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _freezers() -> concurrent.futures.ThreadPoolExecutor:
    """The threads freezes run in, apart from the default executor: a freeze waits until every
    thread of the kernel has stopped, tens of milliseconds when the cores are busy, and a
    hundred kernels freezing at once held every default worker (6 on 2 cores) while the
    other trips to a thread (walks, thaws, sweeps) waited behind them."""
    global _freezer_pool
    if _freezer_pool is None:
        _freezer_pool = concurrent.futures.ThreadPoolExecutor(FREEZER_THREADS, thread_name_prefix="kernel-freeze")
    return _freezer_pool


def tree_pss(pid: int | None) -> int | None:
    """(Blocking) the PSS of ``pid``'s process tree, or None when there is none."""
    procs = leftovers.process_tree(pid)
    if not procs:  # no kernel process, or it is gone
        return None
    total = 0
    for proc in procs:
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        total += getattr(info, "pss", info.rss)
    return total
