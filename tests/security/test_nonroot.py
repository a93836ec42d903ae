"""The sandbox when the bot is not root (the Docker image's case), run for real.

Everything else in this suite runs as root, where bwrap keeps the host user namespace and
``setpriv`` drops each kernel's uid. Here a child process runs the bot's kernel layer
(``KernelPool`` with ``sandbox: bwrap``) as an unprivileged uid, so bwrap itself creates an
unprivileged user namespace per kernel (``--unshare-user --uid 1000 --cap-drop ALL``,
``--disable-userns``). The child starts two thread kernels, runs checks inside each and
prints them as JSON; this test asserts on them and on what the host sees afterwards.

The child needs a Python an unprivileged uid may run and whose ``sys.prefix`` holds
ipykernel, because the sandbox binds the interpreter's prefix (``python_roots()``) and
nothing else of the host: the project venv's interpreter lives under ``/root`` (0700).
So the test builds a virtualenv from Debian's ``/usr/bin/python3.11`` (the same CPython
3.11 ABI) whose site-packages hold hard links to ipykernel and its dependencies, exactly
as a normal user's own virtualenv would. Outside the sandbox the child imports the bot
from the repo and the project venv (``PYTHONPATH``, which the kernels never inherit).
"""

from __future__ import annotations

import asyncio
import importlib.metadata as metadata
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kernels.forking.launcher import ZYGOTE
from kernels.sandbox.args import SHM_INODES, SHM_SIZE_MB, TMP_INODES, TMP_SIZE_MB
from kernels.sandbox.identity import USERNS_UID
from kernels.sandbox.support import find_bwrap
from tests.security.conftest import ROWS_FILE_VAR
from tests.security.report import write_table

SYSTEM_PYTHON = Path("/usr/bin/python3.11")
#: The host uid the bot runs as in this test when the test itself runs as root.
UNPRIVILEGED = 65534
REPO = Path(__file__).resolve().parents[2]
SECRET_VARS = ("SLACK_BOT_TOKEN", "DISCORD_TOKEN", "OPENAI_API_KEY")
CHILD_TIMEOUT_S = 40.0
#: A file name every forbidden write uses, so the host can check that none landed.
STRAY = f"tb-nonroot-{uuid.uuid4().hex[:8]}"

#: Run inside each kernel; ``PARAMS`` is prepended. Prints one JSON line.
KERNEL_CHECKS = r"""
import errno, json, os, socket, subprocess

def attempt(action):
    try:
        action()
    except BaseException as exc:
        code = getattr(exc, "errno", None)
        return type(exc).__name__ + (f" ({errno.errorcode[code]})" if code in errno.errorcode else "")
    return "ok"

def write(path):
    with open(path, "w") as handle:
        handle.write("x")

def environ_leaks():
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            data = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        if PARAMS["canary"].encode() in data:
            found.append(pid)
    return found

status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
nested = subprocess.run(["unshare", "-U", "true"], capture_output=True, text=True, timeout=10)
open("made-by-kernel.txt", "w").write("x")
print(json.dumps({
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
    "status": {name: status[name].strip() for name in
               ("NoNewPrivs", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "Seccomp")},
    "interfaces": sorted(name for _, name in socket.if_nameindex()),
    "cwd": os.getcwd(),
    "env_secrets": sorted(k for k, v in os.environ.items() if k in PARAMS["secret_vars"] or PARAMS["canary"] in v),
    "environ_leaks": environ_leaks(),
    "own_secret": open("secret.txt").read(),
    "other_workspace": attempt(lambda: open(PARAMS["other_workspace"] + "/secret.txt").read()),
    "other_workspace_exists": os.path.exists(PARAMS["other_workspace"]),
    "other_run_dir": attempt(lambda: os.listdir(PARAMS["other_run_dir"])),
    "host_paths": {p: os.path.exists(p) for p in PARAMS["host_paths"]},
    "writes": {p: attempt(lambda p=p: write(p)) for p in PARAMS["forbidden_writes"]},
    "scratch_writes": {p: attempt(lambda p=p: write(p)) for p in ("/tmp/scratch", "/dev/shm/scratch", "/dev/null")},
    "tmpfs_mb": {p: os.statvfs(p).f_blocks * os.statvfs(p).f_frsize // 2**20 for p in ("/tmp", "/dev/shm")},
    "tmpfs_inodes": {p: os.statvfs(p).f_files for p in ("/tmp", "/dev/shm")},
    "data_read": open("/data/sales.csv").read(),
    "nested_userns": [nested.returncode, nested.stderr.strip()[-200:]],
    "pids": len([p for p in os.listdir("/proc") if p.isdigit()]),
}))
"""


@dataclass(frozen=True)
class Layout:
    """The folders of one run: all under a 0755 temp dir the unprivileged uid can reach."""

    root: Path
    venv: Path
    workspaces: Path
    tmp: Path  # the child's TMPDIR and HOME (its kernels' run dirs go under kernels.run_root's default)
    data: Path  # a channel's read-only data_dir

    @classmethod
    def under(cls, root: Path) -> Layout:
        return cls(root=root, venv=root / "venv", workspaces=root / "ws", tmp=root / "tmp", data=root / "data")


def _drop() -> list[str]:
    """The prefix that runs a command as the unprivileged uid (none when the test is not root)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups", "--inh-caps=-all"]


def _host_uid() -> int:
    return UNPRIVILEGED if os.geteuid() == 0 else os.getuid()


def _skip_reason() -> str | None:
    if not SYSTEM_PYTHON.exists():
        return f"{SYSTEM_PYTHON} is missing: no Python an unprivileged uid can run next to the project venv's"
    bwrap = find_bwrap()
    if bwrap is None or (os.geteuid() == 0 and shutil.which("setpriv") is None):
        return "bwrap or setpriv is missing"
    try:
        done = subprocess.run(
            [*_drop(), bwrap, "--unshare-user", "--ro-bind", "/", "/", "true"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot probe unprivileged user namespaces: {exc}"
    if done.returncode != 0:
        return f"this machine cannot create unprivileged user namespaces: {done.stderr.strip()}"
    return None


def _distributions(name: str) -> list[metadata.Distribution]:
    """``name`` and everything it requires (markers evaluated here, no extras)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        key = canonicalize_name(todo.pop())
        if key in found:
            continue
        dist = found[key] = metadata.distribution(key)
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(found.values())


def _make_venv(venv: Path) -> None:
    """A virtualenv of the system Python whose site-packages hold ipykernel and its
    dependencies (hard links into the project venv; copies across file systems)."""
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3.11").symlink_to(SYSTEM_PYTHON)
    (venv / "bin" / "python").symlink_to("python3.11")
    (venv / "pyvenv.cfg").write_text(f"home = {SYSTEM_PYTHON.parent}\ninclude-system-site-packages = false\n")
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for dist in _distributions("ipykernel"):
        for file in dist.files or []:
            source = Path(str(dist.locate_file(file))).resolve()
            target = (site / file).resolve()
            if site not in target.parents or not source.is_file():
                continue  # console scripts (../../bin) and files pip recorded but did not keep
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except FileExistsError:
                pass
            except OSError:
                shutil.copy2(source, target)
    shutil.copytree(REPO / "kernels" / "runtime" / "threadbook_kernel", site / "threadbook_kernel")  # kernel-side code
    for folder, dirs, _files in os.walk(venv):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o755)


@pytest.fixture
def layout() -> Iterator[Layout]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="threadbook-nonroot-"))
    try:
        root.chmod(0o755)
        paths = Layout.under(root)
        _make_venv(paths.venv)
        for folder in (paths.workspaces, paths.tmp):
            folder.mkdir(mode=0o755)
            os.chown(folder, _host_uid(), _host_uid())
        paths.data.mkdir(mode=0o755)
        (paths.data / "sales.csv").write_text("region,amount\nnorth,10\n")
        (paths.data / "sales.csv").chmod(0o644)
        yield paths
    finally:
        _kill_leftovers(root)
        shutil.rmtree(root, ignore_errors=True)


def _leftovers(marker: Path) -> list[psutil.Process]:
    """Processes whose command line names ``marker`` (every kernel does: its venv, its run dir)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(marker) in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _kill_leftovers(marker: Path) -> None:
    for proc in _leftovers(marker):
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(_leftovers(marker), timeout=5)


def _child_env(paths: Layout, **extra: str) -> dict[str, str]:
    """The unprivileged bot's environment: the repo and the project venv's packages on its path."""
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(paths.tmp),
        "TMPDIR": str(paths.tmp),
        "THREADBOOK_TEST_KERNEL_PYTHON": str(paths.venv / "bin" / "python"),
        "PYTHONPATH": os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"]]),
        "PYTHONDONTWRITEBYTECODE": "1",
        **extra,
    }


def _run_child(paths: Layout, canary: str, *, fork_server: bool) -> dict[str, Any]:
    """Run :func:`child_main` as the unprivileged uid; its JSON report (killed on timeout)."""
    env = _child_env(paths, **{name: canary for name in SECRET_VARS})
    argv = [
        *_drop(),
        str(paths.venv / "bin" / "python"),
        "-m",
        "tests.security.test_nonroot",
        str(paths.root),
        canary,
        STRAY,
        "fork" if fork_server else "spawn",
    ]
    child = subprocess.Popen(
        argv, cwd=paths.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = child.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # bwrap --die-with-parent takes the kernels along
        out, err = child.communicate()
        pytest.fail(f"the unprivileged bot did not finish within {CHILD_TIMEOUT_S:.0f} s:\n{err[-3000:]}")
    assert child.returncode == 0, f"the unprivileged bot failed (exit {child.returncode}):\n{err[-3000:]}"
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


@pytest.mark.timeout(90)
@pytest.mark.parametrize("source", ["spawn", "fork"])
def test_unprivileged_bot_sandboxes_its_kernels(layout: Layout, source: str) -> None:
    """As a normal user, each kernel runs in its own user namespace with no capabilities,
    no network, no secrets and no view of another thread's files; nothing outlives it.
    ``fork``: the kernels come from the sandboxed fork server (its zygote is root of an
    unprivileged user namespace; each child enters a user namespace of its own)."""
    canary = f"tb-canary-{uuid.uuid4().hex}"
    report = _run_child(layout, canary, fork_server=source == "fork")

    assert report["euid"] == _host_uid()
    assert report["launcher"] == ("ForkingLauncher" if source == "fork" else "BwrapLauncher")
    assert report["sources"] == [source, source], "every kernel came from the expected source"
    assert report["as_root"] is False and report["uid_mode"] == "user namespace"
    assert report["python_roots"] == [str(layout.venv)], "the sandbox binds only the bot's own virtualenv"
    # No cgroup is delegated to this uid: the rlimits stay, and start-up log and `status` say so.
    assert report["isolation"] == "rlimits only (no cgroup)", report["isolation"]
    assert report["isolation_logged"] == [f"kernel isolation: {report['isolation']}"], report["isolation_logged"]
    kernels = report["kernels"]
    assert len(kernels) == 2
    for inside in kernels:
        assert (inside["uid"], inside["euid"], inside["gid"]) == (USERNS_UID, USERNS_UID, USERNS_UID)
        status = inside["status"]
        assert status["NoNewPrivs"] == "1"
        for capability_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(status[capability_set], 16) == 0, (capability_set, status)
        assert inside["interfaces"] == ["lo"]
        assert inside["cwd"] == "/workspace" and inside["own_secret"] == canary
        assert inside["env_secrets"] == [] and inside["environ_leaks"] == []
        assert inside["other_workspace"] == "FileNotFoundError (ENOENT)" and not inside["other_workspace_exists"]
        assert inside["other_run_dir"] == "FileNotFoundError (ENOENT)", "another kernel's connection file is visible"
        assert not any(inside["host_paths"].values()), inside["host_paths"]
        refused = ("(EACCES)", "(EROFS)", "(ENOENT)")
        assert all(outcome.endswith(refused) for outcome in inside["writes"].values()), inside["writes"]
        assert set(inside["scratch_writes"].values()) == {"ok"}, inside["scratch_writes"]
        if report["tmpfs_size"] or source == "fork":
            assert inside["tmpfs_mb"] == {"/tmp": TMP_SIZE_MB, "/dev/shm": SHM_SIZE_MB}
        if source == "fork":  # a spawned kernel's sandbox cannot remount them (docs/security.md)
            assert inside["tmpfs_inodes"] == {"/tmp": TMP_INODES, "/dev/shm": SHM_INODES}
        assert inside["data_read"].startswith("region,amount")
        assert inside["pids"] <= 3, "the kernel sees processes outside its pid namespace"
        if report["disable_userns"]:
            assert inside["nested_userns"][0] != 0, f"nested user namespace allowed: {inside['nested_userns']}"
        else:
            warnings.warn(
                f"{report['bwrap_version']} has no --disable-userns: nested user namespaces stay possible", stacklevel=2
            )

    # On the host: the kernels' files belong to the bot's own uid, no forbidden write landed,
    # and neither the child nor any kernel is left.
    for workspace in report["workspaces"]:
        made = Path(workspace) / "made-by-kernel.txt"
        assert layout.workspaces in made.parents and made.stat().st_uid == _host_uid()
    strays = [
        p
        for p in (
            Path("/") / STRAY,
            Path("/usr") / STRAY,
            Path("/etc") / STRAY,
            layout.venv / STRAY,
            layout.data / STRAY,
            layout.workspaces / STRAY,
        )
        if p.exists()
    ]
    assert not strays, f"a write from inside the sandbox landed on the host: {strays}"
    deadline = time.monotonic() + 5
    while (left := _leftovers(layout.root)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes outlived the unprivileged bot: {left}"


@pytest.mark.timeout(600)
def test_attack_suite_as_unprivileged_bot(layout: Layout) -> None:
    """The whole attack suite (``test_attacks.py``, ``test_boundary.py``: every finding,
    spawned and forked kernels, a neighbour that keeps answering) run by a bot that is not
    root. Every attack must be contained or, where only a cgroup contains it and none can be
    made for this uid, recorded as such; the outcomes become the second table of
    docs/security.md."""
    rows_file = layout.tmp / "attack-rows.json"
    argv = [
        *_drop(),
        str(layout.venv / "bin" / "python"),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(REPO),
        "-c",
        str(REPO / "pyproject.toml"),
        "tests/security/test_attacks.py",
        "tests/security/test_boundary.py",
    ]
    env = _child_env(layout, **{ROWS_FILE_VAR: str(rows_file)})
    child = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = child.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, _ = child.communicate()
        pytest.fail(f"the unprivileged attack run did not finish:\n{out[-3000:]}")
    assert child.returncode == 0, out[-6000:]
    assert rows_file.exists(), f"not every attack recorded an outcome:\n{out[-3000:]}"
    rows: dict[str, dict[str, str]] = json.loads(rows_file.read_text())
    assert len(rows) >= 20, rows
    mode = f"an unprivileged uid ({_host_uid()}): kernels in user namespaces, spawned by bwrap or forked"
    write_table(REPO / "docs" / "security.md", rows, mode=mode, section="nonroot")


async def child_main(root: Path, canary: str, stray: str, source: str) -> dict[str, Any]:
    """(In the unprivileged child) start two thread kernels through a real ``KernelPool`` with
    ``sandbox: bwrap`` (``source`` fork: with the fork server), run :data:`KERNEL_CHECKS` in
    each, shut everything down."""
    from kernels import KernelOptions, build_pool
    from kernels.bwrap.launcher import BwrapLauncher
    from kernels.forking.launcher import ForkingLauncher, ForkProvisioner
    from kernels.seam.settings import KernelSettings

    paths = Layout.under(root)
    settings = KernelSettings(
        sandbox="bwrap",
        workspace_root=paths.workspaces,
        preload=(),
        exec_timeout_s=15,
        interrupt_grace_s=1,
        max_kernels=4,
        memory_mb=512,
        max_processes=64,
        max_file_mb=10,
        fork_server=source == "fork",
        python=Path(sys.executable),
        packages={"dir": paths.tmp / "packages"},
    )
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("kernels").addHandler(handler)
    logging.getLogger("kernels").setLevel(logging.INFO)
    pool = build_pool(settings)
    launcher = pool.launcher.spawn if isinstance(pool.launcher, ForkingLauncher) else pool.launcher
    assert isinstance(launcher, BwrapLauncher), type(launcher)
    version = subprocess.run([launcher.support.bwrap, "--version"], capture_output=True, text=True).stdout.strip()
    report: dict[str, Any] = {
        "euid": os.geteuid(),
        "launcher": type(pool.launcher).__name__,
        "as_root": launcher.support.as_root,
        "uid_mode": "root + setpriv" if launcher.support.as_root else "user namespace",
        "disable_userns": launcher.support.disable_userns,
        "tmpfs_size": launcher.support.tmpfs_size,
        "bwrap_version": version,
        "python_roots": [str(p) for p in launcher.support.host.python_dirs],
        "isolation": launcher.isolation,
        "isolation_logged": [line for line in logged if "isolation" in line],
    }
    await pool.start()
    try:
        options = KernelOptions(data_dir=paths.data)
        sessions = await asyncio.gather(*(pool.get_or_start(f"slack:C1:thread-{n}", options) for n in "ab"))
        for session in sessions:
            result = await session.execute(f"open('secret.txt', 'w').write({canary!r})")
            assert result.ok, result
        report["workspaces"] = [str(s.workspace.path) for s in sessions]
        report["sources"] = [
            "fork" if isinstance(s._handle.manager.provisioner, ForkProvisioner) else "spawn"  # type: ignore[union-attr]
            for s in sessions
        ]
        report["kernels"] = []
        for session, other in zip(sessions, reversed(sessions)):
            assert other._handle is not None
            params = {
                "canary": canary,
                "secret_vars": list(SECRET_VARS),
                "other_workspace": str(other.workspace.path),
                "other_run_dir": str(other._handle.run_dir),
                # The zygote binds its own folder (kernels/fork/) for itself; each kernel
                # detaches it, an empty mount point of the repo's path may stay.
                "host_paths": [
                    str(REPO / "pyproject.toml"),
                    str(ZYGOTE),
                    str(paths.workspaces),
                    "/root/.pyenv",
                ],
                "forbidden_writes": [
                    f"/{stray}",
                    f"/usr/{stray}",
                    f"/etc/{stray}",
                    f"/dev/{stray}",
                    f"/proc/{stray}",
                    f"{paths.venv}/{stray}",
                    f"/data/{stray}",
                    f"{paths.workspaces}/{stray}",
                ],
            }
            # A host path that is not there would read as hidden whatever the sandbox does.
            assert all(os.path.exists(path) for path in params["host_paths"][:3])
            result = await session.execute(f"PARAMS = {params!r}\n{KERNEL_CHECKS}", timeout=15)
            assert result.ok, (result.outcome, result.error, result.stdout[-2000:])
            report["kernels"].append(json.loads(result.stdout.strip().splitlines()[-1]))
    finally:
        await pool.shutdown_all()
    return report


if __name__ == "__main__":
    _root, _canary, _stray, _source = sys.argv[1:5]
    print(json.dumps(asyncio.run(child_main(Path(_root), _canary, _stray, _source))))
