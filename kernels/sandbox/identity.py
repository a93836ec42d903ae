"""Who a sandboxed kernel is, and the files on the host that say so.

A root bot gives each workspace its own unprivileged uid (:func:`identity_for`) and hands the
workspace and the kernel's run dir to it; a non-root bot's kernels are uid 1000 of their own
user namespace, which maps to the bot's uid, so nothing changes owner. Either way the kernel's
``/etc/passwd`` and ``/etc/group`` (and, with network, its resolver files) are written into
its run dir. :func:`prepare_run_dir` is the one place all of that happens for a start.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from kernels.host import safefs
from kernels.sandbox.slirp import HOSTS, RESOLV_CONF
from kernels.seam.plan import Identity, LaunchPlan

#: Kernel uids when the bot runs as root: a stable uid per workspace in this range.
KERNEL_UID_BASE = 1_900_000_000
KERNEL_UID_SPAN = 100_000_000
#: The kernel's uid inside its user namespace when the bot is not root.
USERNS_UID = 1000
#: The sandboxed zygote's uid in its ``/etc/passwd`` (it forks kernels, it runs no user code).
ZYGOTE = Identity(uid=65534, gid=65534, host_owner=None)
_HOME = "/workspace"


def identity_for(workspace: Path, *, as_root: bool) -> Identity:
    """The kernel's uid/gid: per-workspace on the host as root, fixed inside a user namespace otherwise."""
    if not as_root:
        return Identity(uid=USERNS_UID, gid=USERNS_UID, host_owner=None)
    digest = int(hashlib.sha256(str(workspace).encode()).hexdigest()[:12], 16)
    uid = KERNEL_UID_BASE + digest % KERNEL_UID_SPAN
    return Identity(uid=uid, gid=uid, host_owner=(uid, uid))


def write_identity_files(run_dir: Path, identity: Identity) -> None:
    """(Blocking) the ``/etc/passwd`` and ``/etc/group`` the kernel sees: root, itself, nobody."""
    _write_public(
        run_dir / "passwd",
        (
            "root:x:0:0:root:/root:/usr/sbin/nologin\n"
            f"sandbox:x:{identity.uid}:{identity.gid}:Threadbook kernel:{_HOME}:/bin/sh\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
    )
    _write_public(run_dir / "group", f"root:x:0:\nsandbox:x:{identity.gid}:\nnogroup:x:65534:\n")


def _write_public(path: Path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o644)


def prepare_run_dir(plan: LaunchPlan) -> None:
    """(Blocking) everything a sandboxed start needs on the host before the kernel runs: its
    identity files (and resolver files with network) in the run dir, then the workspace and
    the run dir handed to its uid (root mode).

    A workspace last used by another uid (a different launcher, a warm folder) is chowned
    recursively, never following symlinks; files the bot writes later (uploads, 0644) stay
    readable to the kernel.
    """
    identity = plan.identity
    if identity is None:
        return
    write_identity_files(plan.run_dir, identity)
    if plan.network:
        _write_public(plan.run_dir / "resolv.conf", RESOLV_CONF)  # slirp4netns's DNS relay
        _write_public(plan.run_dir / "hosts", HOSTS)
    if identity.host_owner is None:
        return
    uid, gid = identity.host_owner
    workspace = plan.workspace
    if os.lstat(workspace).st_uid != uid:
        safefs.chown_tree(workspace, uid, gid)  # descriptors only: a folder swapped for a link is never followed
    os.chown(workspace, uid, gid, follow_symlinks=False)
    run_fd = safefs.open_dir(plan.run_dir)
    try:
        os.fchown(run_fd, uid, gid)
        with contextlib.suppress(FileNotFoundError):
            os.chown("kernel.json", uid, gid, dir_fd=run_fd, follow_symlinks=False)
    finally:
        os.close(run_fd)
