"""Fork-server kernels: a pre-imported parent forks fresh ipykernel processes on request.

:class:`ForkServer` runs ``kernels/fork/zygote.py`` (see its docstring for the protocol and the
fork-safety rules) and talks JSON lines over its stdin/stdout. :class:`ForkingLauncher` wraps
a spawning launcher (plain or bubblewrap, :class:`~kernels.spawn.spawner.SpawningLauncher`):
it takes that launcher's plans and composes a :class:`~kernels.spawn.spawner.Spawner` sharing
its warden, cgroups and run root, to which it hands a provisioner that asks the fork server for
the process instead of spawning one; everything else (run dir, connection file, environment,
readiness check, handle) is the spawner's code, so a ``KernelSession`` behaves the same for
forked and spawned kernels. The forked process is represented by :class:`ForkedProcess`,
a ``Popen`` look-alike built on a pidfd: ``jupyter_client``'s ``LocalProvisioner`` then
signals its process group (interrupt, kill) and polls it exactly as for a spawned kernel.

Profiles (one fork server per launcher, see :meth:`ForkingLauncher.supports`):

* unsandboxed (``sandbox: none``): kernels with the default options;
* bubblewrap, bot running as root: the zygote runs inside one bwrap sandbox
  (:func:`kernels.sandbox.args.zygote_args`) and each child jails itself in its own
  namespaces and per-workspace uid before any user code (``kernels/fork/jail.py``); every
  kernel without network is forked (``network: true`` kernels need slirp4netns: spawned);
* bubblewrap, bot as a normal user (the Docker image): the zygote is root of an
  unprivileged user namespace, and each child builds the same jail, then moves into a user
  namespace of its own (uid 1000 there, the bot's uid on the host, no capabilities), as a
  kernel bwrap spawns would be.

Other starts, starts while the fork server is down, and failed forks go to the wrapped
launcher (spawn). A fork server that dies is restarted in the background with a growing
delay; kernels it forked keep running.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import select
import signal
import time
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from kernels.fork import ZYGOTE
from kernels.fork.jail import KERNEL_OOM_SCORE_ADJ
from kernels.forking.serverproc import ServerProcess
from kernels.host import proctree
from kernels.sandbox.args import SHM_INODES, SHM_SIZE_MB, TMP_INODES, TMP_SIZE_MB, WORKSPACE, zygote_args
from kernels.sandbox.identity import ZYGOTE as ZYGOTE_IDENTITY
from kernels.sandbox.identity import write_identity_files
from kernels.sandbox.support import BwrapSupport
from kernels.seam.options import KernelOptions
from kernels.seam.plan import KernelHandle, LaunchPlan
from kernels.seam.result import KernelStartError
from kernels.seam.wire import KERNEL_SETUP
from kernels.spawn.environment import child_setup
from kernels.spawn.process import ThreadbookProvisioner
from kernels.spawn.spawner import SpawningLauncher

log = logging.getLogger(__name__)

FORK_TIMEOUT_S = 10.0
#: How long the channels wait for a forked kernel to report its sockets bound before they
#: connect anyway (ZMQ then retries the connect until the kernel binds).
BOUND_TIMEOUT_S = 10.0
#: Forked kernels started at once: a fork costs ~70 ms of CPU, most of a start is waiting for
#: round trips, so four per core keep the cores busy through a burst (a spawn costs ~0.6 s
#: of CPU: spawned starts keep ``kernels.spawn.spawner.START_SLOTS``).
FORK_START_SLOTS = 4 * (os.cpu_count() or 1)


class ForkedProcess:
    """A ``Popen`` look-alike for a kernel the fork server forked (not our child)."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int, server: ForkServer, supervisor: int | None = None) -> None:
        """``supervisor``: a jailed kernel's pid 1 of its pid namespace (not its parent)."""
        self.pid = pid
        self.supervisor = supervisor
        self.returncode: int | None = None
        self._server = server
        self._server_start = server.starts  # which of the server's processes forked it
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone (and reaped): the exit report follows
            self._pidfd = None

    def _exited(self) -> bool:
        if self._pidfd is None:
            return True
        poller = select.poll()  # not select(): a busy bot has fds above 1024
        poller.register(self._pidfd, select.POLLIN)
        return bool(poller.poll(0))

    def poll(self) -> int | None:
        """The exit code once the process has ended (as reported by the fork server)."""
        if self.returncode is None and self._exited():
            code = self._server.exit_codes.pop(self.pid, None)
            if code is None and (not self._server.running or self._server.starts != self._server_start):
                code = 1  # orphaned by a dead fork server (maybe running again): the exit code is unknowable
            if code is not None:
                self._set_returncode(code)
        return self.returncode

    def _set_returncode(self, code: int) -> None:
        self.returncode = code
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def wait(self, timeout: float | None = None) -> int:
        """Block until the exit code is known (only called after ``poll`` returned one)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"process {self.pid} still running")
            time.sleep(0.01)
        return code

    def send_signal(self, signum: int) -> None:
        """Signal the process (through its pidfd: never a recycled pid)."""
        if self._pidfd is not None:
            signal.pidfd_send_signal(self._pidfd, signum)

    def kill(self) -> None:
        """SIGKILL the process."""
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM the process."""
        self.send_signal(signal.SIGTERM)


class ForkServer(ServerProcess):
    """Owns one zygote process; forks kernels through it; restarts it when it dies."""

    name = "fork server"
    fallback = "kernels are spawned"
    key = "fork-server"

    def __init__(self, launcher: ForkingLauncher) -> None:
        super().__init__(launcher.spawner)
        self.launcher = launcher
        self.preload = list(launcher.spawner.settings.preload)
        self.exit_codes: dict[int, int] = {}
        #: Jailed kernels' supervisors by kernel pid, until :meth:`fork` takes them.
        self._supervisors: dict[int, int] = {}
        self._pending: dict[int, asyncio.Future[int]] = {}
        #: Answered kernels whose sockets are not reported bound yet, by pid.
        self._unbound: dict[int, asyncio.Future[None]] = {}
        self._ids = itertools.count(1)

    async def _spawn(self) -> asyncio.subprocess.Process:
        # The zygote runs as a kernel would (its environment, in-sandbox paths), in its own run dir.
        spawner = self.launcher.spawner
        plan = self.launcher.spawn.plan(spawner.run_root, KernelOptions())
        run_dir = plan.run_dir
        self._folders.append(run_dir)  # removed by stop(), also when this start fails
        await asyncio.to_thread(spawner.make_run_dir, run_dir)
        env = dict(plan.environment)
        sandbox = self.launcher.sandbox
        if sandbox is None:
            prefix, mode = [], []
        else:
            await asyncio.to_thread(write_identity_files, run_dir, ZYGOTE_IDENTITY)
            prefix = zygote_args(sandbox, run_dir=run_dir, code_dir=code_dir(sandbox))
            mode = ["jail" if sandbox.as_root else "userns"]
        # Not frozen, and it dies with the bot by itself (its stdin, bwrap's --die-with-parent);
        # the warden takes its tree along too, the kernels still being forked in it included.
        with open(run_dir / "zygote.log", "ab") as log_file:
            return await asyncio.create_subprocess_exec(
                *prefix,
                str(spawner.python.executable),
                "-P",
                str(ZYGOTE),
                json.dumps(self.preload),
                str(self._lifeline_r),
                json.dumps(kernel_argv(self.launcher.kernel_spec().argv, self.preload)),
                *mode,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                env=env,
                cwd=run_dir,
                pass_fds=(self._lifeline_r,),
                start_new_session=True,
                limit=1 << 20,
                preexec_fn=child_setup(None),  # its own session keyring, a high OOM score
            )

    def _detail(self) -> str:
        return f", preloaded {', '.join(self.preload) or 'nothing'}"

    async def fork(
        self,
        *,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        log_path: str,
        limits: list[tuple[int, int]],
        jail: dict[str, Any] | None = None,
    ) -> ForkedProcess:
        """Fork one kernel process (``jail``: its namespaces and uid, sandboxed profile);
        raises :class:`KernelStartError` when the server cannot."""
        proc = self._proc
        if proc is None or not self.running or proc.stdin is None:
            raise KernelStartError("the fork server is not running")
        request_id = next(self._ids)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        request = {"id": request_id, "argv": argv, "cwd": cwd, "env": env, "log": log_path, "limits": limits}
        if jail is not None:
            request["jail"] = jail
        try:
            proc.stdin.write((json.dumps(request) + "\n").encode())
            await proc.stdin.drain()
            pid = await asyncio.wait_for(future, FORK_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            raise KernelStartError(f"the fork server did not fork: {exc!r}") from exc
        finally:
            self._pending.pop(request_id, None)
        return ForkedProcess(pid, self, self._supervisors.pop(pid, None))

    def _exited(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(KernelStartError("the fork server exited"))
        for pid in list(self._unbound):
            self._bound(pid)

    def _handle_message(self, message: dict[str, Any]) -> None:
        if "bound" in message:
            self._bound(message["bound"])
        elif "exit" in message:
            self.exit_codes[message["exit"]] = message["code"]
            self._bound(message["exit"])  # nobody waits for a dead kernel's sockets
        elif (future := self._pending.get(message["id"])) is not None and not future.done():
            if "pid" in message:
                if message.get("supervisor"):
                    self._supervisors[message["pid"]] = message["supervisor"]
                self._unbound[message["pid"]] = asyncio.get_running_loop().create_future()
                future.set_result(message["pid"])
            else:
                future.set_exception(KernelStartError(f"fork failed: {message['error']}"))

    def _bound(self, pid: int) -> None:
        future = self._unbound.pop(pid, None)
        if future is not None and not future.done():
            future.set_result(None)

    async def sockets_bound(self, pid: int) -> None:
        """Wait until forked kernel ``pid`` has bound its sockets (or exited, or the server did),
        :data:`BOUND_TIMEOUT_S` at most."""
        future = self._unbound.get(pid)
        if future is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(future), BOUND_TIMEOUT_S)
        except TimeoutError:
            self._unbound.pop(pid, None)  # connect anyway: ZMQ retries until it binds


class ForkProvisioner(ThreadbookProvisioner):
    """A provisioner whose process comes from the fork server (same plan, environment, limits
    and kill as a spawned kernel's)."""

    def __init__(self, *, server: ForkServer, jail: dict[str, Any] | None, **kwargs: Any) -> None:
        """``jail``: the sandboxed profile's namespaces and uid (see ``kernels/fork/jail.py``)."""
        super().__init__(**kwargs)
        self.server = server
        self.jail = jail

    async def launch_process(self, cmd: list[str], kwargs: dict[str, Any]) -> Any:
        """Fork the kernel with ``cmd``'s ipykernel arguments and the plan's cwd, environment
        and rlimits."""
        env = dict(kwargs.get("env") or self.plan.environment)
        env.pop("JPY_PARENT_PID", None)  # the lifeline ties the kernel to the bot instead
        log_path = getattr(kwargs.get("stdout"), "name", os.devnull)
        return await self.server.fork(
            argv=fork_argv(cmd, self.server.preload),
            cwd=str(WORKSPACE) if self.jail is not None else str(self.plan.workspace),
            env=env,
            log_path=str(log_path),
            limits=[(int(limit), int(value)) for limit, value in self.plan.limits.rlimits()],
            jail=self.jail,
        )

    async def cleanup(self, restart: bool = False) -> None:
        """Also: the kernel's tree no longer counts its supervisor."""
        pid = self.pid
        await super().cleanup(restart=restart)
        if pid is not None:
            proctree.forget(pid)

    async def sockets_bound(self) -> None:
        """Wait until the kernel has bound its sockets (the fork server says when)."""
        if self.pid is not None:
            await self.server.sockets_bound(self.pid)

    def roots(self) -> tuple[int, ...]:
        """The kernel's process and, jailed, its supervisor (pid 1 of its namespace, which
        adopts its orphans but is not its ancestor)."""
        supervisor = getattr(self.process, "supervisor", None)
        return (*super().roots(), *([] if supervisor is None else [supervisor]))

    async def after_launch(self, kwargs: dict[str, Any]) -> None:
        """Count a jailed kernel's supervisor in its tree (:func:`kernels.host.proctree.adopt`;
        the kernel warden has it already, :meth:`roots`) and move the tree into the kernel's
        cgroup: no user code has run yet, the kernel is ready only later. Its rlimits were set
        in the child."""
        if self.pid is not None and (supervisor := getattr(self.process, "supervisor", None)) is not None:
            proctree.adopt(self.pid, supervisor)
        if self.cgroup is not None and self.pid is not None:
            try:
                await asyncio.to_thread(self.cgroup.add_tree, self.pid)
            except OSError as exc:
                raise KernelStartError(f"could not move the forked kernel into its cgroup: {exc}") from exc


def code_dir(support: BwrapSupport) -> Path | None:
    """The folder of ``zygote.py`` when the sandboxed zygote needs it bound (no Python folder holds it)."""
    folder = ZYGOTE.parent.resolve()
    return None if any(root in folder.parents for root in support.host.python_dirs) else folder


def fork_argv(cmd: list[str], preload: list[str]) -> list[str]:
    """The ``IPKernelApp`` arguments of a kernel command, with exec_lines for a forked child."""
    args = cmd[cmd.index("ipykernel_launcher") + 1 :]
    args = [arg for arg in args if not arg.startswith("--IPKernelApp.exec_lines=")]
    lines = [KERNEL_SETUP, *(["%matplotlib inline"] if "matplotlib" in preload else [])]
    args.append(f"--IPKernelApp.exec_lines={lines!r}")
    return args


def kernel_argv(spec_argv: list[str], preload: list[str]) -> list[str]:
    """What :func:`fork_argv` gives every kernel of ``spec_argv`` but ``-f <connection file>``:
    the command line the zygote makes its kernel application for before it forks."""
    args = fork_argv(spec_argv, preload)
    if "-f" in args:
        at = args.index("-f")
        del args[at : at + 2]
    return args


def jail_for(plan: LaunchPlan, support: BwrapSupport) -> dict[str, Any]:
    """(Resolves paths) the ``jail`` of a fork request: what ``kernels/fork/jail.py`` builds
    for ``plan``'s kernel."""
    assert plan.identity is not None, "a sandboxed plan has an identity"
    return {
        "uid": plan.identity.uid,
        "gid": plan.identity.gid,
        "run_dir": str(plan.run_dir),
        "sources": {
            "workspace": os.path.realpath(plan.workspace),
            "run_dir": os.path.realpath(plan.run_dir),
            "data_dir": None if plan.data_dir is None else os.path.realpath(plan.data_dir),
            "packages_dir": None if plan.packages_dir is None else os.path.realpath(plan.packages_dir),
        },
        "hide": [] if (folder := code_dir(support)) is None else [str(folder)],
        "python_dirs": [str(path) for path in support.host.python_dirs],
        "tmp_mb": TMP_SIZE_MB,
        "shm_mb": SHM_SIZE_MB,
        "tmp_inodes": TMP_INODES,
        "shm_inodes": SHM_INODES,
        "oom_score_adj": KERNEL_OOM_SCORE_ADJ,
        "userns": not support.as_root,
    }


class ForkingLauncher:
    """Starts kernels by forking them from a :class:`ForkServer`, spawning when it cannot.

    Plans come from the wrapped spawn launcher, so a start that cannot fork is spawned with
    the very same plan."""

    def __init__(self, spawn: SpawningLauncher) -> None:
        """``spawn``: the launcher whose kernels are forked (plain, or bubblewrap: as root each
        kernel drops to its per-workspace uid; as a normal user each gets a user namespace)."""
        self.spawn = spawn
        self.spawner = spawn.spawner.sharing(start_slots=FORK_START_SLOTS)
        #: The sandbox whose kernels are forked (None: the unsandboxed profile).
        self.sandbox: BwrapSupport | None = spawn.support
        self.interrupt_mode = spawn.interrupt_mode
        self.server = ForkServer(self)
        #: Starts served by forking / by spawning (for benchmarks and tests).
        self.forked = 0
        self.spawned = 0

    @property
    def isolation(self) -> str:
        """One line saying which resource isolation kernels get (start-up log, ``status``)."""
        return self.spawn.isolation

    @property
    def available(self) -> bool:
        """Whether the next start can be a fork."""
        return self.server.running

    def fits(self, plan: LaunchPlan) -> bool:
        """Whether ``plan``'s kernel may be forked: sandboxed, any kernel without network
        (those need slirp4netns: spawned); unsandboxed, the default profile only."""
        if self.sandbox is not None:
            return not plan.network
        return plan.data_dir is None and plan.network == self.spawner.settings.network

    def kernel_spec(self) -> KernelSpec:
        """The spawn launcher's kernel spec (interrupt mode included)."""
        return self.spawn.kernel_spec()

    def kernel_view(self, options: KernelOptions) -> KernelOptions:
        """``options`` as the spawn launcher's kernels see them."""
        return self.spawn.kernel_view(options)

    def plan(self, workspace: Path, options: KernelOptions) -> LaunchPlan:
        """The spawn launcher's plan (in-sandbox paths and the kernel's uid under bubblewrap)."""
        return self.spawn.plan(workspace, options)

    def provisioner(self, plan: LaunchPlan, manager: AsyncKernelManager) -> ThreadbookProvisioner:
        """A :class:`ForkProvisioner` wired to this launcher's fork server."""
        return ForkProvisioner(
            server=self.server,
            jail=None if self.sandbox is None else jail_for(plan, self.sandbox),
            **self.spawner.provisioner_args(plan, manager),
        )

    async def attach(self, remote_id: str) -> KernelHandle | None:
        """None: local kernels cannot be taken over by another process."""
        return None

    async def open(self) -> None:
        """Start the kernel warden (raises when it cannot, see
        :meth:`~kernels.spawn.spawner.Spawner.open`), then the fork server (kernels are
        spawned until it is up)."""
        await self.spawner.open()
        await self.server.launch()

    async def close(self) -> None:
        """Stop the fork server (it kills the kernels it forked that still run), then the warden."""
        await self.server.stop()
        await self.spawner.close()

    async def start(self, plan: LaunchPlan) -> KernelHandle:
        """A forked kernel when the fork server is up and ``plan`` fits, else a spawned one."""
        if self.available and self.fits(plan):
            try:
                async with self.spawner.slots:
                    handle = await self.spawner.spawn(plan, spec=self.kernel_spec(), provisioning=self.provisioner)
                self.forked += 1
                return handle
            except KernelStartError:
                log.warning("forking a kernel failed; spawning one", exc_info=True)
        spawned = await self.spawn.start(plan)
        self.spawned += 1
        return spawned
