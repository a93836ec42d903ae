"""The sandboxed launcher: a plan carried out as ``bwrap ... -- python -m ipykernel_launcher``.

:class:`BwrapLauncher` composes a :class:`~kernels.spawn.spawner.Spawner` as the plain launcher
does; it makes plans with in-sandbox paths and the kernel's own uid, and hands the spawner a
:class:`BwrapProvisioner`, whose process is the kernel command behind the plan's bwrap prefix.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from kernels.host.interpreter import KernelPython
from kernels.sandbox.args import CACHE, DATA, PACKAGES, WORKSPACE, sandbox_args
from kernels.sandbox.identity import identity_for
from kernels.sandbox.slirp import Slirp, SlirpSupport, attach
from kernels.sandbox.support import BwrapSupport
from kernels.seam.options import KernelOptions
from kernels.seam.plan import Identity, KernelHandle, LaunchPlan
from kernels.seam.settings import KernelSettings
from kernels.spawn.environment import kernel_environment
from kernels.spawn.process import ThreadbookProvisioner
from kernels.spawn.spawner import Spawner

log = logging.getLogger(__name__)

NETWORK_WARNING = (
    "a channel asked for network: true, but its kernels run without network: %s "
    "(slirp4netns gives a sandboxed kernel network without exposing the host's loopback)"
)


class BwrapProvisioner(ThreadbookProvisioner):
    """Launches the kernel inside bwrap; kills the sandbox's init first so no bwrap is left a zombie."""

    def __init__(self, *, prefix: list[str], network: SlirpSupport | None, **kwargs: Any) -> None:
        """``prefix``: the plan's bwrap command (:func:`kernels.sandbox.args.sandbox_args`);
        ``network``: slirp4netns, for a plan with network."""
        super().__init__(**kwargs)
        self.prefix = prefix
        self.network = network
        self.slirp: Slirp | None = None

    async def launch_process(self, cmd: list[str], kwargs: dict[str, Any]) -> Any:
        """``bwrap ... -- prlimit ... -- [setpriv ... --] python -m ipykernel_launcher ...``."""
        return await super().launch_process([*self.prefix, *cmd], kwargs)

    async def after_launch(self, kwargs: dict[str, Any]) -> None:
        """The rlimits are set inside the sandbox; a kernel with network returns only once
        ``tap0`` is configured."""
        if self.network is not None and self.process is not None:
            self.slirp = await asyncio.to_thread(attach, self.network, self.process, log=kwargs.get("stderr"))

    async def kill(self, restart: bool = False) -> None:
        """SIGKILL bwrap's child (pid 1 of the kernel's pid namespace: the kernel takes every
        process in it along), let the outer bwrap exit and be reaped, then kill what is left."""
        if self.process is not None and self.process.poll() is None:
            for child in await asyncio.to_thread(_children, self.pid):
                try:
                    child.kill()
                except psutil.Error:
                    pass
            await asyncio.to_thread(_wait_exit, self.process, 1.0)
        await super().kill(restart=restart)
        await self._stop_slirp()

    async def cleanup(self, restart: bool = False) -> None:
        """Also end slirp4netns if the kernel died on its own."""
        await self._stop_slirp()
        await super().cleanup(restart=restart)

    async def _stop_slirp(self) -> None:
        slirp, self.slirp = self.slirp, None
        if slirp is not None:
            await asyncio.to_thread(slirp.stop)


def _children(pid: int | None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children() if pid is not None else []
    except psutil.Error:
        return []


def _wait_exit(process: Any, timeout: float) -> None:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


class BwrapLauncher:
    """A :class:`~kernels.seam.plan.Launcher` whose kernels its :class:`Spawner` spawns in
    the bubblewrap sandbox."""

    interrupt_mode = "message"

    def __init__(
        self,
        settings: KernelSettings,
        *,
        support: BwrapSupport,
        network: SlirpSupport | None = None,
        network_missing: str = "slirp4netns was not probed",
        run_root: Path | None = None,
        python: KernelPython | None = None,
    ) -> None:
        """``support``: the bubblewrap probed; ``network``: how ``network: true`` kernels get
        it; None keeps them offline (one warning quoting ``network_missing``)."""
        self.spawner = Spawner(settings, run_root=run_root, python=python)
        self.support = support
        self.network = network
        self.network_missing = network_missing
        self._network_warned = False

    @property
    def isolation(self) -> str:
        """One line saying which resource isolation kernels get (start-up log, ``status``)."""
        return self.spawner.isolation

    def kernel_spec(self) -> KernelSpec:
        """The ipykernel command line of the kernel interpreter, interrupted by a message (a
        signal cannot cross into the sandbox's pid namespace)."""
        return self.spawner.kernel_spec(self.interrupt_mode)

    def kernel_view(self, options: KernelOptions) -> KernelOptions:
        """Inside: ``data_dir`` is ``/data``; network only where asked and slirp4netns works."""
        return KernelOptions(
            data_dir=DATA if options.data_dir is not None else None,
            network=options.network and self.network is not None,
        )

    def plan(self, workspace: Path, options: KernelOptions) -> LaunchPlan:
        """One start's plan: in-sandbox paths, the kernel's own uid; network only where
        slirp4netns can give it (one warning where it cannot)."""
        if options.network and self.network is None and not self._network_warned:
            self._network_warned = True
            log.warning(NETWORK_WARNING, self.network_missing)
        return self.spawner.plan(
            workspace,
            options,
            environment=lambda run_dir: self.environment(workspace, run_dir, options),
            network=self.kernel_view(options).network,
            identity=self.identity(workspace),
        )

    def environment(self, workspace: Path, run_dir: Path, options: KernelOptions) -> dict[str, str]:
        """In-sandbox paths: ``HOME=/workspace``, ``/data``, ``/packages``, caches in ``/tmp``."""
        python = self.spawner.python
        env = kernel_environment(
            python=python,
            workspace=WORKSPACE,
            run_dir=run_dir,
            cache_dir=CACHE,
            data_dir=self.kernel_view(options).data_dir,
            packages_dir=PACKAGES,
        )
        env["PATH"] = os.pathsep.join([str(python.bin_dir), "/usr/local/bin", "/usr/bin", "/bin"])
        env["XDG_CACHE_HOME"] = str(CACHE)  # font and other caches stay out of the workspace
        return env

    def identity(self, workspace: Path) -> Identity:
        """The kernel's own uid (per workspace as root, 1000 of its user namespace otherwise)."""
        return identity_for(workspace, as_root=self.support.as_root)

    def provisioner(self, plan: LaunchPlan, manager: AsyncKernelManager) -> ThreadbookProvisioner:
        """A :class:`BwrapProvisioner` with the plan's bwrap command."""
        return BwrapProvisioner(
            prefix=sandbox_args(self.support, plan),
            network=self.network if plan.network else None,
            **self.spawner.provisioner_args(plan, manager),
        )

    async def attach(self, remote_id: str) -> KernelHandle | None:
        """None: local kernels cannot be taken over by another process."""
        return None

    async def open(self) -> None:
        """Start the kernel warden (see :meth:`Spawner.open`)."""
        await self.spawner.open()

    async def close(self) -> None:
        """Close the lifeline: the warden kills what of this launcher still runs, and exits."""
        await self.spawner.close()

    async def start(self, plan: LaunchPlan) -> KernelHandle:
        """Start a sandboxed kernel as ``plan`` says and wait until it answers; at most the
        spawner's start slots run at once."""
        async with self.spawner.slots:
            return await self.spawner.spawn(plan, spec=self.kernel_spec(), provisioning=self.provisioner)
