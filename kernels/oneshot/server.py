"""The one-shot fork server: the bot's own one-shots (upload previews, ``export html``) forked
from a parent that imported their code once, instead of a fresh interpreter each.

A fresh ``python -I -m threadbook_kernel.preview`` pays its pandas import on every upload
(~0.4 s, 0.4-1.7 s when the machine is busy). :class:`OneShotServer` runs
``kernels/fork/oneshot_zygote.py`` (see its docstring for the protocol) in the kernels'
sandbox: it imports the one-shot modules, prepares them (templates compiled, lazy imports
done) on input it makes itself, and forks a process per job that is confined as a spawned
one-shot is (its own pid namespace, uid, scratch folder, rlimits, and its cgroup before it is
given its job) and shares nothing with the jobs before it but what the imports made.

Job processes are made ahead of need (:data:`AHEAD` of them, :class:`Ahead`): confining one
and moving it into its cgroup takes ~5-25 ms (a cgroup v1 migration waits for an RCU grace
period), which a job then does not wait for; :mod:`kernels.oneshot.runner` takes one per job.

Like the kernels' fork server (both are a :class:`~kernels.forking.serverproc.ServerProcess`)
it dies with the bot (its standard input closes; the kernel warden kills its tree), is
restarted in the background with a growing delay when it dies, and one-shots are spawned
while it is not running.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels.bwrap.launcher import BwrapLauncher
from kernels.fork import ONESHOT_ZYGOTE
from kernels.forking.launcher import code_dir, jail_for
from kernels.forking.serverproc import ServerProcess
from kernels.host.cgroups import KernelCgroup
from kernels.host.leftovers import process_tree
from kernels.local.launcher import KernelLauncher
from kernels.sandbox.args import WORKSPACE, zygote_args
from kernels.sandbox.identity import ZYGOTE as ZYGOTE_IDENTITY
from kernels.sandbox.identity import write_identity_files
from kernels.seam.options import KernelOptions
from kernels.seam.plan import LaunchPlan
from kernels.seam.result import KernelStartError
from kernels.spawn.environment import PACKAGES_ENV, child_setup
from kernels.spawn.spawner import SpawningLauncher

log = logging.getLogger(__name__)

PROGRAM = ONESHOT_ZYGOTE
#: What the one-shot zygote imports (and prepares) before it serves: the one-shot modules and
#: the libraries they import on first use. A library the kernel environment lacks is skipped.
PRELOAD = (
    "threadbook_kernel.preview",
    "threadbook_kernel.export",
    "pandas",
    "openpyxl",
    "pyarrow.parquet",
    "nbformat",
    "nbconvert",
    "bleach",
    "bs4",
)
#: How long a fork request may wait for its answer, and a job for a process made ahead.
FORK_TIMEOUT_S = 10.0
#: Job processes kept made ahead: two per core (as many as run at once).
AHEAD = max(4, 2 * (os.cpu_count() or 1))
#: A pause after a process could not be made ahead (the server is restarting, say).
AHEAD_RETRY_S = 1.0
#: Scratch folder name of the server (``oneshot-<bot pid>-…``: a dead bot's is removed at start).
SERVER_FOLDER = "oneshot-{pid}-server-{id}"


#: Makes a job's plan, scratch folder and cgroup (:mod:`kernels.oneshot.runner`), and throws them away.
Prepare = Callable[[], Awaitable[tuple[LaunchPlan, KernelCgroup | None]]]
Discard = Callable[[LaunchPlan], Awaitable[None]]


@dataclass
class Ahead:
    """A job's process made ahead: confined, in its cgroup, waiting for its job on :attr:`channel`."""

    plan: LaunchPlan
    cgroup: KernelCgroup | None
    pid: int
    pidfd: int | None
    #: Its standard output and error.
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    channel: socket.socket
    #: Its exit code (as ``Popen`` gives it), reported by the server.
    exited: asyncio.Future[int]
    transports: list[asyncio.BaseTransport] = field(default_factory=list)
    #: Handed to a job (and not finished yet).
    taken: bool = False

    async def send(self, argv: list[str], input_fd: int | None) -> None:
        """Give the process its job: ``python -I ARGV``, ``input_fd`` (the bot's descriptor) under its number."""
        message = json.dumps({"argv": argv, "input_fd": input_fd}).encode()
        await _send(self.channel, message, [] if input_fd is None else [input_fd])

    async def ended(self) -> int:
        """The job's exit code: as it reports it on its socket once its output is written and
        closed (before its process is torn down), else as the server reports its exit."""
        report: asyncio.Future[bytes] = asyncio.ensure_future(asyncio.get_running_loop().sock_recv(self.channel, 256))
        waited: set[asyncio.Future[Any]] = {report, self.exited}
        try:
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
            if report.done() and not report.cancelled() and report.exception() is None:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    return int(json.loads(report.result())["exit"])
        finally:
            report.cancel()
        return await self.exited

    def kill(self) -> None:
        """SIGKILL the job: every process of its pid namespace (sandboxed), its group and what it started."""
        if self.exited.done():
            return
        for proc in process_tree(self.pid)[1:]:
            with contextlib.suppress(Exception):
                proc.kill()  # psutil checks it is still the same process
        kill(self.pidfd, self.pid)

    def release(self) -> None:
        """Release the bot's descriptors of the job (its process is killed or has ended)."""
        self.channel.close()
        for transport in self.transports:
            transport.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def forkable(launcher: SpawningLauncher) -> bool:
    """Whether ``launcher``'s one-shots can come from a one-shot fork server: the plain local
    launchers (unsandboxed or bubblewrap) can, a launcher wrapping one (the fork server's) cannot."""
    return type(launcher) in (KernelLauncher, BwrapLauncher)


class OneShotServer(ServerProcess):
    """Owns the one-shot zygote; forks jobs through it; restarts it when it dies."""

    name = "one-shot fork server"
    fallback = "one-shots are spawned"
    key = "oneshot-server"

    def __init__(self, launcher: SpawningLauncher, *, prepare: Prepare, discard: Discard, ahead: int = AHEAD) -> None:
        """``launcher``: the local spawning launcher whose interpreter, sandbox, run root and
        kernel warden the one-shots share (unsandboxed, or bubblewrap); ``prepare`` and
        ``discard`` make and remove a job's plan, scratch folder and cgroup; ``ahead``: how
        many job processes to keep made ahead."""
        if not forkable(launcher):
            raise ValueError(f"no one-shot fork server for {type(launcher).__name__}")
        super().__init__(launcher.spawner)
        self.launcher = launcher
        self._prepare = prepare
        self._discard = discard
        self.ahead = ahead
        self._made: collections.deque[Ahead] = collections.deque()
        self._making: set[asyncio.Task[None]] = set()
        #: Jobs taken and not finished.
        self._busy = 0
        #: Cgroups of finished jobs being removed (once their processes are gone).
        self._removing: set[asyncio.Task[bool]] = set()
        self._changed = asyncio.Event()
        #: The bubblewrap the one-shots run in (the launcher's kernels'); None: unsandboxed.
        self.support = launcher.support
        self.exits: dict[int, asyncio.Future[int]] = {}
        self._channel: socket.socket | None = None
        self._pending: dict[int, asyncio.Future[int]] = {}
        self._ids = itertools.count(1)
        #: Jobs forked by it.
        self.forked = 0

    def jail(self, plan: LaunchPlan) -> dict[str, Any] | None:
        """The confinement of a job with ``plan`` (None unsandboxed), see ``kernels/fork/jail.py``."""
        return None if self.support is None else jail_for(plan, self.support)

    async def _spawn(self) -> asyncio.subprocess.Process:
        launcher = self.launcher
        folder = launcher.spawner.run_root / SERVER_FOLDER.format(pid=os.getpid(), id=uuid.uuid4().hex[:8])
        run_dir = folder / "run"
        self._folders.append(folder)  # removed by stop(), also when this start fails
        await asyncio.to_thread(_make_folder, launcher, run_dir)
        env = launcher.environment(folder / "work", run_dir, KernelOptions())
        env.pop(PACKAGES_ENV, None)  # one-shots never see the shared packages folder
        if (support := self.support) is None:
            prefix, mode = [], []
        else:
            await asyncio.to_thread(write_identity_files, run_dir, ZYGOTE_IDENTITY)
            prefix = zygote_args(support, run_dir=run_dir, code_dir=code_dir(support))
            mode = ["jail" if support.as_root else "userns"]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(run_dir / "zygote.log", "ab") as log_file:
                proc = await asyncio.create_subprocess_exec(
                    *prefix,
                    str(launcher.spawner.python.executable),
                    "-I",
                    str(PROGRAM),
                    json.dumps(PRELOAD),
                    str(self._lifeline_r),
                    *mode,
                    stdin=theirs.fileno(),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log_file,
                    env=env,
                    cwd=run_dir,
                    pass_fds=(self._lifeline_r,),
                    start_new_session=True,
                    limit=1 << 20,
                    preexec_fn=child_setup(None),  # its own session keyring, a high OOM score
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._channel = ours
        return proc

    def _started(self) -> None:
        self._refill()

    async def take(self) -> Ahead | None:
        """A job process made ahead (waiting for one while they are being made); None when the
        server is not running or none came within :data:`FORK_TIMEOUT_S` (the job is spawned)."""
        deadline = asyncio.get_running_loop().time() + FORK_TIMEOUT_S
        while self.running and not self._closed:
            while self._made:
                ahead = self._made.popleft()
                if not ahead.exited.done():
                    ahead.taken = True
                    self._busy += 1
                    self._refill()
                    return ahead
                self._refill()
                await self._throw_away(ahead)  # it died waiting (its server stopped, say)
            self._refill()
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), max(deadline - asyncio.get_running_loop().time(), 0))
            except TimeoutError:
                return None
        return None

    def _refill(self) -> None:
        """Make job processes ahead until :attr:`ahead` are ready or being made. While jobs run
        and half of them are still ready, the next waits until no job runs: making one (a fork
        of the server, the jail, the cgroup) would take its CPU from the jobs, and a lone
        preview would wait for it."""
        if self._busy and len(self._made) >= self.ahead // 2:
            return  # finish() calls again
        while self.running and not self._closed and len(self._made) + len(self._making) < self.ahead:
            task = asyncio.create_task(self._make_one(), name="oneshot-ahead")
            self._making.add(task)
            task.add_done_callback(self._making.discard)

    async def _make_one(self) -> None:
        try:
            ahead = await self._make()
        except Exception:
            log.warning("making a one-shot process ahead failed", exc_info=True)
            await asyncio.sleep(AHEAD_RETRY_S)
        else:
            if self.running and not self._closed:
                self._made.append(ahead)
            else:
                await self._throw_away(ahead)
        finally:
            self._changed.set()

    async def _make(self) -> Ahead:
        """Fork one job process for a fresh plan, and move it into the plan's cgroup."""
        plan, cgroup = await self._prepare()
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        pid: int | None = None
        ahead: Ahead | None = None
        try:
            try:
                pid = await self._fork(plan, [out_w, err_w, theirs.fileno()])
            finally:
                for end in (out_w, err_w):
                    os.close(end)
                theirs.close()
            pidfd: int | None = None
            with contextlib.suppress(ProcessLookupError):
                pidfd = os.pidfd_open(pid)
            stdout, out_transport = await _pipe_reader(out_r)
            out_r = -1
            stderr, err_transport = await _pipe_reader(err_r)
            err_r = -1
            ahead = Ahead(
                plan=plan,
                cgroup=cgroup,
                pid=pid,
                pidfd=pidfd,
                stdout=stdout,
                stderr=stderr,
                channel=ours,
                exited=self.exits[pid],
                transports=[out_transport, err_transport],
            )
            if cgroup is not None:
                await asyncio.to_thread(cgroup.add, pid)  # it has started nothing: it alone
            return ahead
        except BaseException:
            for end in (out_r, err_r):
                if end >= 0:
                    os.close(end)
            if ahead is not None:
                await self._throw_away(ahead)
            else:
                ours.close()
                if pid is not None:
                    kill(None, pid)  # pid 1 of its namespace / its group: not reaped before it is reported
                    self.forget(pid)
                if cgroup is not None:
                    await asyncio.to_thread(cgroup.remove)
                await self._discard(plan)
            raise

    async def finish(self, ahead: Ahead) -> None:
        """The job of ``ahead`` is over: kill what is left of it (unless it said it ended),
        release it, and remove its cgroup in the background (that waits until its last
        process is gone, a few milliseconds for a copy of the zygote; :meth:`stop` waits for it)."""
        if not ahead.exited.done():
            await asyncio.to_thread(ahead.kill)
        ahead.release()
        self.forget(ahead.pid)
        if ahead.taken:
            ahead.taken = False
            self._busy -= 1
            self._refill()
        cgroup, ahead.cgroup = ahead.cgroup, None
        if cgroup is not None:
            task = asyncio.create_task(asyncio.to_thread(cgroup.remove), name="oneshot-cgroup-remove")
            self._removing.add(task)
            task.add_done_callback(self._removing.discard)

    async def _throw_away(self, ahead: Ahead) -> None:
        await self.finish(ahead)
        await self._discard(ahead.plan)

    async def _fork(self, plan: LaunchPlan, fds: list[int]) -> int:
        """Fork one job process for ``plan`` (``fds``: its stdout and stderr write ends and its
        end of its socket); its pid. Raises :class:`KernelStartError` when the server cannot."""
        channel = self._channel
        if channel is None or not self.running:
            raise KernelStartError("the one-shot fork server is not running")
        request_id = next(self._ids)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        request = {
            "id": request_id,
            "cwd": str(WORKSPACE) if self.support is not None else str(plan.workspace),
            "env": dict(plan.environment),
            "limits": [(int(limit), int(value)) for limit, value in plan.limits.rlimits()],
            "jail": self.jail(plan),
        }
        try:
            await _send(channel, json.dumps(request).encode(), fds)
            pid = await asyncio.wait_for(future, FORK_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            raise KernelStartError(f"the one-shot fork server did not fork: {exc!r}") from exc
        finally:
            self._pending.pop(request_id, None)
        self.forked += 1
        return pid

    def _exited(self) -> None:
        self._close_input()
        for future in [*self._pending.values(), *self.exits.values()]:
            if not future.done():
                future.set_exception(KernelStartError("the one-shot fork server exited"))
        self._changed.set()  # a job waiting for a process made ahead spawns instead

    def _handle_message(self, message: dict[str, Any]) -> None:
        if "exit" in message:
            done = self.exits.get(message["exit"])
            if done is not None and not done.done():
                done.set_result(int(message["code"]))
        elif (future := self._pending.get(message["id"])) is not None and not future.done():
            if "pid" in message:
                # Known before the answer is: a quick job's exit report may follow at once.
                self.exits[message["pid"]] = asyncio.get_running_loop().create_future()
                future.set_result(message["pid"])
            else:
                future.set_exception(KernelStartError(f"fork failed: {message['error']}"))

    def forget(self, pid: int) -> None:
        """The job ``pid`` is over for the bot (its exit code is no longer awaited)."""
        done = self.exits.pop(pid, None)
        if done is not None and not done.done():
            done.cancel()

    async def _wind_down(self) -> None:
        making = list(self._making)
        for task in making:
            task.cancel()
        await asyncio.gather(*making, return_exceptions=True)
        while self._made:
            await self._throw_away(self._made.popleft())
        await asyncio.gather(*self._removing, return_exceptions=True)

    def _close_input(self) -> None:
        if self._channel is not None:
            self._channel.close()  # the zygote sees its standard input end
            self._channel = None


async def _send(channel: socket.socket, data: bytes, fds: list[int]) -> None:
    """One message with ``fds`` attached, waiting for room when the socket is full."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            socket.send_fds(channel, [data], fds)
            return
        except BlockingIOError:
            writable = loop.create_future()
            loop.add_writer(channel.fileno(), writable.set_result, None)
            try:
                await writable
            finally:
                loop.remove_writer(channel.fileno())


async def _pipe_reader(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    """A stream over the read end ``fd`` of a pipe (closed with the transport)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 16, loop=loop)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(fd, "rb", buffering=0)
    )
    return reader, transport


def _make_folder(launcher: SpawningLauncher, run_dir: Path) -> None:
    launcher.spawner.make_run_root()
    run_dir.parent.mkdir(mode=0o700)
    run_dir.mkdir(mode=0o700)


def kill(pidfd: int | None, pid: int) -> None:
    """SIGKILL a job: through its pidfd (never a recycled pid), then its process group (the
    unsandboxed job leads its own)."""
    if pidfd is not None:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
