"""The plain local launcher (``sandbox: none``): kernels spawned as the bot's own user.

:class:`KernelLauncher` composes a :class:`~kernels.spawn.spawner.Spawner`: it makes plans with
host paths and no identity, and hands the spawner the plain
:class:`~kernels.spawn.process.ThreadbookProvisioner` (a ``Popen`` in a new session, rlimits set
once the process exists, a cgroup entered before any of its code runs).

Limits without a sandbox: the rlimits of :meth:`kernels.seam.plan.ResourceLimits.rlimits`;
``RLIMIT_NPROC`` is ignored for root, so as root a fork bomb is bounded only by the execution
timeout (interrupt, then kill of the whole process group); the sandbox (:mod:`kernels.bwrap`)
gives each kernel its own pid namespace and uid. Where the host allows it, every kernel also
gets its own cgroup (:mod:`kernels.host.cgroups`: memory for all its processes together, pids,
CPU weight), together with ``oom_score_adj`` 1000 and a new session keyring
(:func:`kernels.spawn.environment.child_setup`); what a cell leaves running is killed after it
(:mod:`kernels.host.leftovers`).
"""

from __future__ import annotations

from pathlib import Path

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from kernels.host.cgroups import Cgroups
from kernels.host.interpreter import KernelPython
from kernels.host.lifeline import Lifeline
from kernels.sandbox.support import BwrapSupport
from kernels.seam.options import KernelOptions
from kernels.seam.plan import Identity, KernelHandle, LaunchPlan
from kernels.seam.settings import KernelSettings
from kernels.spawn.environment import kernel_environment
from kernels.spawn.process import ThreadbookProvisioner
from kernels.spawn.spawner import START_SLOTS, Spawner


class KernelLauncher:
    """The plain :class:`~kernels.seam.plan.Launcher`: local ipykernel processes with rlimits
    and (where the host allows) a cgroup each, spawned by its :class:`Spawner`."""

    interrupt_mode = "signal"
    #: No bubblewrap: kernels run as the bot's own user.
    support: BwrapSupport | None = None

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
        """(Blocking the first time) the arguments make its :class:`Spawner` (see there)."""
        self.spawner = Spawner(
            settings, run_root=run_root, cgroups=cgroups, python=python, start_slots=start_slots, lifeline=lifeline
        )

    @property
    def isolation(self) -> str:
        """One line saying which resource isolation kernels get (start-up log, ``status``)."""
        return self.spawner.isolation

    def kernel_spec(self) -> KernelSpec:
        """The ipykernel command line of the kernel interpreter, interrupted by a signal."""
        return self.spawner.kernel_spec(self.interrupt_mode)

    def kernel_view(self, options: KernelOptions) -> KernelOptions:
        """``options`` as code inside the kernel sees them (unsandboxed: as they are)."""
        return options

    def plan(self, workspace: Path, options: KernelOptions) -> LaunchPlan:
        """One start's plan: host paths, the bot's own uid, network as asked."""
        return self.spawner.plan(
            workspace,
            options,
            environment=lambda run_dir: self.environment(workspace, run_dir, options),
            network=self.kernel_view(options).network,
            identity=self.identity(workspace),
        )

    def environment(self, workspace: Path, run_dir: Path, options: KernelOptions) -> dict[str, str]:
        """The kernel's environment (unsandboxed: host paths)."""
        return kernel_environment(
            python=self.spawner.python,
            workspace=workspace,
            run_dir=run_dir,
            cache_dir=self.spawner.cache_dir,
            data_dir=options.data_dir,
            packages_dir=self.spawner.packages_dir,
        )

    def identity(self, workspace: Path) -> Identity | None:
        """Who the kernel runs as (unsandboxed: the bot's own uid, None)."""
        return None

    def provisioner(self, plan: LaunchPlan, manager: AsyncKernelManager) -> ThreadbookProvisioner:
        """The provisioner that carries out ``plan`` for ``manager``: a plain ``Popen``."""
        return ThreadbookProvisioner(**self.spawner.provisioner_args(plan, manager))

    async def attach(self, remote_id: str) -> KernelHandle | None:
        """None: local kernels cannot be taken over by another process."""
        return None

    async def open(self) -> None:
        """Check the run root and start the kernel warden (see :meth:`Spawner.open`)."""
        await self.spawner.open()

    async def close(self) -> None:
        """Close the lifeline: the warden kills what of this launcher still runs, and exits."""
        await self.spawner.close()

    async def start(self, plan: LaunchPlan) -> KernelHandle:
        """Start a kernel as ``plan`` says and wait until it answers; at most ``start_slots``
        starts run at once, the others wait their turn."""
        async with self.spawner.slots:
            return await self._start(plan)

    async def _start(self, plan: LaunchPlan) -> KernelHandle:
        return await self.spawner.spawn(plan, spec=self.kernel_spec(), provisioning=self.provisioner)
