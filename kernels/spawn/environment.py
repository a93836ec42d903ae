"""A local kernel process's environment and its first steps between fork and exec.

:func:`kernel_environment` is the whole environment of a kernel (paths as the kernel sees
them): the bot's own variables only where allow-listed. :func:`child_setup` is the
``preexec_fn`` of every process a local launcher or a one-shot spawns: its cgroup, a new
session keyring and a high OOM score, before any of its code runs (bwrap and all below it
inherit them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from kernels.fork.jail import KERNEL_OOM_SCORE_ADJ, PR_SET_DUMPABLE, join_session_keyring, prctl, set_oom_score_adj
from kernels.host.cgroups import KernelCgroup
from kernels.host.interpreter import KernelPython

MPL_INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
#: Variables copied from the bot's environment when set; everything else is dropped.
_INHERITED = ("PATH", "LANG", "LC_ALL", "TZ")
_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
#: Where the kernel finds the shared packages folder (``threadbook_kernel.setup`` appends it to ``sys.path``).
PACKAGES_ENV = "THREADBOOK_PACKAGES_DIR"


def kernel_environment(
    *,
    python: KernelPython,
    workspace: Path,
    run_dir: Path,
    cache_dir: Path,
    data_dir: Path | None,
    packages_dir: Path | None,
) -> dict[str, str]:
    """The kernel's complete environment (paths as the kernel sees them): the bot's own
    variables only where allow-listed."""
    env = {name: os.environ[name] for name in _INHERITED if name in os.environ}
    env["PATH"] = os.pathsep.join([str(python.bin_dir), env.get("PATH", os.defpath)])
    env.setdefault("LANG", "C.UTF-8")
    env.update(
        HOME=str(workspace),
        MPLBACKEND=MPL_INLINE_BACKEND,
        MPLCONFIGDIR=str(cache_dir / "matplotlib"),
        IPYTHONDIR=str(run_dir / "ipython"),
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
        # pandas imports pyarrow, whose jemalloc starts a background thread at load: a
        # fork server with two threads refuses to fork (KERNELS.md pitfall 7).
        JE_ARROW_MALLOC_CONF="background_thread:false",
        **{name: "1" for name in _THREAD_VARS},
    )
    if data_dir is not None:
        env["THREADBOOK_DATA_DIR"] = str(data_dir)
    if packages_dir is not None:
        env[PACKAGES_ENV] = str(packages_dir)
    return env


def child_setup(cgroup: KernelCgroup | None) -> Callable[[], None]:
    """The ``preexec_fn`` of a spawned kernel: between fork and exec, so before any of its
    code runs, it enters its cgroup, raises its OOM score and gets its own session keyring
    (what it starts, bwrap included, inherits all three)."""

    # preexec_fn runs in the forked child of a threaded bot: only raw os calls and one ctypes
    # syscall here, nothing that takes a lock (logging, imports) another thread may have held.
    def setup() -> None:
        try:
            if cgroup is not None:
                cgroup.enter()
            join_session_keyring()
            _raise_oom_score()
        except BaseException as exc:
            os.write(2, f"threadbook: kernel set-up failed: {exc!r}\n".encode())  # stderr is the kernel log
            raise

    return setup


def _raise_oom_score() -> None:
    """(In a ``preexec_fn``, last) raise the child's ``oom_score_adj``. A bot that made itself
    non-dumpable (``bot/hardening.py``) leaves this child's ``/proc/self`` owned by root until
    it execs, so a child of a normal user's bot may not write it: it becomes dumpable first,
    as the exec a moment later makes it anyway."""
    try:
        set_oom_score_adj(KERNEL_OOM_SCORE_ADJ)
    except PermissionError:
        prctl(PR_SET_DUMPABLE, 1)
        set_oom_score_adj(KERNEL_OOM_SCORE_ADJ)
