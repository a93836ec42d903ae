"""Attacks run by model-written code, each in a real sandboxed kernel.

Every test asserts that the attack is contained and that a neighbour thread's kernel keeps
answering ``1+1`` while (or right after) the attack runs, then records what was observed;
the records become the table in docs/security.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kernels import ExecutionResult, KernelSession, Outcome, UnsafePathError
from kernels.host.leftovers import process_tree
from kernels.sandbox.args import SHM_INODES, TMP_INODES
from kernels.sandbox.slirp import DNS, GATEWAY, GUEST, host_networks
from tests.security.conftest import CANARY, BotKey, HostFiles, Outcomes, cgroup_folders, read_key

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: The kernel code's helper: try something, return the exception's name (and errno name) or "ok".
TRY = """
import errno, json, os
def attempt(action):
    try:
        value = action()
    except BaseException as exc:
        code = getattr(exc, 'errno', None)
        return f"{type(exc).__name__}" + (f" ({errno.errorcode[code]})" if code in errno.errorcode else "")
    return 'ok' if value is None or not isinstance(value, (str, bytes)) else ('ok: ' + str(value)[:200])
"""


async def attack(
    attacker: KernelSession, neighbour: KernelSession, code: str, *, timeout: float = 5, overlap: bool = False
) -> ExecutionResult:
    """Run ``code`` in the attacker's kernel; the neighbour must answer ``1+1`` meanwhile.

    ``overlap``: the neighbour runs while the attack is still going (long-running attacks).
    """

    async def neighbour_answers() -> None:
        if overlap:
            await asyncio.sleep(0.5)  # let the attack get going first
        started = time.monotonic()
        answer = await neighbour.execute("1+1", timeout=10)
        assert answer.ok and answer.result == "2", answer
        assert time.monotonic() - started < 5, "the neighbour's 1+1 was slowed down by the attack"

    if overlap:
        result, _ = await asyncio.gather(attacker.execute(TRY + code, timeout=timeout), neighbour_answers())
    else:
        result = await attacker.execute(TRY + code, timeout=timeout)
        await neighbour_answers()
    return result


def report(result: ExecutionResult) -> dict[str, Any]:
    """The JSON the attack code printed last."""
    assert result.outcome is Outcome.OK, (result.outcome, result.error, result.stdout[-2000:])
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


@contextlib.asynccontextmanager
async def recording_port(host: str) -> AsyncIterator[tuple[int, list[str]]]:
    """A TCP port of the bot's process on ``host``; yields (port, peers that connected)."""
    seen: list[str] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(str(writer.get_extra_info("peername")))
        writer.close()

    server = await asyncio.start_server(on_connect, host, 0)
    try:
        yield server.sockets[0].getsockname()[1], seen
    finally:
        server.close()
        await server.wait_closed()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def listener() -> AsyncIterator[tuple[int, list[str]]]:
    """A TCP port of the bot's process on 127.0.0.1 (like its HTTP port); records connections."""
    async with recording_port("127.0.0.1") as port:
        yield port


async def test_secrets_in_environment(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    assert os.environ["SLACK_BOT_TOKEN"] == CANARY  # the bot's own environment has them
    data = report(
        await attack(
            attacker,
            neighbour,
            """
print(json.dumps({'leaked': sorted(k for k, v in os.environ.items() if 'tb-canary' in v),
                  'names': sorted(os.environ)}))
""",
        )
    )
    assert data["leaked"] == [] and not {"SLACK_BOT_TOKEN", "OPENAI_API_KEY"} & set(data["names"])
    outcomes.record(
        "read tokens from `os.environ`",
        f"absent: the kernel gets an allow-listed environment ({len(data['names'])} variables, no token)",
    )


async def test_secrets_in_proc_environ(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    data = report(
        await attack(
            attacker,
            neighbour,
            """
pids = [p for p in os.listdir('/proc') if p.isdigit()]
leaks = [p for p in pids if 'tb-canary' in attempt(lambda: open(f'/proc/{p}/environ', 'rb').read().decode(errors='replace'))]
print(json.dumps({'pid1': attempt(lambda: open('/proc/1/environ', 'rb').read().decode(errors='replace')),
                  'visible': len(pids), 'leaks': leaks}))
""",
        )
    )
    assert data["leaks"] == [] and CANARY not in data["pid1"]
    assert data["visible"] < 10, "the kernel sees processes outside its pid namespace"
    outcomes.record(
        "read `/proc/1/environ` (and every `/proc/*/environ`)",
        f"{data['pid1'].split(':')[0]}; own pid namespace: {data['visible']} processes visible, no token",
    )


async def test_parent_environ(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    bot_pid = os.getpid()
    data = report(
        await attack(
            attacker,
            neighbour,
            f"""
print(json.dumps({{'ppid': os.getppid(),
                  'parent': attempt(lambda: open(f'/proc/{{os.getppid()}}/environ', 'rb').read().decode(errors='replace')),
                  'bot': attempt(lambda: open('/proc/{bot_pid}/environ', 'rb').read().decode(errors='replace'))}}))
""",
        )
    )
    assert CANARY not in data["parent"] and CANARY not in data["bot"]
    parent = _parent(data["ppid"])
    outcomes.record(
        "read the parent's environ (`/proc/$PPID/environ`, the bot's host pid)",
        f"{parent}: {data['parent'].split(':')[0]}; bot's pid: {data['bot']}",
    )


def _parent(ppid: int) -> str:
    """What a kernel's parent is, from the ``os.getppid()`` it sees."""
    if ppid == 0:  # a forked kernel: the zygote forked it into its supervisor's pid namespace
        return "the parent is outside the kernel's pid namespace (`os.getppid()` is 0)"
    return f"parent is the sandbox's init (pid {ppid})"


async def test_bot_config_and_database(
    attacker: KernelSession, neighbour: KernelSession, host_files: HostFiles, outcomes: Outcomes
) -> None:
    targets = {"config": host_files.config, "database": host_files.database}
    relative = {name: os.path.relpath(path, attacker.workspace.path) for name, path in targets.items()}
    data = report(
        await attack(
            attacker,
            neighbour,
            f"""
targets, relative = {json.dumps({k: str(v) for k, v in targets.items()})}, {json.dumps(relative)}
out = {{}}
for name, path in targets.items():
    out[name + ' absolute'] = attempt(lambda: open(path, 'rb').read().decode(errors='replace'))
    out[name + ' relative'] = attempt(lambda: open(relative[name], 'rb').read().decode(errors='replace'))
    os.symlink(path, name + '-link')
    out[name + ' symlink'] = attempt(lambda: open(name + '-link', 'rb').read().decode(errors='replace'))
out['repo config.yaml'] = attempt(lambda: open('/work/main/config.yaml').read())
print(json.dumps(out))
""",
        )
    )
    assert all(CANARY not in value and value.startswith("FileNotFoundError") for value in data.values()), data
    for name in targets:  # the bot itself never follows a planted link either
        with pytest.raises(UnsafePathError):
            attacker.workspace.open_file(f"{name}-link")
    outcomes.record(
        "read the bot's config and SQLite DB (absolute path, `../` path, planted symlink)",
        "FileNotFoundError: not in the sandbox's file system; the bot refuses to follow the "
        "planted symlink (UnsafePathError)",
    )


async def test_other_threads_workspace(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    target = neighbour.workspace.path / "secret.txt"
    assert target.read_text() == CANARY
    relative = os.path.relpath(target, attacker.workspace.path)
    data = report(
        await attack(
            attacker,
            neighbour,
            f"""
out = {{'absolute': attempt(lambda: open({str(target)!r}).read()),
       'relative': attempt(lambda: open({relative!r}).read()),
       'parent dir': attempt(lambda: os.listdir('..'))}}
os.symlink({str(target)!r}, 'neighbour-link')
out['symlink'] = attempt(lambda: open('neighbour-link').read())
print(json.dumps(out))
""",
        )
    )
    assert all(CANARY not in value for value in data.values()), data
    assert data["absolute"].startswith("FileNotFoundError") and data["symlink"].startswith("FileNotFoundError")
    assert data["parent dir"] == "ok", data  # `/` inside the sandbox: no workspaces there
    outcomes.record(
        "read another thread's workspace (absolute path, `../` path, planted symlink)",
        f"absolute: {data['absolute']}; relative: {data['relative']}; symlink: {data['symlink']}",
    )


async def test_write_outside_workspace(
    attacker: KernelSession, neighbour: KernelSession, host_files: HostFiles, outcomes: Outcomes
) -> None:
    marker = f"pwned-{os.getpid()}"
    targets = ["/usr", "/etc", "/", str(attacker.workspace.path.parent), "/data", "/root/.pyenv", "/work"]
    data = report(
        await attack(
            attacker,
            neighbour,
            f"""
out = {{t: attempt(lambda: open(os.path.join(t, {marker!r}), 'w').write('x')) for t in {targets!r}}}
out['/tmp (private)'] = attempt(lambda: open('/tmp/{marker}', 'w').write('x'))
out['data env'] = os.environ.get('THREADBOOK_DATA_DIR')
out['data read'] = attempt(lambda: open('/data/sales.csv').read())
print(json.dumps(out))
""",
        )
    )
    for target in targets:
        assert not data[target].startswith("ok"), (target, data[target])
        if not target.startswith("/data"):
            assert not _landed(Path(target) / marker)
    assert not (host_files.data_dir / marker).exists() and not Path(f"/tmp/{marker}").exists()
    assert data["data env"] == "/data" and data["data read"].startswith("ok: region")
    assert data["/tmp (private)"].startswith("ok")
    errors = sorted({value.split(" (")[-1].rstrip(")") for key, value in data.items() if key in targets})
    outcomes.record(
        "write outside the workspace (`/usr`, `/etc`, `/`, the workspaces folder, the channel's `/data`)",
        f"refused ({', '.join(errors)}); `/tmp` works but is a private tmpfs; `/data` is readable, read-only",
    )


async def test_connect_to_bot_port(
    attacker: KernelSession, neighbour: KernelSession, listener: tuple[int, list[str]], outcomes: Outcomes
) -> None:
    port, seen = listener
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # the port is really open on the host
    await asyncio.sleep(0.05)
    seen.clear()
    data = report(
        await attack(
            attacker,
            neighbour,
            f"""
import socket
out = {{'127.0.0.1': attempt(lambda: socket.create_connection(('127.0.0.1', {port}), timeout=2).close()),
       'localhost': attempt(lambda: socket.create_connection(('localhost', {port}), timeout=2).close()),
       'interfaces': sorted(n for _, n in socket.if_nameindex())}}
print(json.dumps(out))
""",
        )
    )
    assert data["127.0.0.1"].startswith("ConnectionRefusedError") and data["interfaces"] == ["lo"]
    assert not data["localhost"].startswith("ok")
    assert seen == [], "the kernel reached the bot's port"
    outcomes.record(
        "connect to the bot's port on 127.0.0.1", f"{data['127.0.0.1']}: own network namespace, only its own `lo`"
    )


async def test_connect_outside(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    data = report(
        await attack(
            attacker,
            neighbour,
            """
import socket, time
start = time.monotonic()
out = {'192.0.2.1:80': attempt(lambda: socket.create_connection(('192.0.2.1', 80), timeout=3).close())}
out['seconds'] = time.monotonic() - start
print(json.dumps(out))
""",
        )
    )
    assert data["192.0.2.1:80"] == "OSError (ENETUNREACH)" and data["seconds"] < 1
    outcomes.record(
        "connect to an outside address (192.0.2.1:80, TEST-NET)",
        "OSError (ENETUNREACH) at once: no route out of the network namespace",
    )


async def test_resolve_dns(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    data = report(
        await attack(
            attacker,
            neighbour,
            """
import socket
print(json.dumps({'example.com': attempt(lambda: socket.getaddrinfo('example.com', 443)),
                  'resolv.conf': os.path.exists('/etc/resolv.conf')}))
""",
        )
    )
    assert data["example.com"].startswith("gaierror") and not data["resolv.conf"]
    outcomes.record("resolve DNS (`example.com`)", f"{data['example.com']}: no resolver, no network")


async def test_fork_bomb(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    limit = attacker.settings.max_processes
    result = await attack(
        attacker,
        neighbour,
        """
import subprocess, time
bomb = subprocess.Popen(['bash', '-c', ':(){ :|:& };:'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
peak = 0
for _ in range(15):
    time.sleep(0.1)
    peak = max(peak, sum(1 for p in os.listdir('/proc') if p.isdigit()))
print(json.dumps({'peak': peak}))
""",
        overlap=True,
    )
    data = report(result)
    assert 10 < data["peak"] <= limit, data
    outcomes.record(
        "fork bomb (`:(){ :|:& };:`)",
        f"capped by RLIMIT_NPROC (limit {limit} per kernel uid, "
        f"threads included); the pid namespace dies with the kernel",
    )


async def test_memory_bomb(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    limit = attacker.settings.memory_mb
    data = report(
        await attack(
            attacker,
            neighbour,
            """
chunks = []
try:
    while True:
        chunks.append(bytearray(32 * 2**20))
except MemoryError:
    got = len(chunks) * 32
del chunks
print(json.dumps({'mb': got}))
""",
            overlap=True,
            timeout=20,
        )
    )
    assert data["mb"] < limit
    after = await attacker.execute("1+1")
    assert after.result == "2" and not after.kernel_restarted
    outcomes.record("memory bomb", f"MemoryError after ~{limit} MiB (RLIMIT_DATA); the kernel stays alive")


def _landed(path: Path) -> bool:
    """Whether ``path`` exists on the host (a folder the bot cannot even search: no, as the
    kernel, never more privileged than the bot, could not have written there either)."""
    try:
        return path.exists()
    except PermissionError:
        return False


def _without_cgroup(session: KernelSession, outcomes: Outcomes, attack_name: str) -> None:
    """Record and skip an attack only a cgroup contains, where this bot could make none."""
    launcher = session.launcher
    spawner = getattr(launcher, "spawner", None)  # local launchers, spawning or forking
    if spawner is not None and spawner.cgroups.enabled:
        return
    isolation = launcher.isolation
    outcomes.record(
        attack_name,
        f"not contained: no cgroup can be made here; rlimits only, as the start-up log "
        f"and `status` say (`{isolation}`)",
    )
    pytest.skip(f"no cgroup for this bot ({isolation})")


def _memory_file(session: KernelSession, v1: str, v2: str) -> int | None:
    """A counter of the kernel's memory cgroup read on the host (None without one)."""
    for folder in cgroup_folders(session):
        for name in (v1, v2):
            if (folder / name).exists():
                return int((folder / name).read_text())
    return None


async def test_memory_in_child_processes(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    """Four children of 350 MiB each: each passes the per-process RLIMIT_DATA, together they
    are over ``memory_mb``; the kernel's memory cgroup holds the sum."""
    _without_cgroup(attacker, outcomes, "four child processes of 350 MiB each (together over `memory_mb`)")
    limit = attacker.settings.memory_mb
    result = await attack(
        attacker,
        neighbour,
        """
import subprocess, sys
child = "b = bytearray(350 * 2**20); print('held', flush=True); import time; time.sleep(3)"
procs = [subprocess.Popen([sys.executable, '-c', child], stdout=subprocess.PIPE, text=True) for _ in range(4)]
print(json.dumps({'codes': [p.wait() for p in procs]}))
""",
        overlap=True,
        timeout=30,
    )
    data = report(result)
    peak = _memory_file(attacker, "memory.max_usage_in_bytes", "memory.peak")
    assert data["codes"].count(0) <= 1 and all(code in (0, -9) for code in data["codes"]), data
    assert peak is None or peak <= limit * 2**20, (peak, limit)
    after = await attacker.execute("1+1")
    assert after.result == "2" and not after.kernel_restarted
    killed = data["codes"].count(-9)
    outcomes.record(
        "four child processes of 350 MiB each (together over `memory_mb`)",
        f"{killed} of 4 killed by the OOM killer of the kernel's memory cgroup (limit {limit} MiB for all its "
        f"processes; peak {peak / 2**20 if peak else 0:.0f} MiB); the kernel itself stays alive",
    )


async def test_shared_memory_mapping(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    """A 1.5 GiB shared anonymous mapping, touched: RLIMIT_DATA does not count shared memory,
    the memory cgroup does."""
    _without_cgroup(attacker, outcomes, "1.5 GiB shared `mmap` (`MAP_SHARED|MAP_ANONYMOUS`, touched)")
    result = await attack(
        attacker,
        neighbour,
        """
import mmap
area = mmap.mmap(-1, 1536 * 2**20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
for offset in range(0, len(area), 4096):
    area[offset] = 1
print(json.dumps({'touched_mb': len(area) // 2**20}))
""",
        timeout=30,
    )
    assert result.outcome is Outcome.DIED, (result.outcome, result.stdout[-500:])
    assert "stopped by its memory limit" in (result.notice or ""), result.notice
    after = await attacker.execute("1+1")
    assert after.result == "2" and after.kernel_restarted
    outcomes.record(
        "1.5 GiB shared `mmap` (`MAP_SHARED|MAP_ANONYMOUS`, touched)",
        f"the kernel is killed by its memory cgroup's OOM killer at {attacker.settings.memory_mb} MiB "
        "(shared memory counts there, not in RLIMIT_DATA); the next cell gets a fresh kernel and is told so",
    )


async def test_many_empty_files(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    """300k empty files in the private tmpfs cost the host kernel memory per inode: capped."""
    if os.geteuid() != 0 and outcomes.source == "spawn":
        outcomes.record(
            "300k empty files in `/tmp` (and `/dev/shm`)",
            "not inode-capped: a spawned kernel's "
            "sandbox cannot remount its tmpfs as a normal user (size caps hold; forked kernels are capped)",
        )
        pytest.skip("no inode cap for kernels spawned by a non-root bot (docs/security.md)")
    data = report(
        await attack(
            attacker,
            neighbour,
            """
def fill(folder, count):
    made = 0
    try:
        for made in range(count):
            open(f'{folder}/f{made}', 'w').close()
    except OSError as exc:
        return {'made': made, 'error': errno.errorcode[exc.errno], 'inodes': os.statvfs(folder).f_files}
    return {'made': count, 'error': None, 'inodes': os.statvfs(folder).f_files}
print(json.dumps({'tmp': fill('/tmp', 300_000), 'shm': fill('/dev/shm', 300_000)}))
""",
            overlap=True,
            timeout=60,
        )
    )
    memory = _memory_file(attacker, "memory.usage_in_bytes", "memory.current")
    for folder in ("tmp", "shm"):
        assert data[folder]["error"] == "ENOSPC" and data[folder]["made"] < data[folder]["inodes"], data
    assert data["tmp"]["inodes"] == TMP_INODES and data["shm"]["inodes"] == SHM_INODES, data
    outcomes.record(
        "300k empty files in `/tmp` (and `/dev/shm`)",
        f"ENOSPC after {data['tmp']['made']:,} (`/tmp`) and {data['shm']['made']:,} (`/dev/shm`) files: inode-capped "
        f"tmpfs; their kernel memory is charged to the kernel's cgroup ({memory / 2**20 if memory else 0:.0f} MiB "
        "in use afterwards)",
    )


async def test_bot_session_keyring(
    attacker: KernelSession, neighbour: KernelSession, bot_key: BotKey | None, outcomes: Outcomes
) -> None:
    """A key in the bot's session keyring is not reachable from a kernel."""
    if bot_key is None:
        pytest.skip("keyrings cannot be used on this machine (keyctl refused)")
    assert read_key(bot_key) == CANARY.encode()  # the bot itself can read it
    add_key, request_key, keyctl = bot_key.syscalls
    data = report(
        await attack(
            attacker,
            neighbour,
            f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(*args):
    result = libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return result if result >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
buffer = ctypes.create_string_buffer(256)
out = {{'read': call({keyctl}, 11, {bot_key.serial}, buffer, 256),
       'search': call({request_key}, b'user', {bot_key.description.encode()!r}, None, 0),
       'bot keyring': call({keyctl}, 6, {bot_key.keyring}, buffer, 256),
       'own keyring': call({keyctl}, 0, -3, 0)}}
out['leaked'] = {CANARY!r}.encode() in buffer.raw
print(json.dumps(out))
""",
        )
    )
    assert not data["leaked"] and data["read"] in ("EACCES", "ENOKEY"), data
    # A non-root bot's kernels share its uid on the host: the keyring may be *described*
    # (view permission of the same uid), never searched or read.
    described = os.geteuid() != 0 and isinstance(data["bot keyring"], int)
    assert data["search"] == "ENOKEY" and (described or data["bot keyring"] in ("EACCES", "ENOKEY")), data
    assert isinstance(data["own keyring"], int) and data["own keyring"] != bot_key.keyring, data
    outcomes.record(
        "read a key from the bot's session keyring (`keyctl read`, `request_key`)",
        f"read: {data['read']}; search: {data['search']}; the kernel has its own new session keyring",
    )


async def test_background_processes(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    """Busy loops a cell leaves behind (``setsid``, a double-forked orphan) are killed when it returns."""
    loop = "import time\nstarted = time.perf_counter()\nsum(range(3_000_000))\nprint(time.perf_counter() - started)"

    async def neighbour_loop_s() -> float:
        times = []
        for _ in range(3):
            result = await neighbour.execute(loop, timeout=10)
            assert result.ok, result
            times.append(float(result.stdout))
        return min(times)

    before = await neighbour_loop_s()
    states = """
def state(pid):
    try:
        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0]
    except OSError:
        return 'gone'
running = lambda: sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and state(p) not in ('Z', 'gone'))
"""
    baseline = report(await attacker.execute(TRY + states + "print(json.dumps(running()))"))
    result = await attacker.execute(
        TRY
        + states
        + """
import subprocess, sys
spin = [sys.executable, '-c', 'while True: pass']
pids = [subprocess.Popen(spin, start_new_session=True).pid for _ in range(3)]
subprocess.run(['sh', '-c', 'setsid "$0" -c "while True: pass" </dev/null >/dev/null 2>&1 &', sys.executable])
import time; time.sleep(0.3)
print(json.dumps({'pids': pids, 'running': len(running())}))
"""
    )
    data = report(result)
    assert data["running"] >= len(baseline) + 4, data  # all four were spinning when the cell ended
    assert result.notice is not None and "4 background process(es)" in result.notice, result.notice
    after = report(
        await attacker.execute(
            TRY + states + f"print(json.dumps({{'states': [state(p) for p in {data['pids']}], 'running': running()}}))"
        )
    )
    assert set(after["states"]) <= {"Z", "gone"} and after["running"] == baseline, after
    handle = attacker._handle
    assert handle is not None
    if handle.cgroup is not None:
        assert handle.cgroup.pids() == set(handle.infrastructure)
    slowest = await neighbour_loop_s()
    assert slowest < before * 1.5 + 0.05, (before, slowest)
    outcomes.record(
        "leave busy loops running after the cell (3 `setsid` children, 1 double-forked orphan)",
        f'all 4 killed when the cell returned ("{result.notice}"); the neighbour\'s loop took '
        f"{before * 1000:.0f} ms before and {slowest * 1000:.0f} ms after",
    )


#: CAP_SYS_RESOURCE: only a writer holding it sets the floor below which a process cannot lower its score.
CAP_SYS_RESOURCE = 24


async def test_oom_score(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    """Kernels are the OOM killer's first choice (and, where the bot holds CAP_SYS_RESOURCE,
    cannot lower that themselves)."""
    handle = attacker._handle
    assert handle is not None and handle.pid is not None
    tree = {proc.pid for proc in process_tree(handle.pid)}  # a jailed forked kernel's supervisor too
    scores = {pid: Path(f"/proc/{pid}/oom_score_adj").read_text().strip() for pid in tree}
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    sets_floor = bool(int(status["CapEff"], 16) >> CAP_SYS_RESOURCE & 1)
    bot_score = Path("/proc/self/oom_score_adj").read_text().strip()
    assert set(scores.values()) == {"1000"} and bot_score != "1000", (scores, bot_score)
    data = report(
        await attack(
            attacker,
            neighbour,
            """
def lower():
    with open('/proc/self/oom_score_adj', 'w') as handle:
        handle.write('0')
print(json.dumps({'own': open('/proc/self/oom_score_adj').read().strip(), 'lower': attempt(lower)}))
""",
        )
    )
    assert data["own"] == "1000", data
    if sets_floor:
        assert data["lower"].startswith("PermissionError"), data
        lowering = f"writing 0 from inside: {data['lower']}"
    else:
        lowering = (
            f"writing 0 from inside: {data['lower']} here, because the bot lacks CAP_SYS_RESOURCE (only a "
            "writer holding it makes 1000 a floor); the kernel still has its own memory limit"
        )
    outcomes.record(
        "the kernel's OOM score (read on the host), and lowering it from inside",
        f"`oom_score_adj` 1000 for all {len(tree)} processes of the kernel (the bot: {bot_score}); {lowering}",
    )


async def test_fill_the_disk(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    data = report(
        await attack(
            attacker,
            neighbour,
            """
def fill(folder, mb, per_file):
    block, written, names = b'0' * 2**20, 0, []
    try:
        while written < mb:
            names.append(os.path.join(folder, f'big-{len(names)}.bin'))
            with open(names[-1], 'wb') as f:
                for _ in range(min(per_file, mb - written)):
                    f.write(block); f.flush(); written += 1
    except OSError as exc:
        return f"{errno.errorcode[exc.errno]} after {written} MiB"
    finally:
        for name in names:
            os.path.exists(name) and os.remove(name)
    return f"ok {written} MiB"
print(json.dumps({'workspace': fill('.', 100, 100), 'tmp': fill('/tmp', 400, 8), 'shm': fill('/dev/shm', 400, 8)}))
""",
            overlap=True,
            timeout=30,
        )
    )
    file_mb = attacker.settings.max_file_mb
    assert data["workspace"] == f"EFBIG after {file_mb} MiB", data
    assert data["tmp"].startswith("ENOSPC") and data["shm"].startswith("ENOSPC"), data
    outcomes.record(
        "fill the disk (one huge file; fill `/tmp` and `/dev/shm`)",
        f"workspace file: {data['workspace']} (RLIMIT_FSIZE); `/tmp`: {data['tmp']}; "
        f"`/dev/shm`: {data['shm']} (size-capped tmpfs)",
    )


async def test_spin_forever(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    result = await attack(attacker, neighbour, "while True:\n    pass", timeout=2, overlap=True)
    assert result.outcome is Outcome.TIMEOUT_INTERRUPTED, result
    after = await attacker.execute("1+1")
    assert after.result == "2"
    outcomes.record(
        "spin forever (`while True: pass`)",
        "stopped at the execution timeout by a message-mode interrupt; variables kept",
    )


async def test_print_100_mb(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    result = await attacker.execute(
        "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)", timeout=60
    )
    answer = await neighbour.execute("1+1", timeout=10)
    assert answer.result == "2"
    assert result.truncated and len(result.stdout) <= 2 * attacker.settings.max_output_bytes
    outcomes.record("print 100 MB", f"kept to {attacker.settings.max_output_bytes} bytes (middle truncated)")


async def test_kill_the_parent(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    bot_pid = os.getpid()
    # A forked kernel's parent is outside its pid namespace (getppid() is 0, and kill(0) would
    # signal its own process group): it tries its namespace's pid 1, its supervisor, instead.
    ppid = report(await attacker.execute(TRY + "print(json.dumps({'ppid': os.getppid()}))"))["ppid"]
    result = await attack(
        attacker,
        neighbour,
        f"""
import signal
out = {{'kill ppid': attempt(lambda: os.kill({ppid or 1}, signal.SIGKILL)),
       'kill bot pid': attempt(lambda: os.kill({bot_pid}, signal.SIGKILL)),
       'kill -1': attempt(lambda: os.kill(-1, signal.SIGKILL))}}
print(json.dumps(out))
""",
    )
    after = await attacker.execute("1+1")  # reaching this line means the bot (this process) survived
    assert after.result == "2"
    if result.outcome is Outcome.OK:
        data = report(result)
        parent = data["kill ppid"]
        if parent == "ok":  # same uid as the kernel, but pid 1 of its namespace: the signal is dropped
            parent = "ok, ignored (the sandbox's init, pid 1 of the kernel's pid namespace, has no handler)"
        if not ppid:
            parent = f"{_parent(ppid)}; `kill -9 1` (its supervisor): {parent}"
        else:
            parent = f"`kill -9 $PPID`: {parent}"
        observed = (
            f"{parent}; the bot's pid: {data['kill bot pid']}; `kill -9 -1`: "
            f"{data['kill -1']} (reaches only the sandbox's own processes)"
        )
    else:  # the sandbox's init ran as the kernel's own uid and took the kernel with it
        observed = f"the kernel killed its own sandbox ({result.outcome.value}); it was restarted"
    outcomes.record("kill the parent (`os.kill(os.getppid(), 9)`, the bot's pid, `kill -9 -1`)", observed)


async def test_setuid_file(attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes) -> None:
    data = report(
        await attack(
            attacker,
            neighbour,
            """
import shutil, subprocess
shutil.copy('/usr/bin/id', 'suid-id')
os.chmod('suid-id', 0o4755)
out = {'chown root': attempt(lambda: os.chown('suid-id', 0, 0)),
       'euid': subprocess.run(['./suid-id', '-u'], capture_output=True, text=True).stdout.strip(),
       'uid': os.getuid()}
print(json.dumps(out))
""",
        )
    )
    host = (attacker.workspace.path / "suid-id").stat()
    # EINVAL: in a non-root bot's user namespace uid 0 is not even mapped.
    assert data["chown root"] in ("PermissionError (EPERM)", "OSError (EINVAL)"), data
    assert data["euid"] == str(data["uid"]) != "0"
    assert host.st_uid != 0 and host.st_uid != os.getuid() or os.getuid() != 0
    assert host.st_mode & stat.S_ISUID  # the bit is set, but on a file owned by the kernel's uid
    chown = data["chown root"].split(" (")[-1].rstrip(")")
    outcomes.record(
        "create a setuid file",
        "allowed, but owned by the kernel's unprivileged uid, `chown root` → "
        f"{chown}, running it keeps the same uid (nosuid bind + no_new_privs)",
    )


async def test_escape_with_unshare_or_mount(
    attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes
) -> None:
    marker = f"pwned-{os.getpid()}"
    data = report(
        await attack(
            attacker,
            neighbour,
            f"""
import subprocess
def run(*cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    return f"exit {{done.returncode}}: {{(done.stderr.strip().splitlines() or [''])[0][:80]}}"
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
out = {{'mount tmpfs': run('mount', '-t', 'tmpfs', 'none', '/workspace'),
       'unshare remount /usr rw': run('unshare', '-Urm', 'sh', '-c', 'mount -o remount,rw /usr && touch /usr/{marker}'),
       'unshare mount host root': run('unshare', '-Urm', 'sh', '-c', 'mount --bind / /tmp && ls /tmp/work/main'),
       'CapEff': status['CapEff'].strip(), 'CapBnd': status['CapBnd'].strip(),
       'NoNewPrivs': status['NoNewPrivs'].strip()}}
print(json.dumps(out))
""",
        )
    )
    assert not Path(f"/usr/{marker}").exists()
    assert data["CapEff"] == data["CapBnd"] == "0000000000000000" and data["NoNewPrivs"] == "1"
    assert data["mount tmpfs"].startswith("exit ") and not data["mount tmpfs"].startswith("exit 0")
    assert not data["unshare remount /usr rw"].startswith("exit 0")
    assert "config.yaml" not in data["unshare mount host root"]
    outcomes.record(
        "escape via `mount` / `unshare -Urm` (remount `/usr` rw, bind the real `/`)",
        f"no capabilities, no_new_privs; mount: {data['mount tmpfs'].split(': ', 1)[-1] or 'refused'}; "
        f"nested namespace: {data['unshare remount /usr rw'].split(': ', 1)[-1] or 'refused'}; "
        "`/` inside is the sandbox's own root",
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def open_listener() -> AsyncIterator[tuple[int, list[str]]]:
    """A bot port bound to every host address (``http_host: 0.0.0.0``, the default); records connections."""
    async with recording_port("0.0.0.0") as port:
        yield port


#: Inside a kernel: its interfaces, tap0's address, the default gateway, the resolver.
NET_FACTS = """
import fcntl, socket, struct
def tap_address():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # SIOCGIFADDR: no traffic
        return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack('256s', b'tap0'))[20:24])
def default_gateway():
    for line in open('/proc/net/route').read().splitlines()[1:]:
        fields = line.split()
        if fields[1] == '00000000':
            return fields[0] + ' via ' + socket.inet_ntoa(struct.pack('<I', int(fields[2], 16)))
facts = {'interfaces': sorted(n for _, n in socket.if_nameindex()), 'address': attempt(tap_address),
         'gateway': default_gateway(), 'resolv.conf': attempt(lambda: open('/etc/resolv.conf').read()),
         'secrets': sorted(k for k, v in os.environ.items() if 'tb-canary' in v)}
"""


async def test_network_kernel_reaches_not_the_bot(
    net_attacker: KernelSession,
    neighbour: KernelSession,
    listener: tuple[int, list[str]],
    open_listener: tuple[int, list[str]],
    outcomes: Outcomes,
) -> None:
    """``network: true``: a real tap0 via slirp4netns, yet neither the host's loopback (directly or
    through slirp's 10.0.2.2) nor the host's own addresses are reachable, and no secret is in."""
    port, seen = listener
    open_port, open_seen = open_listener
    host_addresses = [str(net.network_address) for net in host_networks() if net.prefixlen == 32]
    for port_ in (port, open_port):
        with socket.create_connection(("127.0.0.1", port_), timeout=2):
            pass  # both ports are really open on the host
    await asyncio.sleep(0.05)
    seen.clear()
    open_seen.clear()
    data = report(
        await attack(
            net_attacker,
            neighbour,
            NET_FACTS
            + f"""
connect = lambda host, port: attempt(lambda: socket.create_connection((host, port), timeout=2).close())
facts['127.0.0.1'] = connect('127.0.0.1', {port})
facts['10.0.2.2'] = connect('10.0.2.2', {port})
facts['10.0.2.2 (0.0.0.0 port)'] = connect('10.0.2.2', {open_port})
facts['host'] = {{address: connect(address, {open_port}) for address in {host_addresses!r}}}
print(json.dumps(facts))
""",
            timeout=15,
        )
    )
    assert data["interfaces"] == ["lo", "tap0"] and data["address"] == f"ok: {GUEST}"
    assert data["gateway"] == f"tap0 via {GATEWAY}" and data["resolv.conf"] == f"ok: nameserver {DNS}\n"
    assert data["secrets"] == []
    assert not data["127.0.0.1"].startswith("ok") and not data["10.0.2.2"].startswith("ok")
    assert not data["10.0.2.2 (0.0.0.0 port)"].startswith("ok")
    assert all(outcome == "PermissionError (EACCES)" for outcome in data["host"].values()), data["host"]
    assert seen == [] and open_seen == [], "a kernel with network reached the bot's port"
    outcomes.record(
        "`network: true` kernel: connect to the bot's port (127.0.0.1, slirp's host alias 10.0.2.2, "
        "the host's own addresses for a port bound to 0.0.0.0)",
        f"has `tap0` {GUEST} via {GATEWAY} (slirp4netns), yet 127.0.0.1: {data['127.0.0.1']}; "
        f"10.0.2.2: {data['10.0.2.2']} (`--disable-host-loopback`); host addresses "
        f"({len(data['host'])}): PermissionError (EACCES) (prohibit routes); no token in the environment",
    )


async def test_network_kernel_cannot_lift_its_blocks(
    net_attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes
) -> None:
    data = report(
        await attack(
            net_attacker,
            neighbour,
            """
import shutil, subprocess
ip = shutil.which('ip') or '/usr/sbin/ip'
def run(*args):
    done = subprocess.run([ip, *args], capture_output=True, text=True)
    return f"exit {done.returncode}: {done.stderr.strip()}"
rejects = lambda: sum(int(line.split()[3], 16) & 0x200 != 0 for line in open('/proc/net/route').read().splitlines()[1:])
before = rejects()
out = {'route del': run('route', 'del', 'prohibit', '169.254.0.0/16'),
       'addr add': run('addr', 'add', '10.0.3.1/24', 'dev', 'tap0'), 'before': before, 'after': rejects()}
print(json.dumps(out))
""",
        )
    )
    assert not data["route del"].startswith("exit 0") and not data["addr add"].startswith("exit 0"), data
    assert data["before"] == data["after"] == len(host_networks()), data
    outcomes.record(
        "`network: true` kernel: remove the blocking routes (`ip route del`, `ip addr add`)",
        f"refused ({data['route del']}): the kernel's uid has no CAP_NET_ADMIN; "
        f"all {data['after']} prohibit routes stay",
    )
