"""Fork-server kernels with real processes: same session behaviour as spawned ones, restart, no
leftovers; the sandboxed profile (kernels jailed in their own namespaces and uid)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from kernels import KernelOptions, KernelPool, Outcome, build_pool
from kernels.forking.launcher import ForkingLauncher, ForkProvisioner
from tests.kernels.conftest import kernel_settings
from tests.security.conftest import SKIP_REASON as SANDBOX_SKIP


@pytest_asyncio.fixture
async def forking_pool(tmp_path: Path) -> AsyncIterator[KernelPool]:
    pool = build_pool(kernel_settings(tmp_path, fork_server=True, preload=("numpy", "matplotlib"), exec_timeout_s=5))
    await pool.start()
    assert isinstance(pool.launcher, ForkingLauncher) and pool.launcher.available
    yield pool
    await pool.shutdown_all()


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


async def test_forked_kernels_behave_like_spawned_ones(forking_pool: KernelPool) -> None:
    launcher = forking_pool.launcher
    assert isinstance(launcher, ForkingLauncher)
    a, b = await asyncio.gather(forking_pool.get_or_start("f:a"), forking_pool.get_or_start("f:b"))
    assert launcher.forked == 2 and launcher.spawned == 0
    code = "import os, numpy as np; v = 1; print(np.random.randint(1 << 30), os.getcwd() == os.environ['HOME'])"
    ra, rb = await asyncio.gather(a.execute(code), b.execute(code))
    assert ra.ok and rb.ok and ra.execution_count == 1, (ra, rb)
    assert ra.streams[0].text != rb.streams[0].text  # numpy reseeded in each child
    assert ra.streams[0].text.endswith("True\n") and a.workspace.path.name in (await a.execute("os.getcwd()")).result
    assert (await b.execute("'v' in dir() and 'pd' not in dir()")).result == "True"
    # The last result is the thread's own: the fork server's priming (threadbook_kernel.prime) shows nothing.
    assert (await b.execute("_, len(In)")).result == "(True, 4)"
    # threadbook_kernel.setup() ran in the child: the helpers, interrupts kept for the cell.
    setup = await b.execute("callable(display_dataframe_to_user) and get_ipython()._threadbook_interrupts")
    assert setup.result == "True", setup

    plot = await a.execute("import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.show()")
    assert [d.png() is not None for d in plot.displays] == [True]  # %matplotlib inline ran in the child

    stuck = await a.execute("while True: pass", timeout=0.5)  # signal-mode interrupt reaches the child
    assert stuck.outcome is Outcome.TIMEOUT_INTERRUPTED and (await a.execute("v")).result == "1"

    died = await b.execute("import os; os.kill(os.getpid(), 9)")
    assert died.outcome is Outcome.DIED and "SIGKILL" in died.notice
    again = await b.execute("'v' in dir()")
    assert again.result == "False" and again.kernel_restarted

    await a.execute("import subprocess; p = subprocess.Popen(['sleep', '60'], start_new_session=True)")
    tree = [psutil.Process(a.pid), *psutil.Process(a.pid).children(recursive=True)]
    assert len(tree) == 2
    await forking_pool.shutdown("f:a")
    await asyncio.sleep(0.05)
    assert _alive(tree) == []  # the kernel and what it started, even in its own session


async def test_forked_kernels_carry_no_debugger_backend(forking_pool: KernelPool) -> None:
    # ipykernel's debugger backend (debugpy, ~7 MiB) serves a notebook front end's debug
    # requests; the bot sends none, so the fork server never imports it (less to copy per fork).
    session = await forking_pool.get_or_start("f:nodebug")
    launcher = forking_pool.launcher
    assert isinstance(launcher, ForkingLauncher) and launcher.forked == 1
    loaded = await session.execute(
        "import sys, ipykernel.debugger; print('debugpy' in sys.modules, ipykernel.debugger._is_debugpy_available)"
    )
    assert loaded.ok and loaded.streams[0].text == "False False\n", loaded
    # Not blocked for user code: a cell may still import it.
    imported = await session.execute("import debugpy; debugpy.__name__")
    assert imported.ok and imported.result == "'debugpy'", imported


#: A cell that forks and counts the pages its child copies while it takes ``set(sys.modules)``
#: (each key's reference count is written): what a kernel's start does to the fork server's pages.
COPIED_BY_MODULE_NAMES = """
import os, resource, sys
read, write = os.pipe()
if (child := os.fork()) == 0:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    names = set(sys.modules)
    os.write(write, str(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before).encode())
    os._exit(0)
os.close(write)
copied = int(os.read(read, 32))
os.waitpid(child, 0)
print(copied, len(sys.modules))
"""


async def test_module_names_lie_together_in_forked_kernels(forking_pool: KernelPool) -> None:
    # Every kernel copies sys.modules' keys while it starts (ipykernel's module list, IPython's
    # set of names): the fork server gives them keys made one after another, so that copy
    # writes to a few dozen pages (56 measured), not to the ~470 the imports left the names on.
    session = await forking_pool.get_or_start("f:names")
    counted = await session.execute(COPIED_BY_MODULE_NAMES)
    assert counted.ok, counted
    copied, modules = map(int, counted.streams[0].text.split())
    assert modules > 500 and copied < 120, (copied, modules)


async def test_forked_kernel_is_connected_once_its_sockets_are_bound(
    forking_pool: KernelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fork server says when a kernel has bound its sockets; the channels connect then (a
    # connect before the bind is retried by ZMQ only after RECONNECT_IVL, ~10-30 ms later).
    seen: list[bool] = []
    wait = ForkProvisioner.sockets_bound

    async def sockets_bound(self: ForkProvisioner) -> None:
        await wait(self)
        info = self.connection_info
        ipc = Path(str(info["ip"]))
        seen.append(all(Path(f"{ipc}-{info[port]}").exists() for port in ("shell_port", "iopub_port")))

    monkeypatch.setattr(ForkProvisioner, "sockets_bound", sockets_bound)
    sessions = await asyncio.gather(*(forking_pool.get_or_start(f"f:bound{i}") for i in range(3)))
    assert seen == [True, True, True]
    assert [(await s.execute("1 + 1")).result for s in sessions] == ["2", "2", "2"]
    launcher = forking_pool.launcher
    assert isinstance(launcher, ForkingLauncher) and launcher.forked == 3
    assert launcher.server._unbound == {}  # every report taken


async def test_dead_fork_server_falls_back_to_spawn_and_comes_back(forking_pool: KernelPool) -> None:
    launcher = forking_pool.launcher
    assert isinstance(launcher, ForkingLauncher)
    before = await forking_pool.get_or_start("f:before")
    await before.execute("v = 1")
    zygote = launcher.server.pid
    assert zygote is not None
    os.kill(zygote, signal.SIGKILL)
    while launcher.available:
        await asyncio.sleep(0.01)

    spawned = await forking_pool.get_or_start("f:spawned")
    assert (await spawned.execute("1 + 1")).result == "2" and launcher.spawned == 1
    assert (await before.execute("v")).result == "1"  # kernels forked earlier keep running

    for _ in range(100):
        if launcher.available:
            break
        await asyncio.sleep(0.05)
    assert launcher.available and launcher.server.starts == 2 and launcher.server.pid != zygote
    forked = await forking_pool.get_or_start("f:after")
    assert (await forked.execute("2 + 2")).result == "4" and launcher.forked == 2

    pids = [s.pid for s in forking_pool.sessions()]
    server_pid = launcher.server.pid
    await forking_pool.shutdown_all()
    assert not any(
        pid is not None and psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids
    )
    assert server_pid is not None and not psutil.pid_exists(server_pid)


@pytest_asyncio.fixture
async def jailed_pool(tmp_path: Path) -> AsyncIterator[KernelPool]:
    if os.geteuid() != 0 or SANDBOX_SKIP:
        pytest.skip(SANDBOX_SKIP or "the sandboxed fork server needs the bot to run as root")
    pool = build_pool(
        kernel_settings(tmp_path, sandbox="bwrap", fork_server=True, preload=("numpy",), exec_timeout_s=5)
    )
    await pool.start()
    assert isinstance(pool.launcher, ForkingLauncher) and pool.launcher.sandbox is not None
    assert pool.launcher.available
    yield pool
    await pool.shutdown_all()


async def test_sandboxed_fork_server_forks_jailed_kernels(jailed_pool: KernelPool, tmp_path: Path) -> None:
    launcher = jailed_pool.launcher
    assert isinstance(launcher, ForkingLauncher)
    a, b = await asyncio.gather(jailed_pool.get_or_start("j:a"), jailed_pool.get_or_start("j:b"))
    assert launcher.forked == 2 and launcher.spawned == 0
    code = (
        "import os, numpy as np; v = 1; status = open('/proc/self/status').read()\n"
        "print(os.getuid(), os.getcwd(), len([p for p in os.listdir('/proc') if p.isdigit()]), "
        "'CapEff:\\t0000000000000000' in status, 'NoNewPrivs:\\t1' in status, np.random.randint(1 << 30))"
    )
    ra, rb = await asyncio.gather(a.execute(code), b.execute(code))
    assert ra.ok and rb.ok, (ra, rb)
    (uid_a, cwd, procs, no_caps, nnp, rand_a), (uid_b, _, _, _, _, rand_b) = (r.stdout.split() for r in (ra, rb))
    assert uid_a != uid_b and int(uid_a) >= 1_900_000_000 and cwd == "/workspace" and int(procs) <= 3
    assert no_caps == nnp == "True" and rand_a != rand_b
    assert (a.workspace.path / "..").resolve() == tmp_path / "workspaces"  # the host side of /workspace
    await a.execute("open('mine.txt', 'w').write('a')")
    assert (a.workspace.path / "mine.txt").stat().st_uid == int(uid_a)

    stuck = await a.execute("while True: pass", timeout=0.5)  # message-mode interrupt
    assert stuck.outcome is Outcome.TIMEOUT_INTERRUPTED and (await a.execute("v")).result == "1"

    died = await b.execute("import os; os.kill(os.getpid(), 9)")
    assert died.outcome is Outcome.DIED and "SIGKILL" in died.notice
    again = await b.execute("'v' in dir()")
    assert again.result == "False" and again.kernel_restarted and launcher.forked == 3

    await a.execute("import subprocess; p = subprocess.Popen(['sleep', '60'], start_new_session=True)")
    tree = [psutil.Process(a.pid), *psutil.Process(a.pid).children(recursive=True), _supervisor_of(a.pid)]
    assert len(tree) == 3  # kernel, sleep, and pid 1 of the kernel's namespace
    await jailed_pool.shutdown("j:a")
    await asyncio.sleep(0.05)
    assert _alive(tree) == []


def _supervisor_of(kernel: int) -> psutil.Process:
    """Pid 1 of a jailed kernel's pid namespace: the one process outside the kernel's tree there."""
    namespace = os.stat(f"/proc/{kernel}/ns/pid").st_ino
    zygote = psutil.Process(kernel).parent()
    assert zygote is not None
    found = [
        proc
        for proc in zygote.children(recursive=True)
        if proc.pid != kernel and os.stat(f"/proc/{proc.pid}/ns/pid").st_ino == namespace and proc.ppid() != kernel
    ]
    assert len(found) == 1, found
    return found[0]


async def test_a_jailed_kernel_costs_one_fork_of_the_zygote(jailed_pool: KernelPool) -> None:
    # The zygote forks the kernel itself, into the pid namespace of a supervisor its small
    # helper made: the supervisor is no copy of the zygote, has the kernel's uid and is not
    # dumpable, reaps the kernel's orphans, and ends the namespace once the kernel has died.
    a = await jailed_pool.get_or_start("j:one-fork")
    assert a.pid is not None
    kernel = psutil.Process(a.pid)
    zygote = kernel.parent()
    assert zygote is not None and zygote.cmdline() == kernel.cmdline()  # forked by the zygote itself
    supervisor = _supervisor_of(a.pid)
    helper = supervisor.parent()
    assert helper is not None and helper.parent() == zygote and helper.cmdline() == zygote.cmdline()
    for small in (helper, supervisor):  # the zygote holds ~200 MiB, the helper ~10
        assert small.memory_info().rss < zygote.memory_info().rss / 4
    assert supervisor.uids().real == kernel.uids().real != 0
    assert a._handle is not None and a._handle.infrastructure == {kernel.pid, supervisor.pid}  # its orphans' tree
    assert os.stat(f"/proc/{supervisor.pid}/status").st_uid == 0  # not dumpable: the kernel cannot ptrace it
    assert os.stat(f"/proc/{kernel.pid}/status").st_uid == kernel.uids().real
    inside = await a.execute(
        "import os, subprocess\n"
        "sh = subprocess.run(['sh', '-c', 'sleep 60 >/dev/null 2>&1 & echo $!'], capture_output=True, text=True)\n"
        "orphan = sh.stdout.strip()\n"
        "print(os.getpid(), os.getppid(), open(f'/proc/{orphan}/stat').read().rsplit(')', 1)[1].split()[1])"
    )
    # pid 2 of its namespace, its parent outside it (0), the orphan re-parented to pid 1
    assert inside.stdout.split() == ["2", "0", "1"], inside
    died = await a.execute("os.kill(os.getpid(), 9)")  # running, not frozen between turns
    assert died.outcome is Outcome.DIED and "SIGKILL" in died.notice
    await asyncio.to_thread(supervisor.wait, 5)  # the supervisor follows the kernel
    assert _alive([kernel, supervisor]) == []


async def test_supervisors_killed_while_they_wait_are_replaced(jailed_pool: KernelPool) -> None:
    # The helper keeps supervisors waiting for the next kernels; killing them (an operator, the
    # OOM killer) costs the next start a retry, not a fork.
    launcher = jailed_pool.launcher
    assert isinstance(launcher, ForkingLauncher)
    a = await jailed_pool.get_or_start("j:waiting-a")
    assert a.pid is not None
    supervisor = _supervisor_of(a.pid)
    helper = supervisor.parent()
    assert helper is not None
    for _ in range(100):  # the next ones are made while a's kernel starts
        waiting = [proc for proc in helper.children() if proc.pid != supervisor.pid]
        if len(waiting) == 2:
            break
        await asyncio.sleep(0.05)
    assert len(waiting) == 2 and all(proc.uids().real == 0 for proc in waiting)  # no kernel's uid yet
    for proc in waiting:
        proc.kill()
    await asyncio.to_thread(psutil.wait_procs, waiting, 5)
    b = await jailed_pool.get_or_start("j:waiting-b")
    assert (await b.execute("1 + 1")).result == "2" and launcher.forked == 2 and launcher.spawned == 0


async def test_a_dead_helper_restarts_the_jailing_fork_server_and_kernels_run_on(jailed_pool: KernelPool) -> None:
    # Without its helper the zygote can jail no kernel: it exits, the bot starts a new one
    # (spawning meanwhile), and the kernels it forked keep running under their supervisors.
    launcher = jailed_pool.launcher
    assert isinstance(launcher, ForkingLauncher)
    a = await jailed_pool.get_or_start("j:helper-a")
    assert a.pid is not None
    helper = _supervisor_of(a.pid).parent()
    assert helper is not None
    helper.kill()
    for _ in range(200):
        if launcher.server.starts == 2 and launcher.available:
            break
        await asyncio.sleep(0.05)
    assert launcher.server.starts == 2 and launcher.available
    assert (await a.execute("1 + 1")).result == "2"
    b = await jailed_pool.get_or_start("j:helper-b")
    assert (await b.execute("2 + 2")).result == "4" and launcher.forked == 2 and launcher.spawned == 0
    # No zygote reports the orphaned kernel's exit now: its death is still told at once.
    died = await a.execute("import os; os.kill(os.getpid(), 9)")
    assert died.outcome is Outcome.DIED, died


async def test_sandboxed_fork_failure_falls_back_to_spawn(jailed_pool: KernelPool, tmp_path: Path) -> None:
    launcher = jailed_pool.launcher
    assert isinstance(launcher, ForkingLauncher)
    data = tmp_path / "data.csv"  # a file, not a folder: the jail cannot mount it at /data
    data.write_text("x\n")
    data.chmod(0o644)
    session = await jailed_pool.get_or_start("j:file-data", KernelOptions(data_dir=data))
    assert launcher.spawned == 1 and launcher.forked == 0
    assert (await session.execute("open('/data').read()")).result == "'x\\n'"
    zygote = launcher.server.pid
    forked = await jailed_pool.get_or_start("j:next")
    assert launcher.forked == 1 and launcher.server.pid == zygote  # the zygote survived the failed fork
    assert (await forked.execute("1 + 1")).result == "2"
