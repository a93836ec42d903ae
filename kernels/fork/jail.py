"""The sandboxed fork server's per-kernel jail, entered by a forked child before any user code.

Loaded by ``kernels/fork/zygote.py`` (by path: like the zygote it imports only the standard
library). The zygote itself runs inside one bubblewrap sandbox as root with its
capabilities (it is trusted code and never runs user code): the kernels' read-only system
view, no network, and the host's ``/`` read-only at :data:`HOST_VIEW`, from which a child
binds what is its own. Python 3.11 has no ``os.unshare``/``mount``, so this module calls
libc through ``ctypes``.

Per kernel (``Jailer`` in ``zygote.py``) two processes:

- the *supervisor*, pid 1 of a fresh pid namespace (the role bwrap's init plays for a
  spawned kernel): a child of a small helper the zygote forked before its imports, so it
  owns ~1.5 MiB (USS), not a copy of the zygote. It leaves the host's view
  (:func:`leave_host_view`) and waits; once its kernel is forked it joins a new session
  keyring, drops to the kernel's uid (no capabilities, not dumpable) and reaps until the
  kernel exits or the bot's lifeline pipe reports EOF (:func:`supervise`); its exit ends
  every process of the namespace.
- the *kernel*, forked by the zygote into that pid namespace (pid 2; ``setns``), still root:

  0. joins a new session keyring and raises its ``oom_score_adj`` to
     :data:`KERNEL_OOM_SCORE_ADJ` (:func:`isolate`);
  1. unshares mount, net, ipc, uts and cgroup namespaces; makes every mount private;
  2. mounts size- and inode-capped tmpfs at ``/tmp`` and ``/dev/shm``, a fresh ``/proc``
     (the host's is detached) and ``/dev/pts``; brings up its own ``lo``;
  3. binds the thread's workspace at ``/workspace`` (rw), its run dir at its own path (rw, on
     a tmpfs that hides every other run dir), the run dir's ``passwd``/``group`` at ``/etc``
     and the channel's ``data_dir`` at ``/data`` (ro), all ``nosuid,nodev``;
  4. detaches :data:`HOST_VIEW` and checks it is empty (:func:`build`);
  5. drops its privileges, then runs ipykernel.

The kernel process drops to the per-workspace uid/gid: bounding and ambient capability
sets emptied, groups cleared, ``no_new_privs``; :func:`drop_privileges` verifies all of it
in ``/proc/self/status`` and refuses to go on otherwise.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import signal
import socket
import struct
from typing import Any

HOST_VIEW = "/.threadbook-host"
WORKSPACE = "/workspace"
DATA = "/data"
PACKAGES = "/packages"

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_RELATIME, MS_STRICTATIME = 1024, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 4, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_CAPABILITY_VERSION_3 = 0x20080522
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
#: keyctl(2) by architecture (no libc wrapper without libkeyutils); x86-64, then the generic table.
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "i686": 288, "i386": 288}
KEYCTL_JOIN_SESSION_KEYRING = 1
#: Kernels are the first processes the OOM killer takes (the bot keeps its own score).
KERNEL_OOM_SCORE_ADJ = 1000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2)."""
    _check(_libc.mount(_bytes(source), _bytes(target), _bytes(fstype), flags, _bytes(data)), f"mount {target}")


def unshare(flags: int) -> None:
    """unshare(2)."""
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int) -> None:
    """setns(2)."""
    _check(_libc.setns(fd, nstype), "setns")


def prctl(option: int, arg: int = 0) -> None:
    """prctl(2) with one argument."""
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl {option}")


def join_session_keyring() -> bool:
    """Give the calling process (and what it starts) a new, empty session keyring, so no key
    of the bot's session keyring is reachable; safe in a ``preexec_fn``.

    Returns False where keyrings cannot be used at all (``keyctl`` refused by seccomp, as in
    Docker's default profile, or an architecture without a known syscall number): nothing
    is reachable through them then either. Raises ``OSError`` on any other failure.
    """
    number = _SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        return False
    if _libc.syscall(ctypes.c_long(number), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), None) < 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EPERM, errno.EACCES):
            return False
        raise OSError(code, f"keyctl(KEYCTL_JOIN_SESSION_KEYRING): {os.strerror(code)}")
    return True


def set_oom_score_adj(value: int) -> None:
    """Set the calling process's ``oom_score_adj`` (inherited by its children; raising it
    needs no privilege, lowering it again does)."""
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def fork_jailed(own_pid_namespace: int) -> int:
    """``os.fork()`` whose child is pid 1 of a new pid namespace; the caller stays in its own
    (``own_pid_namespace``: an fd of ``/proc/self/ns/pid``, opened before the first call)."""
    unshare(CLONE_NEWPID)
    try:
        pid = os.fork()
    except BaseException:
        _check(_libc.setns(own_pid_namespace, CLONE_NEWPID), "setns")
        raise
    if pid:
        _check(_libc.setns(own_pid_namespace, CLONE_NEWPID), "setns")
    return pid


def _bind(source: str, target: str, *, writable: bool = False) -> None:
    mount(source, target, None, MS_BIND)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (0 if writable else MS_RDONLY)
    mount(None, target, None, flags | _kept_flags(target))


def _kept_flags(target: str) -> int:
    """The flags a bind remount must keep: inside a user namespace the kernel refuses to
    clear ``noexec`` or change the atime mode of a mount that came from the host."""
    have = os.statvfs(target).f_flag
    flags = MS_NOEXEC if have & os.ST_NOEXEC else 0
    if have & os.ST_NOATIME:
        return flags | MS_NOATIME
    return flags | (MS_RELATIME if have & os.ST_RELATIME else MS_STRICTATIME)


def _tmpfs(target: str, size_mb: int, mode: int, inodes: int | None = None) -> None:
    data = f"size={size_mb}m,mode={mode:o}" + ("" if inodes is None else f",nr_inodes={inodes}")
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, data)


def _host(path: str) -> str:
    return HOST_VIEW + path


def _makedirs(path: str) -> None:
    """Create ``path`` and missing parents as 0755 (only ever inside this child's own tmpfs)."""
    if os.path.isdir(path):
        return
    _makedirs(os.path.dirname(path))
    os.mkdir(path)
    os.chmod(path, 0o755)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def leave_host_view() -> None:
    """(Supervisor, root) a mount namespace of its own without :data:`HOST_VIEW`."""
    unshare(CLONE_NEWNS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    _check(_libc.umount2(_bytes(HOST_VIEW), MNT_DETACH), f"umount {HOST_VIEW}")


def build(jail: dict[str, Any]) -> None:
    """(Kernel process, root, in its supervisor's pid namespace) set up its namespaces and file system.

    ``jail``: ``run_dir`` (the path the kernel uses), ``sources`` (host paths, resolved, of
    ``workspace``, ``run_dir``, ``data_dir`` and ``packages_dir``, the last two may be None), ``hide`` (bound
    folders of the zygote to detach), ``python_dirs`` (the read-only Python folders, bound
    again when they live under the fresh ``/tmp``), ``tmp_mb``, ``shm_mb`` and the inode
    caps ``tmp_inodes``, ``shm_inodes``.
    """
    sources = jail["sources"]
    unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Before the fresh /tmp: a hidden folder may live under /tmp (a checkout in /tmp).
    for folder in jail["hide"]:
        _check(_libc.umount2(_bytes(folder), MNT_DETACH), f"umount {folder}")
    _tmpfs("/tmp", jail["tmp_mb"], 0o1777, jail.get("tmp_inodes"))
    _tmpfs("/dev/shm", jail["shm_mb"], 0o1777, jail.get("shm_inodes"))
    for folder in jail["python_dirs"]:  # the interpreter or venv may live under /tmp too
        if folder.startswith(("/tmp/", "/dev/shm/")):
            _makedirs(folder)
            _bind(_host(folder), folder)
    run_dir = jail["run_dir"]
    run_root = os.path.dirname(run_dir)
    _makedirs(run_root)  # in the fresh /tmp, or the empty folder the zygote's sandbox made
    _tmpfs(run_root, 1, 0o755)  # hides every other kernel's run dir
    os.mkdir(run_dir)
    _bind(_host(sources["run_dir"]), run_dir, writable=True)
    _bind(_host(sources["workspace"]), WORKSPACE, writable=True)
    _bind(os.path.join(run_dir, "passwd"), "/etc/passwd")
    _bind(os.path.join(run_dir, "group"), "/etc/group")
    if sources.get("data_dir"):
        _bind(_host(sources["data_dir"]), DATA)
    if sources.get("packages_dir"):
        _bind(_host(sources["packages_dir"]), PACKAGES)
    _check(_libc.umount2(b"/proc", MNT_DETACH), "umount /proc")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    # In the user-namespace profile the kernel's uid maps to the owner of these tmpfs (the
    # zygote's root): without this it could write there, uncapped and outside its workspace.
    for folder in ("/", "/dev", run_root):
        mount(None, folder, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _check(_libc.umount2(_bytes(HOST_VIEW), MNT_DETACH), f"umount {HOST_VIEW}")
    if os.listdir(HOST_VIEW):
        raise RuntimeError(f"{HOST_VIEW} is still visible after detaching it")
    _loopback_up()
    os.chdir(WORKSPACE)


def isolate(jail: dict[str, Any]) -> None:
    """(Forked child, before any user code) its own session keyring and a high OOM score."""
    join_session_keyring()
    set_oom_score_adj(int(jail.get("oom_score_adj", KERNEL_OOM_SCORE_ADJ)))


def drop_privileges(uid: int, gid: int, *, dumpable: bool) -> None:
    """Become ``uid``/``gid`` with no capabilities at all, no groups and ``no_new_privs``.

    ``dumpable``: keep ``/proc/self`` owned by the uid (the kernel: ``subprocess`` lists
    ``/proc/self/fd``), else not (the supervisor: the kernel cannot ptrace it).
    """
    _drop_capability_bounds()
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # leaving uid 0 clears the permitted and effective sets
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 1 if dumpable else 0)
    _verify_dropped(uid, gid)


def take_identity(jail: dict[str, Any], *, dumpable: bool) -> None:
    """(Root, before any user code) become the ``jail``'s uid/gid with no capabilities: in a
    user namespace of one's own (``userns``: the bot is not root), else by dropping them."""
    if jail.get("userns"):
        enter_user_namespace(jail["uid"], jail["gid"], dumpable=dumpable)
    else:
        drop_privileges(jail["uid"], jail["gid"], dumpable=dumpable)


def enter_user_namespace(uid: int, gid: int, *, dumpable: bool) -> None:
    """(User-namespace profile) move into a new user namespace of one's own as ``uid``/``gid``
    with no capabilities at all, no nested user namespaces and ``no_new_privs``.

    The zygote's own user namespace (bubblewrap, bot not root) maps just the bot's uid, as 0,
    so the new namespace maps ``uid`` to that 0: on the host the kernel is the bot's uid,
    as a spawned kernel is. Its mount, net, ipc, uts, cgroup and pid namespaces stay owned
    by the zygote's user namespace, where it has no capability.
    """
    unshare(CLONE_NEWUSER)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} 0 1"), ("gid_map", f"{gid} 0 1")):
        _write_proc(f"/proc/self/{name}", text)
    _write_proc("/proc/sys/user/max_user_namespaces", "0")  # as bwrap's --disable-userns
    _drop_capability_bounds()
    _clear_capabilities()  # still uid ``uid``: nothing clears them on its own
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 1 if dumpable else 0)
    # Supplementary groups cannot be dropped here (the zygote's namespace denies setgroups):
    # the kernel keeps the bot's, exactly as a kernel bwrap spawns as a normal user does.
    _verify_dropped(uid, gid, groups=False)


def _write_proc(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _clear_capabilities() -> None:
    """capset(2) with every set empty."""
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def _drop_capability_bounds() -> None:
    last_cap = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last_cap + 1):
        prctl(PR_CAPBSET_DROP, cap)
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


def _verify_dropped(uid: int, gid: int, *, groups: bool = True) -> None:
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    caps = {name: int(status[name], 16) for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    ids = {status["Uid"].split() == [str(uid)] * 4, status["Gid"].split() == [str(gid)] * 4}
    stray_groups = groups and status["Groups"].strip()
    if any(caps.values()) or ids != {True} or stray_groups or status["NoNewPrivs"].strip() != "1":
        raise RuntimeError(f"privileges not dropped: {caps}, Uid {status['Uid']}, Groups {status['Groups']}")


def close_fds(keep: set[int]) -> None:
    """Close every inherited file descriptor above 2 except ``keep``."""
    for fd in sorted(int(name) for name in os.listdir("/proc/self/fd")):
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def supervise(kernel: int, lifeline: int) -> None:
    """(Supervisor, pid 1) reap every orphan of the namespace until the kernel exits
    (``kernel``: its pidfd; the zygote reaps it) or the bot's lifeline reports EOF; the
    supervisor's exit then ends the whole namespace."""
    for signum in (signal.SIGINT, signal.SIGTERM):  # no handler: the kernel cannot signal pid 1
        signal.signal(signum, signal.SIG_DFL)
    wake_r, _ = wake_on_children()
    poller = select.poll()
    for fd in (wake_r, lifeline, kernel):
        poller.register(fd, select.POLLIN)
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        try:
            events = dict(poller.poll())
        except InterruptedError:
            continue
        if kernel in events:
            return
        if lifeline in events:
            try:
                if not os.read(lifeline, 1):
                    return
            except OSError as exc:
                if exc.errno != errno.EAGAIN:
                    return
        if wake_r in events:
            drain(wake_r)


def wake_on_children() -> tuple[int, int]:
    """Make every SIGCHLD write to a non-blocking pipe (to wake a ``poll``); its two ends."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return wake_r, wake_w


def drain(fd: int) -> None:
    """Read a non-blocking pipe until it is empty."""
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass
