"""One-shot processes for the bot's own work: fresh, sandboxed, bounded, touched by no thread.

What the bot needs computed for itself from untrusted data (an upload's preview, the page of
``export html``) is never asked of the thread's kernel: code that ran there may have replaced
any function the bot would call. Instead :class:`OneShot` starts a new process of the kernel
interpreter, isolated (``python -I -m threadbook_kernel.<module> ...``: no ``PYTHONPATH``, no
user site, not the current folder on ``sys.path``), in the same sandbox as the kernels of its
launcher, from data the bot holds:

* **sandbox**: bubblewrap with the kernels' read-only system binds, no network, its own
  pid namespace and (as root) an unprivileged uid of its own, the kernels' rlimits through
  ``prlimit`` (:func:`kernels.sandbox.args.sandbox_args`); with ``kernels.sandbox: none`` a
  plain child with the same environment allow-list and rlimits. Either way it gets a cgroup
  of its own where the host allows one, the kernels' environment without the shared packages
  folder (never on its ``sys.path``), and a fresh private scratch folder (``/workspace``
  inside the sandbox) that no thread's kernel can see;
* **input**: files the bot writes into the scratch folder (:meth:`Job.write`), and at most
  one file descriptor the bot opened itself (inherited: the child reads the file the bot
  checked, never a path a kernel could swap);
* **bounds**: killed at its deadline and once its standard output passes its cap (every
  process of it: its process tree, its process group, its cgroup, the sandbox's pid
  namespace); what it writes is read back through :mod:`kernels.host.safefs` with a size cap.

Where the kernels have a fork server (``kernels.fork_server``), one-shots are forked from a
one-shot fork server instead (:mod:`kernels.oneshot.server`): a parent that imported the
one-shot code and never ran anything of a thread forks each job, confined as above (its own
pid namespace and uid, its scratch folder, the rlimits, its cgroup before it may start); a
job then costs a fork instead of an interpreter and its imports (~0.4 s). While that server
is not running, one-shots are spawned.

Gateway deployments have no local kernel launcher: :func:`kernels.build.oneshot_for`
builds one for the bot's machine when the kernel environment is there, else an
:meth:`OneShot.unavailable` one whose every run raises :class:`OneShotUnavailableError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import resource
import shutil
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from kernels.host import safefs
from kernels.host.cgroups import KernelCgroup
from kernels.host.leftovers import process_tree
from kernels.host.runroot import is_private
from kernels.oneshot.server import Ahead, OneShotServer, forkable
from kernels.sandbox.args import sandbox_args
from kernels.sandbox.identity import prepare_run_dir
from kernels.seam.options import KernelOptions
from kernels.seam.plan import LaunchPlan
from kernels.seam.result import KernelError
from kernels.spawn.environment import PACKAGES_ENV, child_setup
from kernels.spawn.spawner import SpawningLauncher

log = logging.getLogger(__name__)

#: Scratch folders are named ``oneshot-<bot pid>-<id>`` under the launcher's run root.
ONESHOT_PREFIX = "oneshot-"
#: The modules of the kernel-side package a one-shot may run (``threadbook_kernel.<name>``).
MODULES = frozenset({"export", "preview"})
#: One-shots running at once; more wait their turn (they are short, and each costs a core).
MAX_RUNNING = max(2, os.cpu_count() or 1)
#: Forked one-shots running at once: two per core (a fork's start is mostly waiting, its run is not).
MAX_FORKED = max(4, 2 * (os.cpu_count() or 1))
#: The end of a one-shot's standard error kept for the log.
ERRORS_KEPT = 4096
#: How long a killed run's output pipe may take to close.
REAP_TIMEOUT_S = 5.0
_CHUNK = 65536


class OneShotUnavailableError(KernelError):
    """No one-shot can run on this machine (a gateway deployment without a local kernel
    environment or sandbox); the message says why, in one line."""


@dataclass(frozen=True)
class OneShotResult:
    """How one run ended."""

    #: Its exit status (negative: the signal); None when the bot killed it.
    exit_code: int | None
    #: Its standard output, at most the run's ``max_output`` bytes.
    output: bytes
    #: Whether it wrote more than ``max_output`` (it was killed then).
    cut: bool
    #: Whether it was killed at its deadline.
    timed_out: bool
    #: The end of its standard error (for the log; untrusted text).
    errors: str

    @property
    def ok(self) -> bool:
        """It exited by itself with status 0, its output whole."""
        return self.exit_code == 0 and not self.cut and not self.timed_out


class OneShot:
    """Runs ``threadbook_kernel`` modules in fresh processes sandboxed like ``launcher``'s kernels."""

    def __init__(self, launcher: SpawningLauncher | None, *, reason: str = "", fork: bool = False) -> None:
        """(Blocking) ``launcher``: the local (spawning) launcher whose interpreter, sandbox,
        limits, run root and cgroups one-shots share; None: unavailable, for ``reason``.
        ``fork``: fork one-shots from a one-shot fork server (started by :meth:`open`) where
        ``launcher`` allows one. Scratch folders a bot process that is gone left behind are removed."""
        if launcher is not None:
            _remove_stale(launcher.spawner.run_root)
        self._launcher = launcher
        self._reason = reason
        self._running = asyncio.Semaphore(MAX_RUNNING)
        self._forking = asyncio.Semaphore(MAX_FORKED)
        #: The one-shot fork server (None: every one-shot is spawned).
        self.server: OneShotServer | None = None
        if fork and launcher is not None and forkable(launcher):
            self.server = OneShotServer(
                launcher, prepare=functools.partial(_prepare, launcher), discard=_discard, ahead=MAX_FORKED
            )

    @classmethod
    def unavailable(cls, reason: str) -> OneShot:
        """A runner whose every run raises :class:`OneShotUnavailableError` saying ``reason``."""
        return cls(None, reason=reason)

    async def open(self) -> None:
        """Start the one-shot fork server in the background, if there is one (one-shots are
        spawned until it is ready)."""
        if self.server is not None:
            self.server.open()

    async def close(self) -> None:
        """Stop the one-shot fork server (it kills the jobs still running)."""
        if self.server is not None:
            await self.server.stop()

    async def wait_ready(self) -> bool:
        """Wait until the one-shot fork server has started (tests, benchmarks); whether one-shots are forked."""
        return self.server is not None and await self.server.wait_ready()

    @property
    def available(self) -> bool:
        """Whether runs can happen here."""
        return self._launcher is not None

    @property
    def sandboxed(self) -> bool:
        """Whether runs happen inside bubblewrap."""
        return self._launcher is not None and self._launcher.support is not None

    @contextlib.asynccontextmanager
    async def job(self) -> AsyncIterator[Job]:
        """A fresh scratch folder for one or more runs, removed (with anything left in it) at the end."""
        launcher = self._launcher
        if launcher is None:
            raise OneShotUnavailableError(self._reason)
        ahead = await self.server.take() if self.server is not None else None
        if ahead is not None:  # its process waits in the job's folder, confined and in its cgroup
            plan = ahead.plan
        else:
            plan = _plan(launcher)
            await asyncio.to_thread(_make_scratch, launcher, plan)
        try:
            yield Job(self, launcher, plan, ahead)
        finally:
            if ahead is not None:
                assert self.server is not None
                await self.server.finish(ahead)
            await _discard(plan)

    async def run(
        self, module: str, args: Sequence[str], *, timeout: float, max_output: int, fd: int | None = None
    ) -> OneShotResult:
        """Run ``threadbook_kernel.<module>`` with ``args`` in a job of its own (see :meth:`Job.run`)."""
        async with self.job() as job:
            return await job.run(module, args, timeout=timeout, max_output=max_output, fd=fd)


class Job:
    """A one-shot's scratch folder (``/workspace`` of its runs) and the runs in it."""

    def __init__(self, runner: OneShot, launcher: SpawningLauncher, plan: LaunchPlan, ahead: Ahead | None) -> None:
        """``ahead``: the process the one-shot fork server made for this job (its first run), or None."""
        self._runner = runner
        self._launcher = launcher
        self.plan = plan
        self._ahead = ahead

    def write(self, name: str, data: bytes) -> None:
        """(Blocking) ``data`` as the new file ``name`` of the scratch folder, readable by the runs."""
        folder = safefs.open_dir(self.plan.workspace)
        try:
            fd = safefs.create_file_at(folder, name, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        finally:
            os.close(folder)

    def read(self, name: str, max_bytes: int) -> bytes | None:
        """(Blocking) the file ``name`` a run wrote, through a descriptor (no link followed, a
        regular file only); None when it is larger than ``max_bytes``."""
        with safefs.open_file(self.plan.workspace, name) as file:
            if file.size > max_bytes:
                return None
            data = file.read(max_bytes)
        if len(data) != file.size:
            raise OSError(f"{name} changed while it was read")
        return data

    async def run(
        self, module: str, args: Sequence[str], *, timeout: float, max_output: int, fd: int | None = None
    ) -> OneShotResult:
        """Run ``python -I -m threadbook_kernel.<module> *args`` in the scratch folder; ``fd``
        (the bot's own descriptor) is inherited under its number. Killed, with every process
        it started, after ``timeout`` seconds or once its standard output passes ``max_output``
        bytes; never raises for what the child did."""
        if module not in MODULES:
            raise ValueError(f"not a one-shot module: {module!r}")
        return await self.run_python(
            ["-m", f"threadbook_kernel.{module}", *args], timeout=timeout, max_output=max_output, fd=fd
        )

    async def run_python(
        self, python_args: Sequence[str], *, timeout: float, max_output: int, fd: int | None = None
    ) -> OneShotResult:
        """:meth:`run` with the interpreter's own arguments after ``-I`` (tests run ``-c`` code)."""
        runner = self._runner
        ahead, self._ahead = self._ahead, None
        if ahead is not None:  # the job's first run; a later one is spawned
            async with runner._forking:
                return await _run_ahead(ahead, list(python_args), timeout=timeout, max_output=max_output, fd=fd)
        argv = [str(self._launcher.spawner.python.executable), "-I", *python_args]
        async with runner._running:
            return await _run(self._launcher, self.plan, argv, timeout=timeout, max_output=max_output, fd=fd)


def _plan(launcher: SpawningLauncher) -> LaunchPlan:
    """A launch plan for one job: a fresh scratch folder as the workspace, no data folder, no
    network, no shared packages, the kernels' limits and (sandboxed) a uid of its own."""
    job_id = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    base = launcher.spawner.run_root / f"{ONESHOT_PREFIX}{job_id}"
    workspace, run_dir = base / "work", base / "run"
    environment = launcher.environment(workspace, run_dir, KernelOptions())
    environment.pop(PACKAGES_ENV, None)
    if launcher.support is None:  # caches in the job's folder, not the kernels' shared one
        environment["MPLCONFIGDIR"] = str(workspace / ".cache" / "matplotlib")
        environment["XDG_CACHE_HOME"] = str(workspace / ".cache")
    return LaunchPlan(
        kernel_id=f"{ONESHOT_PREFIX}{job_id}",
        workspace=workspace,
        run_dir=run_dir,
        environment=environment,
        limits=launcher.spawner.limits,
        data_dir=None,
        network=False,
        packages_dir=None,
        identity=launcher.identity(workspace),
    )


async def _prepare(launcher: SpawningLauncher) -> tuple[LaunchPlan, KernelCgroup | None]:
    """A fresh job's plan, scratch folder and cgroup (for a process made ahead). Cancelled
    (the server stops), it waits for the thread that makes them and removes what it made."""
    plan = _plan(launcher)
    made = asyncio.ensure_future(asyncio.to_thread(_prepare_blocking, launcher, plan))
    try:
        return plan, await asyncio.shield(made)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            cgroup = await made
            if cgroup is not None:
                await asyncio.to_thread(cgroup.remove)
        await _discard(plan)
        raise


def _prepare_blocking(launcher: SpawningLauncher, plan: LaunchPlan) -> KernelCgroup | None:
    """(Blocking) :func:`_prepare`'s folder and cgroup; nothing left behind when it fails."""
    _make_scratch(launcher, plan)
    cgroups = launcher.spawner.cgroups
    try:
        return cgroups.create(plan.kernel_id) if cgroups is not None and cgroups.enabled else None
    except BaseException:
        shutil.rmtree(plan.run_dir.parent, True)
        raise


async def _discard(plan: LaunchPlan) -> None:
    """Remove a job's scratch folder (with anything left in it)."""
    await asyncio.to_thread(shutil.rmtree, plan.run_dir.parent, True)


def _remove_stale(run_root: Path) -> None:
    """(Blocking) remove the scratch folders of bot processes that no longer run (a bot that
    was killed mid-run); another live bot's, on the same host and run root, are kept. Nothing
    is removed from a run root that is not the bot's own (no kernel starts there either)."""
    if not is_private(run_root):
        return
    try:
        entries = list(os.scandir(run_root))
    except OSError:
        return
    for entry in entries:
        owner = entry.name.removeprefix(ONESHOT_PREFIX).split("-", 1)[0]
        if entry.name.startswith(ONESHOT_PREFIX) and owner.isdigit() and not psutil.pid_exists(int(owner)):
            shutil.rmtree(entry.path, ignore_errors=True)


def _make_scratch(launcher: SpawningLauncher, plan: LaunchPlan) -> None:
    """(Blocking) the job's folder (0700, new), its workspace and run dir, handed to its uid."""
    launcher.spawner.make_run_root()
    plan.run_dir.parent.mkdir(mode=0o700)
    plan.workspace.mkdir(mode=0o700)
    plan.run_dir.mkdir(mode=0o700)
    prepare_run_dir(plan)


def _command(launcher: SpawningLauncher, plan: LaunchPlan, argv: list[str]) -> list[str]:
    if launcher.support is not None:
        return [*sandbox_args(launcher.support, plan), *argv]
    return argv


def _preexec(launcher: SpawningLauncher, plan: LaunchPlan, cgroup: KernelCgroup | None) -> Callable[[], None]:
    """Between fork and exec: the cgroup, keyring and OOM score of a kernel; without the
    sandbox (whose ``prlimit`` sets them inside) the rlimits too."""
    setup = child_setup(cgroup)
    limits = () if launcher.support is not None else plan.limits.rlimits()

    def preexec() -> None:
        setup()
        for limit, value in limits:
            resource.setrlimit(limit, (value, value))

    return preexec


async def _run(
    launcher: SpawningLauncher, plan: LaunchPlan, argv: list[str], *, timeout: float, max_output: int, fd: int | None
) -> OneShotResult:
    cgroup = await _make_cgroup(launcher, plan)
    try:
        process = await asyncio.create_subprocess_exec(
            *_command(launcher, plan, argv),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=plan.workspace,
            env=dict(plan.environment),
            start_new_session=True,  # its own process group, killed whole
            pass_fds=() if fd is None else (fd,),
            preexec_fn=_preexec(launcher, plan, cgroup),
        )
    except BaseException:
        if cgroup is not None:
            await asyncio.to_thread(cgroup.remove)
        raise
    assert process.stdout is not None and process.stderr is not None
    errors = asyncio.create_task(_tail(process.stderr, ERRORS_KEPT))
    timed_out = cut = False
    chunks: list[bytes] = []  # what came before a deadline is kept
    try:
        try:
            async with asyncio.timeout(timeout):
                cut = await _bounded(process.stdout, max_output, chunks)
                if not cut:
                    await process.wait()
        except TimeoutError:
            timed_out = True
    finally:
        exit_code = process.returncode if not (timed_out or cut) else None
        await _kill(process, process.stdout, cgroup)
        try:
            error_text = await asyncio.wait_for(errors, 1.0)
        except TimeoutError:
            error_text = ""
    if timed_out or cut:
        log.warning(
            "one-shot %s: %s",
            " ".join(argv[2:4])[:80],
            "killed at its deadline" if timed_out else "output over its cap",
        )
    return OneShotResult(exit_code=exit_code, output=b"".join(chunks), cut=cut, timed_out=timed_out, errors=error_text)


async def _run_ahead(
    ahead: Ahead, python_args: list[str], *, timeout: float, max_output: int, fd: int | None
) -> OneShotResult:
    """:func:`_run` in a process the one-shot fork server made ahead (confined, in its cgroup):
    it is given its job, read, and killed at its deadline or once its output passes its cap."""
    await ahead.send(python_args, fd)
    errors = asyncio.create_task(_tail(ahead.stderr, ERRORS_KEPT))
    timed_out = cut = False
    exit_code: int | None = None
    chunks: list[bytes] = []
    try:
        async with asyncio.timeout(timeout):
            cut = await _bounded(ahead.stdout, max_output, chunks)
            if not cut:
                exit_code = await ahead.ended()
    except TimeoutError:
        timed_out = True
    if timed_out or cut:
        exit_code = None
        await asyncio.to_thread(ahead.kill)
        log.warning(
            "one-shot %s: %s",
            " ".join(python_args[:2])[:80],
            "killed at its deadline" if timed_out else "output over its cap",
        )
    try:
        error_text = await asyncio.wait_for(errors, 1.0)
    except TimeoutError:
        error_text = ""
    return OneShotResult(exit_code=exit_code, output=b"".join(chunks), cut=cut, timed_out=timed_out, errors=error_text)


async def _make_cgroup(launcher: SpawningLauncher, plan: LaunchPlan) -> KernelCgroup | None:
    cgroups = launcher.spawner.cgroups
    if cgroups is None or not cgroups.enabled:
        return None
    return await asyncio.to_thread(cgroups.create, plan.kernel_id)


async def _bounded(stream: asyncio.StreamReader, limit: int, chunks: list[bytes]) -> bool:
    """Append what ``stream`` gives to ``chunks`` until its end, at most ``limit`` bytes in
    all; True when there was more."""
    total = 0
    while chunk := await stream.read(_CHUNK):
        if total + len(chunk) > limit:
            chunks.append(chunk[: limit - total])
            return True
        chunks.append(chunk)
        total += len(chunk)
    return False


async def _tail(stream: asyncio.StreamReader, keep: int) -> str:
    """The last ``keep`` bytes of ``stream`` (all of it is read, so the child never blocks on it)."""
    kept = b""
    while chunk := await stream.read(_CHUNK):
        kept = (kept + chunk)[-keep:]
    return kept.decode("utf-8", "replace")


async def _kill(process: asyncio.subprocess.Process, stdout: asyncio.StreamReader, cgroup: KernelCgroup | None) -> None:
    """SIGKILL every process of the run (whether or not it ended: what it left running goes
    too), wait for the child, remove its cgroup."""
    await asyncio.to_thread(_kill_tree, process.pid)
    if process.returncode is None:
        # os.kill, not Process.kill: Popen.send_signal polls first and would reap the child
        # from under asyncio's child watcher.
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    # asyncio's wait() ends only once the pipes are closed too: what is left unread is drained
    # (a full, unread pipe never reports its end). Both are bounded: a writer that escaped
    # every kill (unsandboxed, no cgroup) could hold the pipe open.
    try:
        async with asyncio.timeout(REAP_TIMEOUT_S):
            while await stdout.read(_CHUNK):
                pass
            await process.wait()
    except TimeoutError:
        log.error("one-shot pid %d: its output pipe is still open after it was killed", process.pid)
    if cgroup is not None:
        await asyncio.to_thread(cgroup.remove)


def _kill_tree(pid: int) -> None:
    """(Blocking) SIGKILL ``pid``'s descendants (bwrap's pid namespace, children that left the
    group) and its process group."""
    for proc in process_tree(pid)[1:]:
        with contextlib.suppress(psutil.Error):
            proc.kill()  # psutil checks it is still the same process
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
