"""One-shot processes (:mod:`kernels.oneshot.runner`): real processes, plain and inside bubblewrap,
spawned (a fresh interpreter each) and forked (from the one-shot fork server).

Each bound is checked from outside: the process list (psutil) after a run past its deadline,
the bytes that came back from a run that writes too much, and, inside the sandbox, what a
one-shot can reach (a listener on the host's loopback, the bot's environment, a workspace).
Forked ones also share nothing with the jobs before them.
"""

from __future__ import annotations

import asyncio
import os
import socket
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest

from kernels.build import oneshot_for, spawn_launcher
from kernels.gateway.launcher import GatewayLauncher
from kernels.oneshot.runner import ONESHOT_PREFIX, OneShot, OneShotUnavailableError
from tests.kernels.conftest import kernel_settings
from tests.security.conftest import SKIP_REASON

SANDBOXES = ["none", pytest.param("bwrap", marks=pytest.mark.skipif(bool(SKIP_REASON), reason=SKIP_REASON or ""))]
KINDS = ["spawned", "forked"]


def runner(root: Path, sandbox: str) -> OneShot:
    return OneShot(spawn_launcher(kernel_settings(root, sandbox=sandbox), run_root=root))


@asynccontextmanager
async def running(root: Path, sandbox: str, kind: str) -> AsyncIterator[OneShot]:
    """A runner whose one-shots are spawned, or forked by its one-shot fork server (started here)."""
    oneshot = OneShot(spawn_launcher(kernel_settings(root, sandbox=sandbox), run_root=root), fork=kind == "forked")
    await oneshot.open()
    try:
        assert await oneshot.wait_ready() == (kind == "forked")
        yield oneshot
    finally:
        await oneshot.close()


def job_process(job: object) -> list[psutil.Process]:
    """The process a forked job's first run happens in (its command line is the one-shot
    server's: only the job knows it); none for a spawned one."""
    ahead = getattr(job, "_ahead", None)
    if ahead is None:
        return []
    try:
        return [psutil.Process(ahead.pid)]
    except psutil.NoSuchProcess:
        return []


def marked(marker: str, *, python_only: bool = False) -> list[psutil.Process]:
    """Processes whose command line carries ``marker`` (bwrap's too, unless ``python_only``)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "name"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or []):
                if not python_only or (proc.info["name"] or "").startswith("python"):
                    found.append(proc)
        except psutil.Error:
            continue
    return found


def scratch_folders(root: Path) -> list[str]:
    run_root = root / f"threadbook-{os.getuid()}"
    return [name for name in os.listdir(run_root) if name.startswith(ONESHOT_PREFIX)] if run_root.is_dir() else []


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP listener on the host's 127.0.0.1 (its port)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_a_run_past_its_deadline_is_killed_with_everything_it_started(
    tmp_path: Path, sandbox: str, kind: str
) -> None:
    marker = f"tb-oneshot-{os.urandom(4).hex()}"
    # A child that leaves the process group, and the main process: both sleep forever.
    code = textwrap.dedent(f"""
        import os, subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"], start_new_session=True)
        print("started", flush=True)
        time.sleep(600)
    """)
    async with running(tmp_path, sandbox, kind) as oneshot, oneshot.job() as job:
        forked = job_process(job)
        run = asyncio.create_task(job.run_python(["-c", code, marker], timeout=3, max_output=1000))
        while not run.done() and len(marked(marker, python_only=True) + forked) < 2:
            await asyncio.sleep(0.05)
        assert len(marked(marker, python_only=True) + forked) == 2, "both processes should run before the deadline"
        result = await run
    assert result.timed_out and result.exit_code is None and not result.ok
    assert result.output == b"started\n"
    assert marked(marker) == []
    assert not any(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE for proc in forked)
    assert scratch_folders(tmp_path) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_output_past_the_cap_is_cut_and_the_run_killed(tmp_path: Path, sandbox: str, kind: str) -> None:
    marker = f"tb-oneshot-{os.urandom(4).hex()}"
    code = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    async with running(tmp_path, sandbox, kind) as oneshot, oneshot.job() as job:
        forked = job_process(job)
        result = await job.run_python(["-c", code, marker], timeout=60, max_output=100_000)
    assert result.cut and not result.timed_out and not result.ok
    assert result.output == b"x" * 100_000
    assert marked(marker) == []
    assert not any(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE for proc in forked)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_a_run_reads_the_descriptor_the_bot_opened_and_writes_only_its_scratch_folder(
    tmp_path: Path, sandbox: str, kind: str
) -> None:
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    fd = os.open(data, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    async with running(tmp_path, sandbox, kind) as oneshot:
        try:
            result = await oneshot.run("preview", [str(fd), "data.csv"], timeout=60, max_output=10_000, fd=fd)
        finally:
            os.close(fd)
        assert result.ok, result.errors
        assert b"CSV, 1 rows" in result.output
        with pytest.raises(ValueError):
            await oneshot.run("snapshot", [], timeout=5, max_output=10)
    assert scratch_folders(tmp_path) == []


@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_forked_jobs_share_no_state(tmp_path: Path, sandbox: str) -> None:
    """A job that changes a module the one-shot server imported changes its own copy: the next
    job (and one running beside it) sees the module as imported, in a process of its own."""
    change = textwrap.dedent("""
        import os, threadbook_kernel.preview as preview
        preview.READ_BYTES = 1
        preview._SEEN = os.getpid()
        print(preview.READ_BYTES, hasattr(preview, "_SEEN"))
    """)
    look = 'import threadbook_kernel.preview as preview\nprint(preview.READ_BYTES, hasattr(preview, "_SEEN"))'
    async with running(tmp_path, sandbox, "forked") as oneshot:
        async with oneshot.job() as first:
            pids = [proc.pid for proc in job_process(first)]
            changed = await first.run_python(["-c", change], timeout=30, max_output=1000)
        outcomes = []
        for _ in range(3):
            async with oneshot.job() as job:
                pids += [proc.pid for proc in job_process(job)]
                outcomes.append(await job.run_python(["-c", look], timeout=30, max_output=1000))
    assert changed.ok and changed.output == b"1 True\n", changed.errors
    assert [o.output for o in outcomes] == [f"{4 * 2**20} False\n".encode()] * 3
    assert len(set(pids)) == 4  # a process of its own each


async def test_a_dead_one_shot_server_falls_back_to_spawn_and_comes_back(tmp_path: Path) -> None:
    """The one-shot fork server shares the kernels' fork server's life (``ServerProcess``): killed,
    its jobs are spawned meanwhile, it is started again, and jobs are forked from it again."""
    hello = ["-c", "print('hi')"]
    async with running(tmp_path, "none", "forked") as oneshot:
        server = oneshot.server
        assert server is not None and server.starts == 1
        first = server.pid
        assert first is not None
        os.kill(first, 9)
        while server.running:
            await asyncio.sleep(0.01)
        async with oneshot.job() as job:
            assert job_process(job) == []  # spawned: no process made ahead
            spawned = await job.run_python(hello, timeout=30, max_output=100)
        for _ in range(200):
            if server.running and server._made:
                break
            await asyncio.sleep(0.05)
        assert server.starts == 2 and server.pid not in (None, first)
        async with oneshot.job() as job:
            assert job_process(job)  # made ahead by the new server (the old one's were thrown away)
            forked = await job.run_python(hello, timeout=30, max_output=100)
        again = server.pid
    assert spawned.ok and spawned.output == b"hi\n" and forked.ok and forked.output == b"hi\n"
    assert again is not None and not psutil.pid_exists(again)
    assert scratch_folders(tmp_path) == []


async def test_an_unavailable_runner_says_why() -> None:
    oneshot = OneShot.unavailable("no kernel environment here")
    assert not oneshot.available
    with pytest.raises(OneShotUnavailableError, match="no kernel environment here"):
        await oneshot.run("preview", ["3", "x.csv"], timeout=5, max_output=10)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.skipif(bool(SKIP_REASON), reason=SKIP_REASON or "")
async def test_inside_the_sandbox_no_network_no_bot_environment_no_other_workspace(
    tmp_path: Path, listener: int, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-oneshot-canary")
    other = tmp_path / "workspaces" / "someone-else"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("TOP SECRET")
    code = textwrap.dedent(f"""
        import json, os, socket
        seen = {{}}
        try:
            socket.create_connection(("127.0.0.1", {listener}), timeout=2).close()
            seen["connect"] = "connected"
        except OSError as exc:
            seen["connect"] = type(exc).__name__
        seen["environ"] = "xoxb-oneshot-canary" in repr(os.environ)
        procs = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                procs.append(open(f"/proc/{{pid}}/environ", "rb").read())
            except OSError:
                pass
        seen["proc_environ"] = any(b"xoxb-oneshot-canary" in p for p in procs)
        seen["other"] = os.path.exists({str(other / "secret.txt")!r})
        seen["uid"] = os.getuid()
        seen["pid"] = os.getpid()
        print(json.dumps(seen))
    """)
    async with running(tmp_path, "bwrap", kind) as oneshot, oneshot.job() as job:
        assert oneshot.sandboxed
        result = await job.run_python(["-c", code], timeout=30, max_output=10_000)
    assert result.ok, result.errors
    seen = __import__("json").loads(result.output)
    assert seen["connect"] != "connected"
    assert seen == {**seen, "environ": False, "proc_environ": False, "other": False}
    assert seen["uid"] != os.getuid()
    assert seen["pid"] <= 3  # its own pid namespace


async def test_gateway_kernels_run_one_shots_locally_or_say_they_cannot(tmp_path: Path) -> None:
    gateway = {"url": "http://127.0.0.1:9"}
    settings = kernel_settings(tmp_path, gateway=gateway)
    local = oneshot_for(settings, GatewayLauncher(settings))
    assert local.available and not local.sandboxed  # sandbox: none here, as the settings say
    async with local.job() as job:
        assert (await job.run_python(["-c", "print(6 * 7)"], timeout=30, max_output=100)).output == b"42\n"
    missing = kernel_settings(tmp_path, gateway=gateway, python=tmp_path / "no-such-python")
    unavailable = oneshot_for(missing, GatewayLauncher(missing))
    assert not unavailable.available
    with pytest.raises(OneShotUnavailableError, match="no kernel environment or sandbox on the bot's machine"):
        await unavailable.run("preview", ["3", "x.csv"], timeout=5, max_output=10)


def test_scratch_folders_of_a_bot_that_is_gone_are_removed(tmp_path: Path) -> None:
    run_root = tmp_path / f"threadbook-{os.getuid()}"
    run_root.mkdir(mode=0o700)  # as the bot makes it
    gone = 2**22 + 1  # above the largest pid_max: no process has it
    (run_root / f"{ONESHOT_PREFIX}{gone}-abc" / "work").mkdir(parents=True)
    (run_root / f"{ONESHOT_PREFIX}{os.getpid()}-def" / "work").mkdir(parents=True)
    runner(tmp_path, "none")
    assert scratch_folders(tmp_path) == [f"{ONESHOT_PREFIX}{os.getpid()}-def"]


def test_nothing_is_removed_from_a_run_root_that_is_not_the_bots_own(tmp_path: Path) -> None:
    """A run root someone else could have made (open to others) is not walked or cleaned."""
    run_root = tmp_path / f"threadbook-{os.getuid()}"
    stale = run_root / f"{ONESHOT_PREFIX}{2**22 + 1}-abc"
    (stale / "work").mkdir(parents=True)
    run_root.chmod(0o777)
    runner(tmp_path, "none")
    assert stale.is_dir()
