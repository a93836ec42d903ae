"""Threadbook's code inside the kernel: installed into the kernel environment, never the bot's.

Whatever parses or renders untrusted content does it here, never in the bot: a thread's own
outputs (a chart's ``show()``, its snapshot) inside the thread's sandboxed kernel, and what the
bot needs for itself (upload previews, the ``export html`` page) in a fresh sandboxed one-shot
process (``python -I -m threadbook_kernel.preview`` / ``.export``) that no thread's code has
touched. :func:`setup` runs first in every kernel (spawned or forked, before any user
code): it puts the shared folder of packages installed on demand at the end of ``sys.path``,
routes every display through :mod:`threadbook_kernel.display` (charts and SVG gain a
PNG, HTML-only outputs readable text), keeps an interrupt that arrives as a cell starts
(:mod:`threadbook_kernel.interrupts`) and gives user code ``display_dataframe_to_user``
(:mod:`threadbook_kernel.frames`) and ``show_chart`` (:mod:`threadbook_kernel.charts`).
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Any

__all__ = ["prime", "setup", "workspace_fd"]

#: Set by the launcher: where the kernel sees the shared packages folder (read-only).
PACKAGES_ENV = "THREADBOOK_PACKAGES_DIR"
#: The workspace folder (the kernel's starting directory), held open by :func:`setup`: the
#: snapshot (:mod:`threadbook_kernel.snapshot`) finds its files there even after user code changed
#: directory, and the descriptor follows the folder when a warm kernel is adopted (renamed).
WORKSPACE_FD: int | None = None


def setup() -> None:
    """Prepare this kernel; idempotent. Called by the kernel's ``exec_lines``."""
    global WORKSPACE_FD
    if WORKSPACE_FD is None:
        WORKSPACE_FD = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    packages = os.environ.get(PACKAGES_ENV)
    if packages and packages not in sys.path:
        sys.path.append(packages)  # after the environment's own packages: they always win
    from threadbook_kernel.display import install

    install()
    _offer_helpers()
    shell = _shell()
    if shell is not None:
        from threadbook_kernel.interrupts import install as keep_interrupts

        keep_interrupts(shell)


def prime() -> None:
    """Do once, before a thread has this kernel, what its first cell would otherwise do for
    the first time (~6 ms of it): import the display path's renderers, run the display
    formatters and the input transformers (whose patterns compile on first use), flush the
    output streams. Nothing shows: no output, no execution count, no name in the user
    namespace. The fork server calls it before it forks (every forked kernel shares the
    result), a warm kernel's warm-up in each."""
    shell = _shell()
    if shell is None:
        return
    from threadbook_kernel.display import improve

    shell.transform_cell("1 + 1\n")
    improve(shell.display_formatter.format(2)[0])
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # a kernel's output streams: the first flush sets up their way to IOPub


def _shell() -> Any:
    """This process's IPython shell, or None (no IPython, or no shell made yet)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _offer_helpers() -> None:
    """Put the functions the model is told about into the user namespace, as hidden names
    (``user_ns_hidden``: snapshots and ``%who`` leave them out; the next kernel gets them anew)."""
    shell = _shell()
    if shell is None:
        return
    from threadbook_kernel.charts import show_chart
    from threadbook_kernel.frames import display_dataframe_to_user

    shell.push({"display_dataframe_to_user": display_dataframe_to_user, "show_chart": show_chart}, interactive=False)


def workspace_fd() -> int | None:
    """The workspace folder recorded by :func:`setup` (it follows the folder even when user
    code changed directory or a warm kernel's folder was renamed), else None: the current
    directory (for ``dir_fd=``)."""
    fd = WORKSPACE_FD
    try:
        return fd if fd is not None and stat.S_ISDIR(os.fstat(fd).st_mode) else None
    except OSError:
        return None
