"""The spawner: what every local launcher shares to carry a plan out with ``jupyter_client``.

A :class:`Spawner` holds a launcher's host facilities (kernel warden, cgroups, interpreter,
run root, packages folder, limits) and its start slots. :meth:`Spawner.plan` makes one start's
frozen :class:`~kernels.seam.plan.LaunchPlan` from the environment and identity the launcher
chose; :meth:`Spawner.spawn` makes the plan's run dir, builds an ``AsyncKernelManager`` with the
kernel spec and the provisioner the launcher hands it (handed to the manager directly instead
of through an entry point), connects a client and waits until the kernel answers.

The local launcher, the bubblewrap launcher and the forking launcher each compose one; they
differ in the plan they make (host or in-sandbox paths, uid) and the provisioner they hand over
(plain ``Popen``, ``bwrap`` prefix, a fork from the zygote).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import zmq
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from kernels.host.cgroups import Cgroups
from kernels.host.interpreter import KernelPython, inspect_interpreter
from kernels.host.lifeline import Lifeline
from kernels.host.runroot import make_private, run_parent
from kernels.sandbox.support import BwrapSupport
from kernels.seam.options import KernelOptions
from kernels.seam.plan import Identity, Launcher, LaunchPlan, ResourceLimits
from kernels.seam.result import KernelStartError
from kernels.seam.settings import KernelSettings
from kernels.seam.wire import KERNEL_SETUP, MAX_MESSAGE_BYTES, START_TIMEOUT_S, wait_ready
from kernels.spawn.handle import KERNEL_LOG, LocalKernelHandle
from kernels.spawn.process import ThreadbookProvisioner

#: Kernels one launcher starts at a time: a burst of new threads then finishes its starts one
#: batch after another instead of all of them sharing the CPU past ``START_TIMEOUT_S``.
START_SLOTS = 2 * (os.cpu_count() or 1)
#: How soon a channel retries to connect to a kernel that has not bound its socket yet.
RECONNECT_IVL_MS = 10
RECONNECT_IVL_MAX_MS = 1000
#: Run dirs are named ``kernel-<kernel id>`` under the launcher's run root.
RUN_DIR_PREFIX = "kernel-"

#: Makes the provisioner that carries out a plan for a manager (each launcher has its own).
Provisioning = Callable[[LaunchPlan, AsyncKernelManager], ThreadbookProvisioner]


class _Manager(AsyncKernelManager):
    """An ``AsyncKernelManager`` with a spec given in code instead of a kernelspec dir."""

    _threadbook_spec: KernelSpec | None = None

    @property
    def kernel_spec(self) -> KernelSpec | None:
        return self._threadbook_spec

    async def start_kernel(self, **kw: Any) -> None:  # type: ignore[override]
        """``AsyncKernelManager.start_kernel`` without the 10 ms sleep its ``in_pending_state``
        adds to every start ("so tests can capture the state"; a forked kernel answers ~40 ms
        after its request): pre-start, launch, post-start, then the ``ready`` future resolved
        as there."""
        self._ready = ready = asyncio.get_running_loop().create_future()
        self._attempted_start = True
        try:
            cmd, kw = await self._async_pre_start_kernel(**kw)
            await self._async_launch_kernel(cmd, **kw)
            await self._async_post_start_kernel(**kw)
        except Exception as exc:
            ready.set_exception(exc)
            ready.exception()  # the caller gets it raised; no "never retrieved" warning
            raise
        ready.set_result(None)


class Spawner:
    """Local ipykernel processes for one launcher: rlimits and (where the host allows) a
    cgroup each, every one registered with the launcher's kernel warden."""

    #: ipc sockets in the per-kernel run dir: no TCP port race when many kernels start at once.
    transport = "ipc"

    def __init__(
        self,
        settings: KernelSettings,
        *,
        run_root: Path | None = None,
        cgroups: Cgroups | None = None,
        python: KernelPython | None = None,
        start_slots: int = START_SLOTS,
        lifeline: Lifeline | None = None,
    ) -> None:
        """(Blocking the first time) ``cgroups``: where kernels' cgroups come from (default:
        what this host allows, detected once per process); ``python``: the kernel interpreter
        (default: ``settings.python``, inspected once); ``start_slots``: kernels started at
        once; ``lifeline``: the kernel warden's (default: a new one, started when first needed)."""
        self.settings = settings
        self.lifeline = lifeline or Lifeline()
        self.python = python or inspect_interpreter(settings.python)
        self.limits = ResourceLimits.from_settings(settings)
        self.packages_dir = Path(os.path.abspath(settings.packages.dir))
        self.packages_dir.mkdir(parents=True, exist_ok=True)
        #: Held by a launcher around each of its starts (at most ``start_slots`` at once; the
        #: others wait their turn, the start timeout counting from their own launch).
        self.slots = asyncio.Semaphore(start_slots)
        self.cgroups = cgroups or Cgroups.detected(memory_mb=settings.memory_mb, max_processes=settings.max_processes)
        # Per user: a second bot user on the same host must not trip over the first one's 0700 folder.
        parent = run_root or run_parent(settings.run_root, memory_capped=self.cgroups.caps_memory)
        self.run_root = parent / f"threadbook-{os.getuid()}"
        self.cache_dir = self.run_root / "cache"

    def sharing(self, *, start_slots: int) -> Spawner:
        """A spawner with this one's warden, cgroups, interpreter and run root, and start slots
        of its own (the forking launcher's, beside the launcher it wraps)."""
        return Spawner(
            self.settings,
            run_root=self.run_root.parent,
            cgroups=self.cgroups,
            python=self.python,
            start_slots=start_slots,
            lifeline=self.lifeline,
        )

    @property
    def isolation(self) -> str:
        """One line saying which resource isolation kernels get (start-up log, ``status``)."""
        return self.cgroups.describe()

    def kernel_spec(self, interrupt_mode: str) -> KernelSpec:
        """The ipykernel command line of the kernel interpreter (history in memory only, the
        kernel-side set-up run, modules from ``preload`` imported)."""
        argv = [
            str(self.python.executable),
            "-m",
            "ipykernel_launcher",
            "-f",
            "{connection_file}",
            "--HistoryManager.hist_file=:memory:",
        ]
        # "and None": an exec line's value is displayed (";" is not heeded there), and a thread's
        # ``_`` would be the last preloaded module.
        lines = [KERNEL_SETUP, *(f"__import__({module!r}) and None" for module in self.settings.preload)]
        argv.append(f"--IPKernelApp.exec_lines={lines!r}")
        return KernelSpec(argv=argv, display_name="Threadbook Python", language="python", interrupt_mode=interrupt_mode)

    def plan(
        self,
        workspace: Path,
        options: KernelOptions,
        *,
        environment: Callable[[Path], dict[str, str]],
        network: bool,
        identity: Identity | None,
    ) -> LaunchPlan:
        """One start's plan: a new kernel id and run dir, ``environment`` of that run dir,
        this spawner's limits and packages folder."""
        kernel_id = uuid.uuid4().hex[:12]  # short: the ipc socket paths under the run dir must fit 107 bytes
        run_dir = self.run_root / f"{RUN_DIR_PREFIX}{kernel_id}"
        return LaunchPlan(
            kernel_id=kernel_id,
            workspace=workspace,
            run_dir=run_dir,
            environment=environment(run_dir),
            limits=self.limits,
            data_dir=options.data_dir,
            network=network,
            packages_dir=self.packages_dir,
            identity=identity,
        )

    def provisioner_args(self, plan: LaunchPlan, manager: AsyncKernelManager) -> dict[str, Any]:
        """What every provisioner of this spawner is made with, for ``plan`` and ``manager``."""
        return {
            "plan": plan,
            "lifeline": self.lifeline,
            "cgroups": self.cgroups,
            "kernel_id": manager.kernel_id,
            "kernel_spec": manager.kernel_spec,
            "parent": manager,
        }

    def make_run_root(self) -> None:
        """(Blocking) make the run root unless it exists, and check it is the bot's own
        (:func:`kernels.host.runroot.make_private`)."""
        make_private(self.run_root)

    def make_run_dir(self, run_dir: Path) -> None:
        """(Blocking) make ``run_dir`` (0700, must not exist) and the shared cache folder."""
        self.make_run_root()
        (self.cache_dir / "matplotlib").mkdir(parents=True, exist_ok=True, mode=0o700)
        run_dir.mkdir(mode=0o700)

    async def open(self) -> None:
        """Check the run root is the bot's own (:meth:`make_run_root`) and start the kernel
        warden (:mod:`kernels.host.lifeline`); raises
        :class:`~kernels.seam.result.SandboxUnavailableError` (one line naming the fix) when
        either cannot be had: then no kernel could start safely anyway."""
        await asyncio.to_thread(self.make_run_root)
        await asyncio.to_thread(self.lifeline.ensure)

    async def close(self) -> None:
        """Close the lifeline: the warden kills every kernel of this spawner's launcher still
        running (none once the pool shut them down) and exits."""
        await asyncio.to_thread(self.lifeline.close)

    async def spawn(self, plan: LaunchPlan, *, spec: KernelSpec, provisioning: Provisioning) -> LocalKernelHandle:
        """Start a kernel as ``plan`` says, its process from the provisioner ``provisioning``
        makes, and wait until it answers (kernel_info + iopub); a failure leaves nothing
        behind and is a :class:`KernelStartError`."""
        await asyncio.to_thread(self.make_run_dir, plan.run_dir)
        manager = _Manager(transport=self.transport, connection_file=str(plan.run_dir / "kernel.json"))
        manager.ip = str(plan.run_dir / "ipc")
        manager._threadbook_spec = spec
        manager.kernel_id = plan.kernel_id
        client: AsyncKernelClient | None = None
        try:  # from here on a failure removes the run dir and becomes a KernelStartError
            manager.provisioner = provisioner = provisioning(plan, manager)
            with open(plan.run_dir / KERNEL_LOG, "ab") as log:  # the kernel keeps its own copy of the fd
                await manager.start_kernel(cwd=str(plan.workspace), stdout=log, stderr=log)
            # A message over the cap is refused by the socket itself, before pyzmq or the
            # session decode a byte of it (the display budget still applies below the cap).
            client = manager.client()
            client.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # the client's own context
            # A spawned kernel's channels connect before it has bound its sockets (a forked one's
            # once the fork server says it has: sockets_bound); ZMQ then retries every
            # RECONNECT_IVL (100 ms by default), which a fast start would wait out; doubling up
            # to a second, so a dead kernel's channels do not spin.
            client.context.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
            client.context.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
            await provisioner.sockets_bound()
            client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
            handle = LocalKernelHandle(manager=manager, client=client, run_dir=plan.run_dir)
            await wait_ready(handle, START_TIMEOUT_S)
            await handle.record_infrastructure()
            return handle
        except BaseException as exc:
            await _discard(manager, client, plan.run_dir)
            if isinstance(exc, Exception) and not isinstance(exc, KernelStartError):
                raise KernelStartError(f"could not start a kernel: {exc}") from exc
            raise


async def _discard(manager: AsyncKernelManager, client: AsyncKernelClient | None, run_dir: Path) -> None:
    if client is not None:
        client.stop_channels()
    try:
        if manager.has_kernel:
            await manager.shutdown_kernel(now=True)
    finally:
        await asyncio.to_thread(shutil.rmtree, run_dir, True)


class SpawningLauncher(Launcher, Protocol):
    """A launcher whose kernels a :class:`Spawner` spawns (locally or in bubblewrap): what
    the forking launcher wraps and the one-shots run like."""

    @property
    def spawner(self) -> Spawner:
        """Its spawner (warden, cgroups, interpreter, run root, start slots)."""

    @property
    def support(self) -> BwrapSupport | None:
        """The bubblewrap its kernels run in; None: unsandboxed."""

    @property
    def interrupt_mode(self) -> str:
        """How its kernels are interrupted: ``signal`` or ``message`` (the kernel spec's)."""

    def kernel_spec(self) -> KernelSpec:
        """The command line its kernels run."""

    def environment(self, workspace: Path, run_dir: Path, options: KernelOptions) -> dict[str, str]:
        """A kernel's environment (paths as the kernel sees them)."""

    def identity(self, workspace: Path) -> Identity | None:
        """Who a kernel of ``workspace`` runs as (None: the bot's own uid)."""
