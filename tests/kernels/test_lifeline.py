"""The kernel warden (``kernels/host/warden.py``) and the bot's lifeline to it, with real kernels.

What a SIGKILL of the bot does to frozen kernels is ``tests/security/test_bot_death.py``; here:
the warden is a small process of its own, outside every kernel cgroup, that nothing the bot
starts inherits the lifeline of; a warden that died is replaced at once (with every kernel told
again), so a bot killed before any kernel starts or freezes again still takes its frozen kernels
along; and it fails closed - no warden, no kernel start and no freeze.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_asyncio

from kernels import KernelPool, build_pool
from kernels.host.cgroups import detected
from kernels.host.lifeline import WARDEN, Lifeline, WardenUnavailableError
from kernels.local.launcher import KernelLauncher
from kernels.seam.result import KernelStartError
from kernels.spawn.handle import LocalKernelHandle
from tests.kernels.conftest import kernel_processes, kernel_settings
from tests.security.test_bot_death import DEATH_S, _alive, _clean_up, _processes, _read_line

pytestmark = pytest.mark.timeout(90)
MISSING_PYTHON = "/nonexistent/threadbook-python"
LEAVE_A_CHILD = "import subprocess\nchild = subprocess.Popen(['sleep', '600'])"
REPO = Path(__file__).resolve().parents[2]


@pytest_asyncio.fixture
async def pool(tmp_path: Path) -> AsyncIterator[KernelPool]:
    kernel_pool = build_pool(kernel_settings(tmp_path))
    await kernel_pool.start()
    yield kernel_pool
    await kernel_pool.shutdown_all()


def _lifeline(pool: KernelPool) -> Lifeline:
    assert isinstance(pool.launcher, KernelLauncher)
    return pool.launcher.spawner.lifeline


def _kernel_tree(handle: LocalKernelHandle) -> list[psutil.Process]:
    assert handle.pid is not None
    root = psutil.Process(handle.pid)
    return [root, *root.children(recursive=True)]


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running (not zombies)."""
    left = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
        except psutil.NoSuchProcess:
            continue
    return left


async def _gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``procs`` still running (not zombies) after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = await asyncio.to_thread(_running, procs)
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.02)


async def test_the_warden_is_a_small_process_of_its_own(pool: KernelPool) -> None:
    lifeline = _lifeline(pool)
    assert lifeline.pid is not None, "opening the pool starts the warden"
    warden = psutil.Process(lifeline.pid)
    assert warden.cmdline()[1:] == ["-I", "-S", str(WARDEN)]
    assert warden.ppid() == os.getpid() and os.getsid(warden.pid) == warden.pid  # its own session
    assert warden.environ() == {}
    # Standard library only, no site: a few MiB, not the bot's imports.
    assert warden.memory_info().rss < 30 * 2**20
    assert lifeline.start_seconds < 5
    async with pool.lease("t:a") as session:
        assert (await session.execute(LEAVE_A_CHILD)).ok
    handle = session._handle
    assert isinstance(handle, LocalKernelHandle)
    if handle.cgroup is not None:
        own = Path(f"/proc/{warden.pid}/cgroup").read_text()
        assert all(folder.name not in own for folder in handle.cgroup.folders), "the warden is in a kernel cgroup"
    # The lifeline's write end is the bot's alone: a kernel holding it would keep the warden
    # from ever seeing the bot's death.
    pipe = os.readlink(f"/proc/{warden.pid}/fd/0")
    assert pipe.startswith("pipe:")
    for proc in _kernel_tree(handle):
        for fd in os.listdir(f"/proc/{proc.pid}/fd"):
            try:
                assert os.readlink(f"/proc/{proc.pid}/fd/{fd}") != pipe, f"{proc} holds the lifeline"
            except FileNotFoundError:
                continue


async def test_a_dead_warden_is_replaced_before_the_next_freeze(pool: KernelPool) -> None:
    """Killed while the kernel is frozen, the warden comes back at the next freeze and knows
    the kernel: closing the lifeline (what the bot's death does) kills it, frozen, with its child."""
    lifeline = _lifeline(pool)
    async with pool.lease("t:b") as session:
        assert (await session.execute(LEAVE_A_CHILD)).ok
    first = lifeline.pid
    assert first is not None
    dead = psutil.Process(first)  # before the kill: the lifeline reaps it as it replaces it
    os.kill(first, signal.SIGKILL)
    await asyncio.to_thread(dead.wait, 5)
    async with pool.lease("t:b") as session:
        assert (await session.execute("x = 1")).ok
    assert lifeline.pid not in (None, first), "no new warden before the kernel was frozen again"
    handle = session._handle
    assert isinstance(handle, LocalKernelHandle) and session._frozen
    tree = await asyncio.to_thread(_kernel_tree, handle)
    assert len(tree) >= 2
    await asyncio.to_thread(lifeline.close)
    assert not await _gone(tree, 3.0), "the new warden did not kill the frozen kernel"


async def test_the_warden_sweeps_a_frozen_cgroup_and_removes_it(pool: KernelPool) -> None:
    if detected()[0] is None:
        pytest.skip("no per-kernel cgroups on this machine (run as root with cgroups)")
    async with pool.lease("t:c") as session:
        assert (await session.execute(LEAVE_A_CHILD)).ok
    handle = session._handle
    assert isinstance(handle, LocalKernelHandle) and handle.cgroup is not None and handle.cgroup.can_freeze
    folders = handle.cgroup.folders
    tree = await asyncio.to_thread(_kernel_tree, handle)
    await asyncio.to_thread(_lifeline(pool).close)
    assert not await _gone(tree, 3.0)
    assert not [folder for folder in folders if folder.exists()], "the warden left the kernel's cgroup"


async def test_no_warden_no_kernel(tmp_path: Path) -> None:
    """Fail closed at start-up: the pool does not open (the bot exits with this one line)."""
    kernel_pool = build_pool(kernel_settings(tmp_path))
    _lifeline(kernel_pool).python = MISSING_PYTHON
    try:
        with pytest.raises(WardenUnavailableError) as raised:
            await kernel_pool.start()
        message = str(raised.value)
        assert "\n" not in message and "kernel warden" in message and MISSING_PYTHON in message
        assert "ulimit" in message  # what to check
        with pytest.raises(KernelStartError, match="kernel warden"):
            await kernel_pool.get_or_start("t:d")
        assert kernel_processes() == [], "a kernel started without a warden"
    finally:
        await kernel_pool.shutdown_all()


async def test_a_kernel_is_not_frozen_without_a_warden(pool: KernelPool) -> None:
    """Fail closed between turns: when no warden can be had at the end of a turn, the kernel
    is stopped (the thread is told), not left frozen where a dead bot would leave it for good."""
    lifeline = _lifeline(pool)
    async with pool.lease("t:e") as session:
        assert (await session.execute("x = 1")).ok
        handle = session._handle
        assert isinstance(handle, LocalKernelHandle)
        tree = await asyncio.to_thread(_kernel_tree, handle)
        warden = lifeline.pid
        assert warden is not None
        lifeline.python = MISSING_PYTHON
        dead = psutil.Process(warden)
        os.kill(warden, signal.SIGKILL)
        await asyncio.to_thread(dead.wait, 5)
        assert (await session.execute("x")).ok  # the cell runs; the freeze after it cannot be made safe
    assert not session._frozen and session._handle is None
    assert any("could not be frozen" in notice for notice in session.take_thread_notices())
    assert not await _gone(tree, 3.0)


async def _bot_main(root: Path) -> None:
    """(In the child: the bot) start a kernel, let it leave a child and be frozen, print one JSON
    line (the warden's pid, the kernel's processes and cgroup); then, starting and freezing
    nothing, wait up to 5 s for a new warden once the test killed this one, print its pid (null:
    none came), and wait to be killed."""
    pool = build_pool(kernel_settings(root, snapshot=False))  # no save after the turn: it thaws and freezes
    await pool.start()
    lifeline = _lifeline(pool)
    async with pool.lease("t:g") as session:
        assert (await session.execute(LEAVE_A_CHILD)).ok
    handle = session._handle
    assert isinstance(handle, LocalKernelHandle) and session._frozen
    cgroup = handle.cgroup
    report: dict[str, Any] = {
        "warden": lifeline.pid,
        "kernels": [
            {
                "processes": await asyncio.to_thread(_processes, handle.pid, cgroup),
                "cgroup": [] if cgroup is None else [str(folder) for folder in cgroup.folders],
            }
        ],
    }
    print(json.dumps(report), flush=True)
    deadline = time.monotonic() + 5
    while not lifeline.replaced and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    print(
        json.dumps({"warden": await asyncio.to_thread(lambda: lifeline.pid), "replaced": lifeline.replaced}), flush=True
    )
    await asyncio.sleep(3600)  # killed here


@pytest.fixture
def scratch() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="threadbook-lifeline-"))
    (root / "tmp").mkdir()
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)


def test_a_warden_that_dies_is_replaced_at_once_and_the_bots_death_still_kills_frozen_kernels(
    scratch: Path,
) -> None:
    """The warden is killed while the kernel is frozen; no kernel starts or freezes after; then
    the bot is killed (SIGKILL, what the OOM killer does): the frozen kernel dies with it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(scratch / "tmp")}
    argv = [sys.executable, "-m", "tests.kernels.test_lifeline", str(scratch)]
    child = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    report: dict[str, Any] | None = None
    try:
        report = json.loads(_read_line(child, 60))
        assert report is not None
        rows = report["kernels"][0]["processes"]
        assert len(rows) >= 2, rows  # the kernel and its background child
        os.kill(report["warden"], signal.SIGKILL)
        after = json.loads(_read_line(child, 15))
        child.send_signal(signal.SIGKILL)  # the bot alone
        child.wait(10)
        deadline = time.monotonic() + DEATH_S
        while (left := _alive(rows)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"frozen kernel processes alive {DEATH_S:.0f} s after the bot's SIGKILL: {left}"
        assert after["warden"] not in (None, report["warden"]) and after["replaced"] == 1, after
    finally:
        if child.poll() is None:
            child.kill()
        _, err = child.communicate()
        _clean_up(report)
        if report is None:
            pytest.fail(f"the bot did not report:\n{err[-3000:]}")


if __name__ == "__main__":
    asyncio.run(_bot_main(Path(sys.argv[1])))
