"""The provisioner that owns one local kernel process: a ``jupyter_client`` ``LocalProvisioner``
for one :class:`~kernels.seam.plan.LaunchPlan`.

:class:`ThreadbookProvisioner` is constructed with the plan and never changed afterwards: it
replaces the environment with the plan's, hands the workspace and run dir to the plan's
identity (sandboxed kernels), launches off the event loop in a new session (own process group)
through :meth:`ThreadbookProvisioner.launch_process` (the bubblewrap launcher's provisioner
prefixes ``bwrap``, the forking launcher's forks instead), then
:meth:`ThreadbookProvisioner.after_launch` (here: the rlimits; the sandbox sets them inside
bwrap), and on kill takes down the whole group plus any descendant that left it.

Where the host allows it every kernel gets its own cgroup (:mod:`kernels.host.cgroups`),
entered in the child's ``preexec_fn`` (:func:`~kernels.spawn.environment.child_setup`) before
any of its code runs; every kernel is registered with the launcher's kernel warden
(:mod:`kernels.host.lifeline`) before it can be frozen, so it dies with the bot, frozen or not.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

import psutil
from jupyter_client.launcher import launch_kernel
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from kernels.host import leftovers
from kernels.host.cgroups import Cgroups, KernelCgroup
from kernels.host.lifeline import Lifeline
from kernels.sandbox.identity import prepare_run_dir
from kernels.seam.plan import LaunchPlan
from kernels.seam.result import KernelStartError
from kernels.spawn.environment import child_setup


class ThreadbookProvisioner(LocalProvisioner):
    """A ``LocalProvisioner`` for one :class:`LaunchPlan`: the plan's environment, identity
    and rlimits, a per-kernel cgroup and whole-group kill; the kernel is registered with the
    launcher's :class:`~kernels.host.lifeline.Lifeline` so it dies with the bot."""

    def __init__(self, *, plan: LaunchPlan, lifeline: Lifeline, cgroups: Cgroups | None = None, **kwargs: Any) -> None:
        """``lifeline``: the kernel warden's (kills this kernel if the bot dies); ``cgroups``:
        where this kernel's cgroup comes from (None or disabled: rlimits only); ``kwargs`` go
        to ``LocalProvisioner`` (``kernel_id``, ``kernel_spec``, ``parent``)."""
        super().__init__(**kwargs)
        self.plan = plan
        self.lifeline = lifeline
        self.cgroups = cgroups
        self.cgroup: KernelCgroup | None = None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Replace whatever environment the manager passes with the plan's; write the
        connection file (base class); hand the kernel's files to its identity."""
        kwargs["env"] = dict(self.plan.environment)
        kwargs = await super().pre_launch(**kwargs)
        if self.plan.identity is not None:
            await asyncio.to_thread(prepare_run_dir, self.plan)
        return kwargs

    def _finalize_env(self, env: dict[str, str]) -> None:
        # The base class may add variables; keep exactly the plan's.
        for name in set(env) - set(self.plan.environment):
            del env[name]

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        """Start the process in its own session and cgroup, both registered with the kernel
        warden (raises :class:`~kernels.host.lifeline.WardenUnavailableError`, a
        ``KernelStartError``, when there is none), then finish its set-up."""
        self.cgroup = await self.make_cgroup()
        try:
            await asyncio.to_thread(self.lifeline.ensure)
            self.process = await self.launch_process(cmd, kwargs)
        except BaseException:
            await self.remove_cgroup()
            raise
        self.pid = self.pgid = self.process.pid  # a new session: the kernel leads its group
        self.cwd = kwargs.get("cwd")
        try:
            await asyncio.to_thread(self.lifeline.add_process, self.plan.kernel_id, *self.roots())
            await self.after_launch(kwargs)
        except BaseException:
            await self.kill()
            raise
        return self.connection_info

    async def launch_process(self, cmd: list[str], kwargs: dict[str, Any]) -> Any:
        """The kernel process (a ``Popen`` or look-alike), started off the event loop."""
        popen_kwargs = LocalProvisioner._scrub_kwargs(kwargs)
        popen_kwargs["preexec_fn"] = child_setup(self.cgroup)
        return await asyncio.to_thread(launch_kernel, cmd, **popen_kwargs)

    async def sockets_bound(self) -> None:
        """Wait until the kernel has bound its sockets, where its process can tell (a forked
        one: :class:`kernels.forking.launcher.ForkProvisioner`); here at once: the channels
        retry their connect until it binds."""

    def roots(self) -> tuple[int, ...]:
        """The processes the kernel's whole tree hangs from (the kernel warden kills each
        tree): here the kernel's process."""
        return () if self.pid is None else (self.pid,)

    async def after_launch(self, kwargs: dict[str, Any]) -> None:
        """Set-up once the process exists (here: its rlimits); a failure kills it."""
        assert self.process is not None
        pid = self.process.pid
        for limit, value in self.plan.limits.rlimits():
            resource.prlimit(pid, limit, (value, value))

    async def kill(self, restart: bool = False) -> None:
        """SIGKILL the process group and every descendant, even ones that called setsid."""
        if self.process is None:
            return
        descendants = await asyncio.to_thread(descendants_of, self.pid)
        await super().kill(restart=restart)
        for proc in descendants:
            try:
                proc.kill()
            except psutil.Error:
                pass

    async def cleanup(self, restart: bool = False) -> None:
        """Also kill what is left in the kernel's cgroup and remove it; the warden forgets it."""
        await self.remove_cgroup()
        await asyncio.to_thread(self.lifeline.drop, self.plan.kernel_id)
        await super().cleanup(restart=restart)

    async def make_cgroup(self) -> KernelCgroup | None:
        """A new cgroup for this kernel, registered with the kernel warden, or None without cgroups."""
        if self.cgroups is None or not self.cgroups.enabled:
            return None
        try:
            return await asyncio.to_thread(self._create_cgroup, self.cgroups)
        except OSError as exc:
            raise KernelStartError(f"could not create the kernel's cgroup: {exc}") from exc

    def _create_cgroup(self, cgroups: Cgroups) -> KernelCgroup | None:
        cgroup = cgroups.create(self.plan.kernel_id)
        if cgroup is not None:
            try:
                self.lifeline.add_cgroup(self.plan.kernel_id, cgroup.folders)
            except BaseException:
                cgroup.remove()
                raise
        return cgroup

    async def remove_cgroup(self) -> None:
        """Kill whatever is left in the kernel's cgroup and remove it (logged, never raised)."""
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is not None:
            await asyncio.to_thread(cgroup.remove)

    async def wait(self) -> int | None:
        """Wait for the process to exit, polling quickly at first."""
        if self.process is None:
            return 0
        delay = 0.005
        while self.process.poll() is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
        code: int | None = await super().wait()
        return code


def descendants_of(pid: int | None) -> list[psutil.Process]:
    """(Blocking) ``pid``'s descendants now, without ``pid`` itself (none when it is gone)."""
    return leftovers.process_tree(pid)[1:]
