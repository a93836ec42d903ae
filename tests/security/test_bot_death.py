"""A bot killed with SIGKILL (the OOM killer, ``kill -9``) takes its kernels along, frozen or not.

Between turns every kernel is frozen (:mod:`kernels.host.freezing`): its cgroup's freezer,
else ``SIGSTOP`` of its process tree. A frozen process acts on no signal until it is thawed,
the death signal of a dead parent (``bwrap --die-with-parent``, ``PR_SET_PDEATHSIG``) and the
fork server's lifeline included. Here a child process runs the bot's kernel layer (a real
``KernelPool``), starts two thread kernels, runs a cell in each that leaves a background
child and a ``setsid`` daemon behind (``background_processes: true``), and reports every
process of each kernel once the turn is over and the kernel frozen. The test checks that
they are frozen, SIGKILLs the child (only the child: no process group is signalled), and
polls for up to 3 s: no kernel process may be alive then (a zombie waiting for the host's
init to reap it is dead), nor any process of the kernels' uids, nor a kernel's cgroup.

Cases: kernels spawned by bwrap and forked by the sandboxed fork server, each with per-kernel
cgroups (frozen by the cgroup's freezer) and without (``SIGSTOP``); the unsandboxed launcher
(``sandbox: none``) with and without cgroups; and the unprivileged bot of ``test_nonroot.py``
(user namespaces, no cgroup), spawned and forked.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from kernels.host.cgroups import KernelCgroup, detected
from tests.conftest import KERNEL_PYTHON
from tests.security.conftest import SKIP_REASON
from tests.security.test_nonroot import Layout, _child_env, _drop, _leftovers, layout  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
#: How long the kernels of a killed bot may take to die.
DEATH_S = 3.0
CHILD_START_S = 60.0
#: Run in each kernel: a background child (and, with ``DAEMON``, a daemon that left the process tree).
LEAVE_BEHIND = r"""
import subprocess
child = subprocess.Popen(['sleep', '600'])
if DAEMON:
    subprocess.run(['sh', '-c', 'setsid sleep 601 </dev/null >/dev/null 2>&1 &'])
print('left', child.pid)
"""
CGROUPS = detected()[0] is not None


def _processes(pid: int | None, cgroup: KernelCgroup | None) -> list[dict[str, Any]]:
    """Every process of one kernel now: its tree and its cgroup's members."""
    found: dict[int, psutil.Process] = {}
    if pid is not None:
        try:
            root = psutil.Process(pid)
            found.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        except psutil.Error:
            pass
    if cgroup is not None:
        for member in cgroup.pids():
            try:
                found.setdefault(member, psutil.Process(member))
            except psutil.Error:
                pass
    rows = []
    for proc in found.values():
        try:
            rows.append(
                {"pid": proc.pid, "created": proc.create_time(), "status": proc.status(), "uid": proc.uids().real}
            )
        except psutil.Error:
            continue
    return rows


def _freezer_state(cgroup: KernelCgroup | None) -> str | None:
    for folder in [] if cgroup is None else cgroup.folders:
        if (folder / "freezer.state").exists():
            return (folder / "freezer.state").read_text().strip()
        if (folder / "cgroup.events").exists() and (folder / "cgroup.freeze").exists():
            return "FROZEN" if "frozen 1" in (folder / "cgroup.events").read_text() else "THAWED"
    return None


async def child_main(root: Path, sandbox: str, source: str, cgroups: bool) -> None:
    """(In the child) start two thread kernels, leave processes behind in each, let them be
    frozen, print one JSON line describing them, then wait to be killed."""
    from kernels import KernelOptions, KernelPool
    from kernels.build import spawn_launcher
    from kernels.forking.launcher import ForkingLauncher
    from kernels.host.cgroups import Cgroups
    from kernels.local.launcher import KernelLauncher
    from kernels.seam.settings import KernelSettings
    from kernels.spawn.handle import LocalKernelHandle

    tmp = Path(tempfile.gettempdir())  # TMPDIR: this run's scratch folder
    settings = KernelSettings(
        sandbox=sandbox,  # type: ignore[arg-type]
        workspace_root=root / "ws",
        preload=(),
        exec_timeout_s=15,
        interrupt_grace_s=1,
        max_kernels=4,
        memory_mb=512,
        max_processes=64,
        max_file_mb=10,
        fork_server=source == "fork",
        python=Path(os.environ.get("THREADBOOK_TEST_KERNEL_PYTHON") or KERNEL_PYTHON),
        packages={"dir": tmp / "packages"},
    )
    spawn = spawn_launcher(settings)
    if not cgroups:
        spawn.spawner.cgroups = Cgroups(None, memory_mb=512, max_processes=64, reason="switched off by the test")
    launcher: KernelLauncher = ForkingLauncher(spawn) if source == "fork" else spawn
    pool = KernelPool(settings, launcher=launcher)
    await pool.start()
    if isinstance(launcher, ForkingLauncher):
        assert launcher.available, "the fork server did not start"
    options = KernelOptions(background_processes=True)
    sessions = await asyncio.gather(*(pool.get_or_start(f"slack:C1:thread-{n}", options) for n in "ab"))
    report: dict[str, Any] = {"kernels": [], "cgroups": spawn.spawner.cgroups.enabled}
    # Unsandboxed and without a cgroup nothing reaches a daemon that left the tree (docs/security.md).
    daemon = sandbox != "none" or cgroups
    for session in sessions:
        result = await session.execute(f"DAEMON = {daemon}\n{LEAVE_BEHIND}")
        assert result.ok and "left" in result.stdout, (result.outcome, result.error, result.stdout)
    if isinstance(launcher, ForkingLauncher):
        report["forked"] = launcher.forked
        report["zygote"] = _processes(launcher.server.pid, None)
    for session in sessions:  # the turn is over: each kernel is frozen
        handle = session._handle
        assert isinstance(handle, LocalKernelHandle) and session._frozen
        cgroup = handle.cgroup
        report["kernels"].append(
            {
                "processes": await asyncio.to_thread(_processes, handle.pid, cgroup),
                "freezer": await asyncio.to_thread(_freezer_state, cgroup),
                "cgroup": [] if cgroup is None else [str(folder) for folder in cgroup.folders],
            }
        )
    print(json.dumps(report), flush=True)
    await asyncio.sleep(3600)  # killed here


def _alive(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The processes of ``rows`` still running (the same process: its start time matches)."""
    left = []
    for row in rows:
        try:
            proc = psutil.Process(row["pid"])
            if abs(proc.create_time() - row["created"]) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                left.append({**row, "status": proc.status()})
        except psutil.Error:
            continue
    return left


def _of_uids(uids: set[int]) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        try:
            if proc.info["uids"].real in uids and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _clean_up(report: dict[str, Any] | None) -> None:
    """Whatever outlived the test's bot: thawed, killed, its cgroups removed."""
    if report is None:
        return
    for kernel in report["kernels"]:
        if kernel["cgroup"]:
            KernelCgroup(tuple(Path(folder) for folder in kernel["cgroup"] if Path(folder).exists())).remove()
        for row in _alive(kernel["processes"]):
            try:
                psutil.Process(row["pid"]).kill()
            except psutil.Error:
                pass


def _kill_bot_and_check(argv: list[str], env: dict[str, str], cwd: Path, *, kernel_uids: bool) -> dict[str, Any]:
    """Run the child, check its kernels are frozen, SIGKILL it, check nothing of them is left
    within :data:`DEATH_S`; its report."""
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    report: dict[str, Any] | None = None
    try:
        assert child.stdout is not None
        line = _read_line(child, CHILD_START_S)
        report = json.loads(line)
        assert report is not None
        kernels = report["kernels"]
        assert len(kernels) == 2
        for kernel in kernels:
            rows = kernel["processes"]
            assert len(rows) >= 2, rows  # the kernel, its background child (the daemon, the sandbox)
            if kernel["freezer"] is not None:
                assert kernel["freezer"] == "FROZEN", kernel
            else:
                assert all(row["status"] == psutil.STATUS_STOPPED for row in rows), rows
        uids = {row["uid"] for kernel in kernels for row in kernel["processes"]} - {0, os.getuid()}
        # Everything the bot started (kernels, the fork server, its helpers) must end with it.
        started = _processes(child.pid, None)[1:]
        child.send_signal(signal.SIGKILL)  # the bot alone: what the OOM killer does
        child.wait(10)
        deadline = time.monotonic() + DEATH_S
        while True:
            left = [row for kernel in kernels for row in _alive(kernel["processes"])]
            left += _alive(report.get("zygote", [])) + _alive(started)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert not left, f"processes of the bot alive {DEATH_S:.0f} s after its SIGKILL: {left}"
        if kernel_uids:
            assert not _of_uids(uids), f"processes of the kernels' uids {uids} outlived the bot"
        cgroups = [folder for kernel in kernels for folder in kernel["cgroup"]]
        deadline = time.monotonic() + DEATH_S
        while (kept := [f for f in cgroups if Path(f).exists()]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not kept, f"the cgroups of a dead bot's kernels are left: {kept}"
        return report
    finally:
        if child.poll() is None:
            child.kill()
        _, err = child.communicate()
        _clean_up(report)
        if report is None:
            pytest.fail(f"the bot's kernel layer did not report:\n{err[-3000:]}")


def _read_line(child: subprocess.Popen[str], timeout: float) -> str:
    """The child's first line of output (it fails the test if none comes in ``timeout``)."""
    assert child.stdout is not None
    result: list[str] = []
    stdout = child.stdout
    reader = threading.Thread(target=lambda: result.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not result or not result[0].strip():
        child.kill()
        _, err = child.communicate()
        pytest.fail(f"the bot's kernel layer did not report within {timeout:.0f} s:\n{err[-3000:]}")
    return result[0]


@pytest.fixture
def scratch() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="threadbook-death-"))
    root.chmod(0o755)  # the kernels' uids must reach their workspaces
    (root / "tmp").mkdir()
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "sigstop"])
@pytest.mark.parametrize("source", ["spawn", "fork"])
@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_frozen_kernels_die_with_a_killed_bot(scratch: Path, sandbox: str, source: str, cgroups: bool) -> None:
    """As root (per-workspace uids, a cgroup freezer where the host has one)."""
    if sandbox == "bwrap" and SKIP_REASON:
        pytest.skip(SKIP_REASON)
    if cgroups and not CGROUPS:
        pytest.skip("no per-kernel cgroups on this machine (run as root with cgroups)")
    if os.geteuid() != 0:
        pytest.skip("runs as root (test_unprivileged_bots_frozen_kernels_die_with_it covers a normal user)")
    argv = [sys.executable, "-m", "tests.security.test_bot_death", str(scratch), sandbox, source, str(int(cgroups))]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(scratch / "tmp")}
    report = _kill_bot_and_check(argv, env, REPO, kernel_uids=sandbox == "bwrap")
    assert report["cgroups"] is cgroups
    if source == "fork":
        assert report["forked"] == 2, "the kernels were not forked"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source", ["spawn", "fork"])
def test_unprivileged_bots_frozen_kernels_die_with_it(layout: Layout, source: str) -> None:  # noqa: F811
    """As a normal user (the Docker image): kernels in user namespaces, no cgroup (SIGSTOP)."""
    argv = [
        *_drop(),
        str(layout.venv / "bin" / "python"),
        "-m",
        "tests.security.test_bot_death",
        str(layout.root),
        "bwrap",
        source,
        "0",
    ]
    report = _kill_bot_and_check(argv, _child_env(layout), layout.root, kernel_uids=False)
    assert report["cgroups"] is False
    if source == "fork":
        assert report["forked"] == 2, "the kernels were not forked"
    deadline = time.monotonic() + DEATH_S
    while (left := [p for p in _leftovers(layout.root) if p.status() != psutil.STATUS_ZOMBIE]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not left, f"processes outlived the unprivileged bot: {left}"


if __name__ == "__main__":
    _root, _sandbox, _source, _cgroups = sys.argv[1:5]
    asyncio.run(child_main(Path(_root), _sandbox, _source, _cgroups == "1"))
