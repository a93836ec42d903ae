"""Local kernels: carry out a :class:`~kernels.seam.plan.LaunchPlan` with ``jupyter_client``.

:class:`KernelLauncher` is the plain :class:`~kernels.seam.plan.Launcher` (``sandbox: none``)
and the base of the sandboxed and forked ones. :meth:`KernelLauncher.start` makes the plan's
run dir, builds an ``AsyncKernelManager`` whose kernel spec comes from
:meth:`KernelLauncher.kernel_spec` (argv, ``interrupt_mode``) and whose provisioner is made
for this one plan by :meth:`KernelLauncher.provisioner`, handed to the manager directly
instead of through an entry point, then connects a client and waits until the kernel answers.

:class:`ThreadbookProvisioner` owns the process. It is constructed with the plan and never
changed afterwards: it replaces the environment with the plan's, hands the workspace and run
dir to the plan's identity (sandboxed kernels), launches off the event loop in a new session
(own process group) through :meth:`ThreadbookProvisioner.launch_process` (the sandbox prefixes
``bwrap``, the fork server forks instead), then :meth:`ThreadbookProvisioner.after_launch`
(here: the rlimits; the sandbox sets them inside bwrap), and on kill takes down the whole
group plus any descendant that left it.

Limits without a sandbox: the rlimits of :meth:`kernels.seam.plan.ResourceLimits.rlimits`;
``RLIMIT_NPROC`` is ignored for root, so as root a fork bomb is bounded only by the execution
timeout (interrupt, then kill of the whole process group); the sandbox (:mod:`kernels.sandbox`)
gives each kernel its own pid namespace and uid. Where the host allows it, every kernel also
gets its own cgroup (:mod:`kernels.host.cgroups`: memory for all its processes together, pids, CPU
weight), entered in the child's ``preexec_fn`` before any of its code runs, together with
``oom_score_adj`` 1000 and a new session keyring (:func:`child_setup`); what a cell leaves
running is killed after it (:mod:`kernels.host.leftovers`). Every kernel is registered with
the launcher's kernel warden (:mod:`kernels.host.lifeline`) before it can be frozen, so it
dies with the bot, frozen or not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import resource
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

import psutil
import zmq
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.launcher import launch_kernel
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from kernels.fork.jail import KERNEL_OOM_SCORE_ADJ, PR_SET_DUMPABLE, join_session_keyring, prctl, set_oom_score_adj
from kernels.host import freezing, leftovers, safefs
from kernels.host.cgroups import Cgroups, KernelCgroup
from kernels.host.interpreter import KernelPython, inspect_interpreter
from kernels.host.lifeline import Lifeline
from kernels.sandbox.identity import prepare_run_dir
from kernels.seam.options import KernelOptions
from kernels.seam.plan import Identity, KernelHandle, LaunchPlan, ResourceLimits
from kernels.seam.result import KernelStartError
from kernels.seam.settings import KernelSettings
from kernels.seam.wire import KERNEL_SETUP, MAX_MESSAGE_BYTES, START_TIMEOUT_S, shell_reply, wait_ready

MPL_INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
#: Variables copied from the bot's environment when set; everything else is dropped.
_INHERITED = ("PATH", "LANG", "LC_ALL", "TZ")
_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
#: Kernels one launcher starts at a time: a burst of new threads then finishes its starts one
#: batch after another instead of all of them sharing the CPU past ``START_TIMEOUT_S``.
START_SLOTS = 2 * (os.cpu_count() or 1)
#: How soon a channel retries to connect to a kernel that has not bound its socket yet.
RECONNECT_IVL_MS = 10
RECONNECT_IVL_MAX_MS = 1000
#: The kernel's own stdout/stderr (crash messages such as "Fatal Python error") land here.
KERNEL_LOG = "kernel.log"
#: Run dirs are named ``kernel-<kernel id>`` under the launcher's run root.
RUN_DIR_PREFIX = "kernel-"
#: Where the kernel finds the shared packages folder (``threadbook_kernel.setup`` appends it to ``sys.path``).
PACKAGES_ENV = "THREADBOOK_PACKAGES_DIR"


def kernel_environment(
    *,
    python: KernelPython,
    workspace: Path,
    run_dir: Path,
    cache_dir: Path,
    data_dir: Path | None,
    packages_dir: Path | None,
) -> dict[str, str]:
    """The kernel's complete environment (paths as the kernel sees them): the bot's own
    variables only where allow-listed."""
    env = {name: os.environ[name] for name in _INHERITED if name in os.environ}
    env["PATH"] = os.pathsep.join([str(python.bin_dir), env.get("PATH", os.defpath)])
    env.setdefault("LANG", "C.UTF-8")
    env.update(
        HOME=str(workspace),
        MPLBACKEND=MPL_INLINE_BACKEND,
        MPLCONFIGDIR=str(cache_dir / "matplotlib"),
        IPYTHONDIR=str(run_dir / "ipython"),
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
        # pandas imports pyarrow, whose jemalloc starts a background thread at load: a
        # fork server with two threads refuses to fork (KERNELS.md pitfall 7).
        JE_ARROW_MALLOC_CONF="background_thread:false",
        **{name: "1" for name in _THREAD_VARS},
    )
    if data_dir is not None:
        env["THREADBOOK_DATA_DIR"] = str(data_dir)
    if packages_dir is not None:
        env[PACKAGES_ENV] = str(packages_dir)
    return env


def child_setup(cgroup: KernelCgroup | None) -> Callable[[], None]:
    """The ``preexec_fn`` of a spawned kernel: between fork and exec, so before any of its
    code runs, it enters its cgroup, raises its OOM score and gets its own session keyring
    (what it starts, bwrap included, inherits all three)."""

    # preexec_fn runs in the forked child of a threaded bot: only raw os calls and one ctypes
    # syscall here, nothing that takes a lock (logging, imports) another thread may have held.
    def setup() -> None:
        try:
            if cgroup is not None:
                cgroup.enter()
            join_session_keyring()
            _raise_oom_score()
        except BaseException as exc:
            os.write(2, f"threadbook: kernel set-up failed: {exc!r}\n".encode())  # stderr is the kernel log
            raise

    return setup


def _raise_oom_score() -> None:
    """(In a ``preexec_fn``, last) raise the child's ``oom_score_adj``. A bot that made itself
    non-dumpable (``bot/hardening.py``) leaves this child's ``/proc/self`` owned by root until
    it execs, so a child of a normal user's bot may not write it: it becomes dumpable first,
    as the exec a moment later makes it anyway."""
    try:
        set_oom_score_adj(KERNEL_OOM_SCORE_ADJ)
    except PermissionError:
        prctl(PR_SET_DUMPABLE, 1)
        set_oom_score_adj(KERNEL_OOM_SCORE_ADJ)


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
            await asyncio.to_thread(self.lifeline.add_process, self.plan.kernel_id, self.pid)
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
        descendants = await asyncio.to_thread(_descendants, self.pid)
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


def _descendants(pid: int | None) -> list[psutil.Process]:
    """(Blocking) ``pid``'s descendants now, without ``pid`` itself (none when it is gone)."""
    return leftovers.process_tree(pid)[1:]


class _Manager(AsyncKernelManager):
    """An ``AsyncKernelManager`` with a spec given in code instead of a kernelspec dir."""

    _threadbook_spec: KernelSpec | None = None

    @property
    def kernel_spec(self) -> KernelSpec | None:
        return self._threadbook_spec


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
        return await asyncio.to_thread(_tree_pss, self.pid)

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


def _tree_pss(pid: int | None) -> int | None:
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


class KernelLauncher:
    """The plain :class:`~kernels.seam.plan.Launcher`: local ipykernel processes with rlimits
    and (where the host allows) a cgroup each. Subclasses change how a plan is carried out."""

    #: ipc sockets in the per-kernel run dir: no TCP port race when many kernels start at once.
    transport = "ipc"
    interrupt_mode = "signal"

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
        self._start_slots = asyncio.Semaphore(start_slots)
        self.cgroups = cgroups or Cgroups.detected(memory_mb=settings.memory_mb, max_processes=settings.max_processes)
        # Per user: a second bot user on the same host must not trip over the first one's 0700 folder.
        self.run_root = Path(run_root or tempfile.gettempdir()) / f"threadbook-{os.getuid()}"
        self.cache_dir = self.run_root / "cache"

    @property
    def isolation(self) -> str:
        """One line saying which resource isolation kernels get (start-up log, ``status``)."""
        return self.cgroups.describe()

    def kernel_spec(self) -> KernelSpec:
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
        lines = [KERNEL_SETUP, *(f"__import__({module!r})" for module in self.settings.preload)]
        argv.append(f"--IPKernelApp.exec_lines={lines!r}")
        return KernelSpec(
            argv=argv, display_name="Threadbook Python", language="python", interrupt_mode=self.interrupt_mode
        )

    def kernel_view(self, options: KernelOptions) -> KernelOptions:
        """``options`` as code inside the kernel sees them (unsandboxed: as they are)."""
        return options

    def plan(self, workspace: Path, options: KernelOptions) -> LaunchPlan:
        """One start's plan: its environment and identity from :meth:`environment` and
        :meth:`identity`, network as :meth:`kernel_view` says."""
        kernel_id = uuid.uuid4().hex[:12]  # short: the ipc socket paths under the run dir must fit 107 bytes
        run_dir = self.run_root / f"{RUN_DIR_PREFIX}{kernel_id}"
        return LaunchPlan(
            kernel_id=kernel_id,
            workspace=workspace,
            run_dir=run_dir,
            environment=self.environment(workspace, run_dir, options),
            limits=self.limits,
            data_dir=options.data_dir,
            network=self.kernel_view(options).network,
            packages_dir=self.packages_dir,
            identity=self.identity(workspace),
        )

    def environment(self, workspace: Path, run_dir: Path, options: KernelOptions) -> dict[str, str]:
        """The kernel's environment (unsandboxed: host paths)."""
        return kernel_environment(
            python=self.python,
            workspace=workspace,
            run_dir=run_dir,
            cache_dir=self.cache_dir,
            data_dir=options.data_dir,
            packages_dir=self.packages_dir,
        )

    def identity(self, workspace: Path) -> Identity | None:
        """Who the kernel runs as (unsandboxed: the bot's own uid, None)."""
        return None

    def provisioner(self, plan: LaunchPlan, manager: AsyncKernelManager) -> ThreadbookProvisioner:
        """The provisioner that carries out ``plan`` for ``manager``."""
        return ThreadbookProvisioner(
            plan=plan,
            lifeline=self.lifeline,
            cgroups=self.cgroups,
            kernel_id=manager.kernel_id,
            kernel_spec=manager.kernel_spec,
            parent=manager,
        )

    async def attach(self, remote_id: str) -> KernelHandle | None:
        """None: local kernels cannot be taken over by another process."""
        return None

    async def open(self) -> None:
        """Start the kernel warden (:mod:`kernels.host.lifeline`); raises
        :class:`~kernels.host.lifeline.WardenUnavailableError` (one line naming the fix) when
        it cannot run: then no kernel could start anyway."""
        await asyncio.to_thread(self.lifeline.ensure)

    async def close(self) -> None:
        """Close the lifeline: the warden kills every kernel of this launcher still running
        (none once the pool shut them down) and exits."""
        await asyncio.to_thread(self.lifeline.close)

    async def start(self, plan: LaunchPlan) -> KernelHandle:
        """Start a kernel as ``plan`` says and wait until it answers (kernel_info + iopub);
        at most ``start_slots`` starts run at once, the others wait their turn (the start
        timeout counts from their own launch)."""
        async with self._start_slots:
            return await self._start(plan)

    async def _start(self, plan: LaunchPlan) -> KernelHandle:
        await asyncio.to_thread(self.make_run_dir, plan.run_dir)
        manager = _Manager(transport=self.transport, connection_file=str(plan.run_dir / "kernel.json"))
        if self.transport == "ipc":
            manager.ip = str(plan.run_dir / "ipc")
        manager._threadbook_spec = self.kernel_spec()
        manager.kernel_id = plan.kernel_id
        client: AsyncKernelClient | None = None
        try:  # from here on a failure removes the run dir and becomes a KernelStartError
            manager.provisioner = self.provisioner(plan, manager)
            with open(plan.run_dir / KERNEL_LOG, "ab") as log:  # the kernel keeps its own copy of the fd
                await manager.start_kernel(cwd=str(plan.workspace), stdout=log, stderr=log)
            # A message over the cap is refused by the socket itself, before pyzmq or the
            # session decode a byte of it (the display budget still applies below the cap).
            client = manager.client()
            client.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # the client's own context
            # The channels connect before the kernel has bound its sockets; ZMQ then retries
            # every RECONNECT_IVL (100 ms by default), which a fast start would wait out; doubling
            # up to a second, so a dead kernel's channels do not spin.
            client.context.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
            client.context.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
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

    def make_run_dir(self, run_dir: Path) -> None:
        """(Blocking) make ``run_dir`` (0700, must not exist) and the shared cache folder."""
        self.run_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.cache_dir / "matplotlib").mkdir(parents=True, exist_ok=True, mode=0o700)
        run_dir.mkdir(mode=0o700)


async def _discard(manager: AsyncKernelManager, client: AsyncKernelClient | None, run_dir: Path) -> None:
    if client is not None:
        client.stop_channels()
    try:
        if manager.has_kernel:
            await manager.shutdown_kernel(now=True)
    finally:
        await asyncio.to_thread(shutil.rmtree, run_dir, True)
