"""bubblewrap command lines, built as pure functions of what was detected and what is planned.

Nothing here touches the file system or starts a process: :func:`sandbox_args` turns a
:class:`~kernels.sandbox.support.BwrapSupport` (with the host layout read at detection) and a
:class:`~kernels.seam.plan.LaunchPlan` into the ``bwrap ... --`` prefix of a kernel, and
:func:`zygote_args` does the same for the fork server's zygote.
"""

from __future__ import annotations

import resource
import shlex
from pathlib import Path

from kernels.fork.jail import HOST_VIEW
from kernels.sandbox.support import CA_CERTS, BwrapSupport
from kernels.seam.plan import LaunchPlan, RLimits

WORKSPACE = Path("/workspace")
DATA = Path("/data")
PACKAGES = Path("/packages")
TMP_SIZE_MB = 256
SHM_SIZE_MB = 64
#: Inode caps of the private tmpfs: 300k empty files would otherwise cost ~300 MiB of kernel memory.
TMP_INODES = 32_768
SHM_INODES = 4_096
#: Where a sandboxed kernel's caches go (``MPLCONFIGDIR``, ``XDG_CACHE_HOME``): its private ``/tmp``.
CACHE = Path("/tmp/cache")
_PRLIMIT_OPTIONS = {
    "RLIMIT_DATA": "data",
    "RLIMIT_AS": "as",
    "RLIMIT_CPU": "cpu",
    "RLIMIT_NPROC": "nproc",
    "RLIMIT_FSIZE": "fsize",
    "RLIMIT_NOFILE": "nofile",
}


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


def sandbox_args(support: BwrapSupport, plan: LaunchPlan) -> list[str]:
    """The command prefix that runs a program in ``plan``'s kernel sandbox (append the
    program's argv): ``bwrap ... -- [sh -c remount] prlimit ... -- [setpriv ... --]``.

    ``plan.identity`` is required. With ``plan.network`` the resolver files of the run dir
    (:func:`kernels.sandbox.identity.prepare_run_dir`) and the CA certificates are bound;
    the network itself is attached from outside by :func:`kernels.sandbox.slirp.attach`.
    """
    identity = plan.identity
    if identity is None:
        raise ValueError("a sandboxed kernel's plan needs an identity")
    args = _Args(support)
    args.add("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup")
    if not support.as_root:
        args.add("--unshare-user", "--uid", str(identity.uid), "--gid", str(identity.gid), "--cap-drop", "ALL")
        if support.disable_userns:
            args.add("--disable-userns")
    # jupyter_client adds the bot's pid; ipykernel would see its ppid (1 in the pid namespace)
    # differ from it and exit. --die-with-parent covers what that check is for.
    args.add("--die-with-parent", "--new-session", "--hostname", "threadbook", "--unsetenv", "JPY_PARENT_PID")
    _system_view(args, run_dir=plan.run_dir, network=plan.network)
    if plan.data_dir is not None:
        args.bind(plan.data_dir, DATA)
    if plan.packages_dir is not None:
        args.bind(plan.packages_dir, PACKAGES)
    args.bind(plan.run_dir, plan.run_dir, writable=True)
    args.bind(plan.workspace, WORKSPACE, writable=True)
    if not support.as_root:
        # In its own user namespace the kernel's uid owns the tmpfs bwrap builds "/" and
        # "/dev" on: without this it could write there (uncapped, outside the workspace).
        args.add("--remount-ro", "/", "--remount-ro", "/dev")
    args.add("--chdir", str(WORKSPACE), "--")
    if support.mount is not None:
        args.add(*_inode_caps(support.mount))
    args.add(support.prlimit, *prlimit_options(plan.limits.rlimits()), "--")
    if support.setpriv is not None:
        args.add(
            support.setpriv,
            f"--reuid={identity.uid}",
            f"--regid={identity.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        )
    return args.argv


def zygote_args(support: BwrapSupport, *, run_dir: Path, code_dir: Path | None) -> list[str]:
    """The command prefix of the sandboxed fork server's zygote.

    The kernels' system view, no network, its own ipc, uts and cgroup namespaces (the host's
    pid namespace, so kernels outlive a zygote that dies), root with its capabilities (each
    forked child builds its own namespaces and drops them, see :mod:`kernels.fork.jail`),
    ``/workspace``, ``/data`` and ``/packages`` as mount points, and the host's ``/`` read-only at
    :data:`kernels.fork.jail.HOST_VIEW` for the children to bind their own folders from (each
    detaches it before any user code). ``code_dir``: where ``zygote.py`` lives when no Python
    folder already holds it (bound read-only; children detach it too).

    As a normal user, "root with its capabilities" is root of an unprivileged user namespace
    that maps only the bot's uid (``--unshare-user --uid 0 --cap-add ALL``): each child then
    moves into a user namespace of its own as well (:func:`kernels.fork.jail.enter_user_namespace`).
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
    for mount_point in (WORKSPACE, DATA, PACKAGES):
        args.parents(mount_point)
        args.add("--perms", "0755", "--dir", str(mount_point))
    args.bind("/", HOST_VIEW)
    args.add("--chdir", str(run_dir), "--")
    return args.argv


def _system_view(args: _Args, *, run_dir: Path, network: bool) -> None:
    """What every kernel sees of the host: read-only system and Python folders, its own
    ``/proc``, ``/dev``, capped ``/tmp`` and ``/dev/shm``, ``/etc/passwd`` from ``run_dir``."""
    host = args.support.host
    args.bind("/usr", "/usr")
    for path, target in host.top_level:
        if target is not None:
            args.add("--symlink", target, str(path))
        else:
            args.bind(path, path)
    args.add("--proc", "/proc", "--dev", "/dev")
    args.tmpfs("/tmp", TMP_SIZE_MB)
    args.tmpfs("/dev/shm", SHM_SIZE_MB)
    for path in host.files:
        args.bind(path, path)
    args.bind(run_dir / "passwd", "/etc/passwd")
    args.bind(run_dir / "group", "/etc/group")
    if network:
        args.bind(run_dir / "resolv.conf", "/etc/resolv.conf")
        args.bind(run_dir / "hosts", "/etc/hosts")
        if host.ca_certs:
            args.bind(CA_CERTS, CA_CERTS)
    for root in host.python_dirs:
        args.bind(root, root)


def _inode_caps(mount: str) -> list[str]:
    """(Root mode) a shell step, still root inside the sandbox and before any user code,
    that remounts ``/tmp`` and ``/dev/shm`` with inode caps (bwrap has no option for it),
    then execs the rest of the command line."""
    remount = " && ".join(
        f"{shlex.quote(mount)} -n -o remount,nosuid,nodev,nr_inodes={inodes} tmpfs {target}"
        for target, inodes in (("/tmp", TMP_INODES), ("/dev/shm", SHM_INODES))
    )
    return ["/bin/sh", "-c", f'{remount} && exec "$@"', "threadbook-tmpfs"]


def prlimit_options(limits: RLimits) -> list[str]:
    """``prlimit`` options setting ``limits`` (soft == hard)."""
    names = {getattr(resource, attr): option for attr, option in _PRLIMIT_OPTIONS.items()}
    return [f"--{names[limit]}={value}:{value}" for limit, value in limits]
