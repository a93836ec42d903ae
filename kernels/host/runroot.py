"""Where the kernels' run dirs live: in memory (a tmpfs) when the machine has one at hand.

A run dir holds what one kernel start makes and nobody keeps: the connection file, the ZMQ
ipc sockets, the kernel log, the sandbox's ``/etc/passwd``. Every start creates a dozen of
them and every stop deletes them, so they belong where making a file is cheap, as sockets
and runtime files do in ``/run`` (systemd's ``RuntimeDirectory``). On a disk they cost a
crowd of starts dearly: ext4 without a journal looks past every inode deleted in the last
minute before it hands out a new one (``recently_deleted``), and a busy bot deletes run dirs
all the time; ``perf`` put ~6 ms of CPU a start there (bot and kernel together, issue 44).

``kernels.run_root`` names the folder. Unset, it is ``/dev/shm`` when that is a tmpfs the
bot may write into and every kernel's cgroup caps its memory, else the temp dir
(``TMPDIR``). A kernel can write into its run dir (it binds its sockets there), and files
in a tmpfs are memory: they count towards the memory cap of the kernel that wrote them, and
go with the run dir when it stops; without that cap one kernel could fill the shared tmpfs
(Docker's ``/dev/shm`` is 64 MiB) and keep others from starting.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from kernels.host import mounts
from kernels.seam.result import SandboxUnavailableError

#: The tmpfs every Linux machine (and container) mounts for shared memory.
SHM = Path("/dev/shm")


def run_parent(configured: Path | None, *, memory_capped: bool) -> Path:
    """(Blocking: reads the mount table) the folder that holds the bot's ``threadbook-<uid>``
    run root: ``configured`` (``kernels.run_root``) when set, else :data:`SHM` when it is a
    writable tmpfs and ``memory_capped`` (each kernel's cgroup caps its memory), else the
    temp dir."""
    if configured is not None:
        return Path(os.path.abspath(configured))
    if memory_capped and is_tmpfs(SHM) and os.access(SHM, os.W_OK | os.X_OK):
        return SHM
    return Path(tempfile.gettempdir())


def is_private(folder: Path) -> bool:
    """(Blocking) whether ``folder`` is this process's own: a directory, not a link, owned by
    its uid, closed to everyone else."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def make_private(folder: Path) -> None:
    """(Blocking) make ``folder`` (0700, parents as needed) unless it exists, then check it is
    this process's own (:func:`is_private`).

    The run root sits in a folder anyone may write into (``/dev/shm``, ``/tmp``): another local
    user who made it first could read every kernel's connection file (its key) and drive the
    kernel. It is checked before every start, not only once: a temp cleaner may remove an idle
    one, and anyone may then make it again. Raises
    :class:`~kernels.seam.result.SandboxUnavailableError` naming the fix: no kernel may start then."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not is_private(folder):
        raise SandboxUnavailableError(
            f"the kernels' run folder {folder} is not this bot's own (a folder of uid {os.getuid()}, "
            "mode 0700): remove it, or set kernels.run_root"
        )


def possible_run_parents(configured: Path | None) -> tuple[Path, ...]:
    """Every folder :func:`run_parent` may choose for ``configured`` (host paths to hide)."""
    if configured is not None:
        return (Path(os.path.abspath(configured)),)
    return (SHM, Path(tempfile.gettempdir()))


def is_tmpfs(folder: Path, mountinfo: Path = mounts.MOUNTINFO) -> bool:
    """(Blocking) whether ``folder`` is itself the mount point of a tmpfs (the last mount there)."""
    try:
        table = mountinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    mount = mounts.mounted_at(mounts.parse(table), Path(os.path.realpath(folder)))
    return mount is not None and mount.fstype == "tmpfs"
