"""Real sandboxed kernels for the attack suite, a neighbour thread's kernel, host canaries.

The suite skips only when this machine cannot start the bubblewrap sandbox at all (the
probe says why). Every attack runs twice: against spawned kernels (``bwrap`` per kernel)
and against kernels forked by the sandboxed fork server (``kernels/fork/jail.py``; every
kernel of that run must really be forked). Every attack test records its observed
outcome; when the whole attack module ran and passed, the table in ``docs/security.md``
is regenerated from them.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import shutil
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from kernels import KernelOptions, KernelPool, KernelSession, KernelStartError, build_pool
from kernels.bwrap.launcher import BwrapLauncher, BwrapProvisioner
from kernels.forking.launcher import ForkingLauncher, ForkProvisioner
from kernels.host.interpreter import inspect_interpreter
from kernels.sandbox.probe import probe
from kernels.sandbox.support import detect_support
from kernels.seam.plan import ResourceLimits
from kernels.seam.settings import KernelSettings
from tests.conftest import KERNEL_PYTHON
from tests.security.report import write_table

CANARY = f"tb-canary-{uuid.uuid4().hex}"
SECRET_VARS = ("SLACK_BOT_TOKEN", "DISCORD_TOKEN", "OPENAI_API_KEY")
#: Set (by ``test_nonroot.py``) to a file: the outcomes go there as JSON instead of into docs/security.md.
ROWS_FILE_VAR = "THREADBOOK_ATTACK_ROWS"
ROOT_MODE = "root, kernels dropped to a per-workspace uid by setpriv"
#: The modules whose attacks make up the table in docs/security.md.
ATTACK_MODULES = ("test_attacks.py", "test_boundary.py")
#: Where the kernels come from: bwrap per kernel, or the sandboxed fork server.
SOURCES = ("spawn", "fork")


def _sandbox_skip_reason() -> str | None:
    try:
        settings = KernelSettings(python=KERNEL_PYTHON)
        python = inspect_interpreter(settings.python)
        probe(detect_support(python), python, ResourceLimits.from_settings(settings))
    except KernelStartError as exc:
        return f"this machine cannot create the kernel sandbox's namespaces: {exc}"
    return None


SKIP_REASON = _sandbox_skip_reason()
#: ``network: true`` tests skip only where slirp4netns is not installed (a failing probe fails them).
NO_SLIRP = (
    None
    if shutil.which("slirp4netns")
    else ("slirp4netns is not installed (apt-get install slirp4netns): network: true kernels stay offline here")
)


@dataclass
class Outcomes:
    """Attack → kernel source → observed outcome, in the order the tests ran."""

    rows: dict[str, dict[str, str]] = field(default_factory=dict)
    #: The kernel source of the test running now (set by the attacker fixtures).
    source: str = SOURCES[0]

    def record(self, attack: str, outcome: str) -> None:
        """Record one contained attack (call after the test's assertions passed)."""
        self.rows.setdefault(attack, {})[self.source] = outcome

    def count(self) -> int:
        """How many (attack, source) outcomes were recorded."""
        return sum(len(by_source) for by_source in self.rows.values())


@pytest.fixture(scope="session")
def outcomes(request: pytest.FixtureRequest) -> Iterator[Outcomes]:
    collected = Outcomes()
    yield collected
    attack_items = [item for item in request.session.items if item.path.name in ATTACK_MODULES]
    failed = request.session.testsfailed
    # Only a run of every attack (both modules, nothing deselected) rewrites the table.
    whole = {item.path.name for item in attack_items} == set(ATTACK_MODULES) and not (
        request.config.getoption("keyword") or request.config.getoption("markexpr")
    )
    if whole and not failed and collected.count() == len(attack_items):
        if rows_file := os.environ.get(ROWS_FILE_VAR):  # the unprivileged run of test_nonroot.py
            Path(rows_file).write_text(json.dumps(collected.rows))
            return
        write_table(Path(__file__).resolve().parents[2] / "docs" / "security.md", collected.rows, mode=ROOT_MODE)


@dataclass
class HostFiles:
    """Files of the bot that no kernel may read: config, database, a data dir for one channel."""

    config: Path
    database: Path
    data_dir: Path
    root: Path


@pytest.fixture(scope="module")
def host_files(tmp_path_factory: pytest.TempPathFactory) -> HostFiles:
    root = tmp_path_factory.mktemp("bot")
    config = root / "config.yaml"
    config.write_text(f"slack:\n  bot_token: {CANARY}\n")
    database = root / "threadbook.db"
    with sqlite3.connect(database) as db:
        db.execute("create table secrets (value text)")
        db.execute("insert into secrets values (?)", (CANARY,))
    data_dir = root / "channel-data"
    data_dir.mkdir()
    (data_dir / "sales.csv").write_text("region,amount\nnorth,10\n")
    # Kernels run as another uid: the channel's data must be world-readable (docs/security.md).
    for path in (root.parent, root, data_dir):
        path.chmod(0o755)
    (data_dir / "sales.csv").chmod(0o644)
    return HostFiles(config=config, database=database, data_dir=data_dir, root=root)


@pytest.fixture(scope="module")
def secret_env() -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in SECRET_VARS}
    os.environ.update({name: CANARY for name in SECRET_VARS})
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


#: (add_key, request_key, keyctl) syscall numbers; keyctl's own is what the bot uses too.
KEY_SYSCALLS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219), "riscv64": (217, 218, 219)}
KEY_SPEC_SESSION_KEYRING = -3
KEYCTL_GET_KEYRING_ID, KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_REVOKE, KEYCTL_READ = 0, 1, 3, 11


@dataclass(frozen=True)
class BotKey:
    """A key in the bot's (this test process's) session keyring, there before any kernel starts."""

    serial: int
    description: str
    keyring: int  # the session keyring's serial
    syscalls: tuple[int, int, int]


def _keys(*args: int | bytes | None) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    converted = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = int(libc.syscall(*converted))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def read_key(key: BotKey) -> bytes:
    """Read ``key`` as this process (raises OSError when it may not)."""
    buffer = ctypes.create_string_buffer(256)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    size = libc.syscall(
        ctypes.c_long(key.syscalls[2]),
        ctypes.c_long(KEYCTL_READ),
        ctypes.c_long(key.serial),
        buffer,
        ctypes.c_long(256),
    )
    if size < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return buffer.raw[:size]


@pytest.fixture(scope="session")
def bot_key() -> Iterator[BotKey | None]:
    """A secret in the session keyring of the bot (this process, in a fresh session keyring of
    its own so nothing else on the host is touched); None where keyrings are unusable here."""
    syscalls = KEY_SYSCALLS.get(os.uname().machine)
    if syscalls is None:
        yield None
        return
    add_key, _, keyctl = syscalls
    try:
        keyring = _keys(keyctl, KEYCTL_JOIN_SESSION_KEYRING, None)
        description = f"threadbook-test-{uuid.uuid4().hex[:8]}".encode()
        serial = _keys(add_key, b"user", description, CANARY.encode(), len(CANARY), KEY_SPEC_SESSION_KEYRING)
    except OSError:  # keyctl refused (a seccomp profile): no keyring to leak either
        yield None
        return
    key = BotKey(serial=serial, description=description.decode(), keyring=keyring, syscalls=syscalls)
    assert read_key(key) == CANARY.encode()
    yield key
    try:
        _keys(keyctl, KEYCTL_REVOKE, serial)
    except OSError:
        pass


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=SOURCES)
async def sandbox_pool(
    tmp_path_factory: pytest.TempPathFactory,
    secret_env: None,
    bot_key: BotKey | None,
    request: pytest.FixtureRequest,
) -> AsyncIterator[KernelPool]:
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    fork = request.param == "fork"
    root = tmp_path_factory.mktemp(f"sandboxed-{request.param}")
    settings = KernelSettings(
        workspace_root=root / "workspaces",
        sandbox="bwrap",
        exec_timeout_s=5,
        interrupt_grace_s=1,
        max_kernels=8,
        preload=(),
        memory_mb=640,
        max_processes=64,
        max_file_mb=10,
        max_output_bytes=10_000,
        workspace_quota_mb=64,
        fork_server=fork,
        python=KERNEL_PYTHON,
        packages={"dir": root / "packages"},
    )
    kernel_pool = build_pool(settings)
    await kernel_pool.start()
    if fork:
        launcher = kernel_pool.launcher
        assert isinstance(launcher, ForkingLauncher) and isinstance(launcher.spawn, BwrapLauncher)
        assert launcher.available, "the sandboxed fork server did not start"
    else:
        assert isinstance(kernel_pool.launcher, BwrapLauncher)
    yield kernel_pool
    await kernel_pool.shutdown_all()


def kernel_source(pool: KernelPool, session: KernelSession) -> str:
    """``fork`` or ``spawn``: where ``session``'s kernel came from."""
    assert session._handle is not None
    return "fork" if isinstance(session._handle.manager.provisioner, ForkProvisioner) else "spawn"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def neighbour(sandbox_pool: KernelPool) -> KernelSession:
    """Another thread's kernel, shared by the module; it keeps a secret file in its workspace."""
    session = await sandbox_pool.get_or_start("slack:C1:neighbour")
    assert kernel_source(sandbox_pool, session) == _expected_source(sandbox_pool)
    result = await session.execute(f"open('secret.txt', 'w').write({CANARY!r})")
    assert result.ok
    return session


@pytest_asyncio.fixture(loop_scope="module")
async def attacker(
    sandbox_pool: KernelPool, host_files: HostFiles, outcomes: Outcomes, request: pytest.FixtureRequest
) -> AsyncIterator[KernelSession]:
    """A fresh sandboxed kernel for one attack; afterwards nothing of it is left on the host."""
    key = f"slack:C2:attacker-{request.node.name}"
    session = await sandbox_pool.get_or_start(key, KernelOptions(data_dir=host_files.data_dir))
    outcomes.source = kernel_source(sandbox_pool, session)
    assert outcomes.source == _expected_source(sandbox_pool), "the fork server did not fork this kernel"
    tree = _sandbox_tree(session)
    uids = {proc.uids().real for proc in tree} - {0, os.getuid()}
    cgroups = cgroup_folders(session)
    assert cgroups or not sandbox_pool.launcher.spawner.cgroups.enabled, "the kernel got no cgroup"
    yield session
    cgroups += cgroup_folders(session)  # the kernel may have been replaced meanwhile
    await sandbox_pool.shutdown(key)
    assert not [folder for folder in cgroups if folder.exists()], "the kernel's cgroup outlived it"
    # A kernel that killed itself leaves bwrap's init to the host's init for a moment (the outer
    # bwrap exits first): give reaping a second; zombies count, they are still running.
    # (Measured: this host's init reaps such an orphan after ~1.1 s.)
    _, survivors = await asyncio.to_thread(psutil.wait_procs, tree, 3.0)
    assert not survivors, f"sandbox processes outlived the kernel's shutdown: {survivors}"
    left = await asyncio.to_thread(_processes_of, uids)
    assert not left, f"processes of the attacker's uid outlived its kernel: {left}"


def cgroup_folders(session: KernelSession) -> list[Path]:
    """The folders of the session's kernel's cgroup (none without cgroups or a kernel)."""
    handle = session._handle
    return [] if handle is None or handle.cgroup is None else list(handle.cgroup.folders)


def _expected_source(pool: KernelPool) -> str:
    return "fork" if isinstance(pool.launcher, ForkingLauncher) else "spawn"


def _sandbox_tree(session: KernelSession) -> list[psutil.Process]:
    handle = session._handle
    assert handle is not None and handle.pid is not None
    root = psutil.Process(handle.pid)
    return [root, *root.children(recursive=True)]


def _processes_of(uids: set[int]) -> list[str]:
    found = []
    for proc in psutil.process_iter(["uids", "status", "cmdline"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real in uids:
                found.append(f"{proc.pid} {proc.info['status']} {' '.join(proc.info['cmdline'] or [])[:60]}")
        except psutil.Error:
            continue
    return found


@pytest_asyncio.fixture(loop_scope="module")
async def net_attacker(
    sandbox_pool: KernelPool, outcomes: Outcomes, request: pytest.FixtureRequest
) -> AsyncIterator[KernelSession]:
    """A fresh sandboxed kernel with ``network: true`` (always spawned, even with the fork
    server on); afterwards neither it nor its slirp4netns is left on the host."""
    attack = f"`network: true` kernel: `{request.node.originalname}`"
    if NO_SLIRP:  # recorded for the table, as below: the run of every attack stays whole
        outcomes.source = _expected_source(sandbox_pool)
        outcomes.record(attack, f"not run: {NO_SLIRP}")
        pytest.skip(NO_SLIRP)
    launcher = sandbox_pool.launcher
    spawn = launcher.spawn if isinstance(launcher, ForkingLauncher) else launcher
    assert isinstance(spawn, BwrapLauncher)
    if spawn.network is None and os.geteuid() != 0:
        # As root the probe must work where slirp4netns is installed; a normal user may lack
        # /dev/net/tun. Recorded for the table, as the kernel then stays offline (one warning).
        outcomes.source = _expected_source(sandbox_pool)
        outcomes.record(attack, f"not run: network kernels stay offline here ({spawn.network_missing})")
        pytest.skip(f"slirp4netns cannot give this bot's kernels network: {spawn.network_missing}")
    key = f"slack:C3:net-{request.node.name}"
    session = await sandbox_pool.get_or_start(key, KernelOptions(network=True))
    assert kernel_source(sandbox_pool, session) == "spawn"
    outcomes.source = _expected_source(sandbox_pool)
    assert session._handle is not None
    provisioner = session._handle.manager.provisioner
    assert isinstance(provisioner, BwrapProvisioner) and provisioner.slirp is not None, (
        "slirp4netns is installed but the kernel got no network"
    )
    slirp = psutil.Process(provisioner.slirp.process.pid)
    assert slirp.name() == "slirp4netns"
    tree = _sandbox_tree(session)
    yield session
    await sandbox_pool.shutdown(key)
    survivors = [proc for proc in [*tree, slirp] if proc.is_running()]
    assert not survivors, f"processes outlived the network kernel's shutdown: {survivors}"
    assert _slirp_children() == [], "a slirp4netns of the bot outlived its kernel"


def _slirp_children() -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.name() == "slirp4netns":
                found.append(proc)
        except psutil.Error:
            continue
    return found
