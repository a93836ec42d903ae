"""The bubblewrap command lines as pure functions: no process, no file system."""

from __future__ import annotations

import resource
from collections import Counter
from pathlib import Path

import pytest

from kernels.fork.jail import HOST_VIEW
from kernels.sandbox.args import DATA, PACKAGES, TMP_INODES, WORKSPACE, prlimit_options, sandbox_args, zygote_args
from kernels.sandbox.identity import KERNEL_UID_BASE, USERNS_UID, identity_for
from kernels.sandbox.support import CA_CERTS, BwrapSupport, HostLayout
from kernels.seam.plan import Identity, LaunchPlan, ResourceLimits

HOST = HostLayout(
    top_level=((Path("/bin"), "usr/bin"), (Path("/lib"), None)),
    files=(Path("/etc/localtime"),),
    python_dirs=(Path("/opt/venv"), Path("/opt/python3.11")),
    ca_certs=True,
)
LIMITS = ResourceLimits(memory_mb=512, cpu_seconds=60, max_processes=64, max_file_mb=10, max_open_files=256)


def support(
    *, as_root: bool, tmpfs_size: bool = True, disable_userns: bool = True, host: HostLayout = HOST
) -> BwrapSupport:
    return BwrapSupport(
        bwrap="/usr/bin/bwrap",
        prlimit="/usr/bin/prlimit",
        setpriv="/usr/bin/setpriv" if as_root else None,
        mount="/usr/bin/mount" if as_root else None,
        tmpfs_size=tmpfs_size,
        disable_userns=disable_userns,
        as_root=as_root,
        host=host,
    )


def plan(*, as_root: bool, data_dir: Path | None = None, network: bool = False) -> LaunchPlan:
    workspace = Path("/srv/ws/slack_C1_t1")
    return LaunchPlan(
        kernel_id="k1",
        workspace=workspace,
        run_dir=Path("/tmp/threadbook-0/kernel-k1"),
        environment={},
        limits=LIMITS,
        data_dir=data_dir,
        network=network,
        packages_dir=Path("/srv/packages"),
        identity=identity_for(workspace, as_root=as_root),
    )


def pairs(argv: list[str], option: str) -> list[tuple[str, str]]:
    """(source, dest) of every ``option SOURCE DEST`` in ``argv``."""
    return [(argv[i + 1], argv[i + 2]) for i, arg in enumerate(argv) if arg == option]


def bwrap_options(argv: list[str]) -> list[str]:
    """bwrap's own options: up to the first ``--``."""
    return argv[: argv.index("--")]


def test_root_mode_drops_to_the_workspace_uid_after_capping_tmpfs_inodes() -> None:
    the_plan = plan(as_root=True)
    argv = sandbox_args(support(as_root=True), the_plan)
    uid = identity_for(the_plan.workspace, as_root=True).uid
    assert KERNEL_UID_BASE <= uid and the_plan.identity == Identity(uid, uid, (uid, uid))
    options = bwrap_options(argv)
    assert "--unshare-user" not in options and "--unshare-pid" in options and "--unshare-net" in options
    rest = argv[len(options) + 1 :]
    # remount (as root inside), then prlimit, then setpriv: all before the program.
    assert rest[0] == "/bin/sh" and f"nr_inodes={TMP_INODES}" in rest[2]
    prlimit = rest.index("/usr/bin/prlimit")
    setpriv = rest.index("/usr/bin/setpriv")
    assert prlimit < setpriv and rest[-1] == "--"
    assert f"--reuid={uid}" in rest and "--no-new-privs" in rest and "--bounding-set=-all" in rest
    assert rest[prlimit + 1 : setpriv - 1] == prlimit_options(LIMITS.rlimits())


def test_non_root_mode_is_a_user_namespace_with_a_read_only_root() -> None:
    argv = sandbox_args(support(as_root=False), plan(as_root=False))
    options = bwrap_options(argv)
    i = options.index("--unshare-user")
    assert options[i : i + 7] == [
        "--unshare-user",
        "--uid",
        str(USERNS_UID),
        "--gid",
        str(USERNS_UID),
        "--cap-drop",
        "ALL",
    ]
    assert "--disable-userns" in options
    assert [options[i + 1] for i, arg in enumerate(options) if arg == "--remount-ro"] == ["/", "/dev"]
    assert "/usr/bin/setpriv" not in argv and "/bin/sh" not in argv
    assert "--disable-userns" not in sandbox_args(support(as_root=False, disable_userns=False), plan(as_root=False))


def test_only_the_workspace_and_run_dir_are_writable() -> None:
    the_plan = plan(as_root=True, data_dir=Path("/srv/data/sales"))
    options = bwrap_options(sandbox_args(support(as_root=True), the_plan))
    assert pairs(options, "--bind") == [(str(the_plan.run_dir),) * 2, (str(the_plan.workspace), str(WORKSPACE))]
    read_only = dict((dest, source) for source, dest in pairs(options, "--ro-bind"))
    assert read_only[str(DATA)] == "/srv/data/sales" and read_only["/usr"] == "/usr"
    assert read_only[str(PACKAGES)] == "/srv/packages"  # packages installed on demand: read-only
    assert read_only["/opt/venv"] == "/opt/venv" and read_only["/lib"] == "/lib"
    assert read_only["/etc/passwd"] == str(the_plan.run_dir / "passwd")
    assert ("usr/bin", "/bin") in pairs(options, "--symlink")
    assert options[options.index("--chdir") + 1] == str(WORKSPACE)
    assert str(DATA) not in bwrap_options(sandbox_args(support(as_root=True), plan(as_root=True)))


def test_every_parent_folder_is_made_once() -> None:
    options = bwrap_options(sandbox_args(support(as_root=True), plan(as_root=True, data_dir=Path("/d"))))
    made = Counter(options[i + 1] for i, arg in enumerate(options) if arg == "--dir")
    assert made and max(made.values()) == 1
    assert "/opt" in made and "/tmp/threadbook-0" in made


def test_network_files_and_certificates_only_with_network() -> None:
    offline = dict((d, s) for s, d in pairs(sandbox_args(support(as_root=True), plan(as_root=True)), "--ro-bind"))
    assert "/etc/resolv.conf" not in offline and str(CA_CERTS) not in offline
    the_plan = plan(as_root=True, network=True)
    online = dict((d, s) for s, d in pairs(sandbox_args(support(as_root=True), the_plan), "--ro-bind"))
    assert online["/etc/resolv.conf"] == str(the_plan.run_dir / "resolv.conf") and str(CA_CERTS) in online
    no_certs = HostLayout(HOST.top_level, HOST.files, HOST.python_dirs, ca_certs=False)
    argv = sandbox_args(support(as_root=True, host=no_certs), the_plan)
    assert str(CA_CERTS) not in argv and "--unshare-net" in argv  # network comes from slirp4netns, not the host


def test_tmpfs_sizes_only_where_bwrap_knows_them() -> None:
    assert "--size" in sandbox_args(support(as_root=True), plan(as_root=True))
    assert "--size" not in sandbox_args(support(as_root=True, tmpfs_size=False), plan(as_root=True))


def test_a_plan_without_an_identity_is_refused() -> None:
    the_plan = plan(as_root=True)
    unsandboxed = LaunchPlan(**{**the_plan.__dict__, "identity": None})
    with pytest.raises(ValueError, match="identity"):
        sandbox_args(support(as_root=True), unsandboxed)


def test_prlimit_options_name_each_limit() -> None:
    assert prlimit_options(((resource.RLIMIT_DATA, 5), (resource.RLIMIT_NOFILE, 7))) == ["--data=5:5", "--nofile=7:7"]


@pytest.mark.parametrize("as_root", [True, False])
def test_the_zygote_keeps_the_host_pid_namespace_and_a_read_only_host_view(as_root: bool) -> None:
    run_dir = Path("/tmp/threadbook-0/kernel-z")
    argv = zygote_args(support(as_root=as_root), run_dir=run_dir, code_dir=Path("/src/kernels"))
    assert "--unshare-pid" not in argv and "--unshare-net" in argv and argv[-1] == "--"
    assert ("/", str(HOST_VIEW)) in pairs(argv, "--ro-bind") and ("/src/kernels",) * 2 in pairs(argv, "--ro-bind")
    assert (str(run_dir),) * 2 in pairs(argv, "--bind")
    assert ("--cap-add" in argv) is (not as_root)
