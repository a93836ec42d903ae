"""The launch seam: one frozen :class:`LaunchPlan` per kernel start, one :class:`Launcher` protocol.

Whoever needs a kernel (a session, the warm pool) asks the launcher for a plan and hands it
back to :meth:`Launcher.start`::

    plan = launcher.plan(workspace, options)   # pure: decides everything, starts nothing
    handle = await launcher.start(plan)        # the only step that touches processes

A plan says everything about one start - the thread's folder, where the kernel's sockets and
log live, its complete environment, its limits, its network, its read-only data folder and
who it runs as - so the kinds of launcher differ only in how they carry a plan out:

* :class:`kernels.local.launcher.KernelLauncher` spawns a local ``ipykernel`` with ``jupyter_client``
  (through the :class:`kernels.spawn.spawner.Spawner` it composes);
* :class:`kernels.bwrap.launcher.BwrapLauncher` spawns it inside bubblewrap (the plan then holds
  in-sandbox paths and the kernel's uid);
* :class:`kernels.forking.launcher.ForkingLauncher` forks it from a pre-imported zygote, falling
  back to its spawn launcher *with the same plan*;
* :class:`kernels.warm.pool.HandOff` gives a session a kernel started ahead of time;
* a remote launcher (a Jupyter gateway) implements the same five members.

Which launcher a deployment gets, and what wraps what, is decided in one place:
:func:`kernels.build.build_launcher`.
"""

from __future__ import annotations

import math
import resource
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from kernels.seam.options import KernelOptions
from kernels.seam.settings import KernelSettings

MiB = 1024 * 1024
#: (resource, soft == hard value) pairs, as ``prlimit`` and the fork server take them.
RLimits = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ResourceLimits:
    """The per-kernel limits of the settings (rlimits; the cgroup takes memory and pids too)."""

    memory_mb: int
    cpu_seconds: int
    max_processes: int
    max_file_mb: int
    max_open_files: int

    @classmethod
    def from_settings(cls, settings: KernelSettings) -> ResourceLimits:
        """The limits ``kernels:`` configures. No file may outgrow the whole workspace quota:
        a single-file writer meets ``EFBIG`` there, before any check has to catch it."""
        return cls(
            memory_mb=settings.memory_mb,
            cpu_seconds=settings.cpu_seconds,
            max_processes=settings.max_processes,
            max_file_mb=min(settings.max_file_mb, math.ceil(settings.workspace_quota_mb)),
            max_open_files=settings.max_open_files,
        )

    def rlimits(self) -> RLimits:
        """The rlimits of every kernel process (soft == hard).

        Memory is ``RLIMIT_DATA`` (heap and private writable mappings, not the ~1 GiB of
        address space an idle kernel maps); CPU seconds are a lifetime backstop;
        ``RLIMIT_NPROC`` counts per uid and is ignored for root.
        """
        return (
            (resource.RLIMIT_DATA, self.memory_mb * MiB),
            (resource.RLIMIT_CPU, self.cpu_seconds),
            (resource.RLIMIT_NPROC, self.max_processes),
            (resource.RLIMIT_FSIZE, self.max_file_mb * MiB),
            (resource.RLIMIT_NOFILE, self.max_open_files),
        )


@dataclass(frozen=True)
class Identity:
    """Who a sandboxed kernel runs as, and who owns its files on the host."""

    uid: int
    gid: int
    #: Owner (uid, gid) the workspace and run dir are handed to before the start (a root
    #: bot's per-workspace uid); None when the kernel's uid maps to the bot's own.
    host_owner: tuple[int, int] | None


@dataclass(frozen=True)
class LaunchPlan:
    """Everything one kernel start needs, decided before anything starts."""

    #: A unique id (the kernel's cgroup and the run dir's name carry it).
    kernel_id: str
    #: The thread's folder on the host: the kernel's working directory (``/workspace`` inside
    #: the sandbox) and its ``HOME``.
    workspace: Path
    #: A folder (made by the start, removed when the kernel stops) for the connection file,
    #: the kernel's sockets, its log and, sandboxed, its ``/etc/passwd``.
    run_dir: Path
    #: The kernel's complete environment, paths as the kernel sees them.
    environment: Mapping[str, str]
    limits: ResourceLimits
    #: A host folder offered read-only (``THREADBOOK_DATA_DIR`` in ``environment`` says where
    #: the kernel sees it), or None.
    data_dir: Path | None
    #: Whether the kernel gets network (only what the launcher can really give).
    network: bool
    #: The shared folder of packages installed on demand, offered read-only and appended to
    #: the kernel's ``sys.path`` (``THREADBOOK_PACKAGES_DIR`` says where the kernel sees it).
    packages_dir: Path | None
    #: Who the kernel runs as inside the sandbox; None: unsandboxed, the bot's own uid.
    identity: Identity | None

    def __post_init__(self) -> None:
        # Frozen all the way down: nobody adds a variable to a plan after it was made.
        object.__setattr__(self, "environment", MappingProxyType(dict(self.environment)))


class KernelChannels(Protocol):
    """The messaging a session does with a kernel: the part of jupyter_client's
    ``AsyncKernelClient`` Threadbook uses (local kernels use that client itself)."""

    def execute(
        self,
        code: str,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool | None = None,
        stop_on_error: bool = True,
    ) -> str:
        """Send an ``execute_request``; its msg_id."""
        ...

    def kernel_info(self) -> str:
        """Send a ``kernel_info_request``; its msg_id."""
        ...

    async def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:
        """The next iopub message; raises ``queue.Empty`` after ``timeout`` seconds."""
        ...

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        """The next shell reply; raises ``queue.Empty`` after ``timeout`` seconds."""
        ...


class KernelHandle(Protocol):
    """A started, ready kernel, whatever runs it: what a session needs to drive it."""

    @property
    def client(self) -> KernelChannels:
        """Its channels."""
        ...

    @property
    def pid(self) -> int | None:
        """The local process id; None for a remote kernel."""
        ...

    @property
    def remote_id(self) -> str | None:
        """The id another process can attach to it by (:meth:`Launcher.attach`); None for a
        local kernel, which only the process that started it can drive."""
        ...

    async def reply(self, msg_id: str, timeout: float) -> dict[str, Any] | None:
        """The shell reply to ``msg_id`` within ``timeout`` seconds (0: only what arrived), else None."""
        ...

    async def renew_iopub(self, timeout: float = 5.0) -> bool:
        """Reconnect iopub after an oversized message cost it; whether it came back."""
        ...

    async def out_of_memory(self) -> bool:
        """Whether its memory limit killed one of its processes."""
        ...

    async def stop_leftovers(self) -> int:
        """Kill what user code left running; how many processes."""
        ...

    async def is_alive(self) -> bool:
        """Whether the kernel still runs."""
        ...

    async def exit_code(self) -> int | None:
        """Its exit code once it ended (negative: the signal), when known."""
        ...

    async def interrupt(self) -> None:
        """Interrupt the running execution."""
        ...

    async def shutdown(self) -> None:
        """Stop the kernel and everything it started."""
        ...

    async def log_tail(self, max_bytes: int = 2000) -> str:
        """The end of the kernel process's own output, for death notices ("" when unknown)."""
        ...

    async def memory_bytes(self) -> int | None:
        """Its memory use (PSS), when known."""
        ...

    async def freeze(self) -> bool:
        """Stop every process and thread of the kernel until :meth:`thaw` (its thread has no
        turn); True once all are stopped. A gateway's kernel is not the bot's to stop (its
        pod's limits hold): True, with nothing done."""
        ...

    def freeze_blocking(self) -> bool:
        """(Blocking, from any thread) :meth:`freeze`, for a watcher that must stop the kernel
        at once (:mod:`kernels.session.quota_probe`)."""
        ...

    async def thaw(self) -> None:
        """Let a frozen kernel run again."""
        ...

    async def cpu_seconds(self) -> float | None:
        """CPU time its processes have used since it started, when known."""
        ...


class Launcher(Protocol):
    """What the kernel pool, its sessions and the warm pool need from a kind of launcher."""

    @property
    def isolation(self) -> str:
        """One line saying which isolation kernels get (start-up log, ``status``)."""
        ...

    def kernel_view(self, options: KernelOptions) -> KernelOptions:
        """``options`` as code inside the kernel sees them (where ``data_dir`` is, whether
        there really is network)."""
        ...

    def plan(self, workspace: Path, options: KernelOptions) -> LaunchPlan:
        """The plan of one start of a kernel for ``workspace`` (no I/O, nothing started)."""
        ...

    async def start(self, plan: LaunchPlan) -> KernelHandle:
        """Start a kernel as ``plan`` says and wait until it answers; raises
        :class:`kernels.seam.result.KernelStartError` and leaves nothing behind when it cannot."""
        ...

    async def attach(self, remote_id: str) -> KernelHandle | None:
        """Drive a running kernel that another process started (its :attr:`KernelHandle.remote_id`),
        its variables intact; its running code, if any, is interrupted. None when this kind of
        launcher cannot, or the kernel is gone."""
        ...

    async def open(self) -> None:
        """Start background work the launcher needs: local launchers' kernel warden (raises
        :class:`kernels.seam.result.SandboxUnavailableError` when it cannot run), a fork server
        (never raises for it)."""
        ...

    async def close(self) -> None:
        """Stop that background work. Local launchers' kernel warden kills the kernels they
        started that still run; a gateway's kernels are not touched."""
        ...
