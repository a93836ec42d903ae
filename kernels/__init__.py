"""Kernel runtime: one Jupyter kernel and one workspace folder per chat thread.

The bottom layer: nothing here imports the bot or its adapters. This module is the one door
the bot comes in by (an import-linter contract forbids it every ``kernels.*`` submodule);
what it exports, and nothing else, is what the bot may use:

* **building** (the composition root and its checks): :func:`build_launcher`,
  :func:`build_pool`, :func:`oneshot_for`, :func:`package_installer`, :func:`sandbox_in_force`
  and :data:`UNSANDBOXED`, from the bot's :class:`KernelSettings`; the :class:`Reaper` of idle
  kernels and stale workspaces; the :class:`Launcher` protocol (health checks look at it);
* **a thread's kernel**: the :class:`KernelPool` and its :class:`KernelSession` objects, run with
  :class:`KernelOptions`; an execution's :class:`ExecutionResult` (:class:`Outcome`,
  :class:`DisplayOutput`, the image types a chat shows: :data:`CHAT_IMAGE_MIMES`);
* **the bot's own work on untrusted data**: :class:`OneShot` (previews, ``export html``);
  packages on demand: :class:`PackageInstaller`, :class:`PackageOutcome`,
  :func:`missing_module`, :func:`distribution_for`;
* **files a kernel can write**: the thread's :class:`Workspace` (its own folder
  :data:`STATE_DIR`), and :mod:`safefs` with :class:`PinnedFile`, the one way to open them;
* **errors**: :class:`KernelError` and its kinds;
* **words for people**: :func:`human_size`, :func:`human_age`.
"""

from __future__ import annotations

from kernels.build import (
    UNSANDBOXED,
    build_launcher,
    build_pool,
    oneshot_for,
    package_installer,
    sandbox_in_force,
)
from kernels.host import safefs
from kernels.host.packages import PackageInstaller, PackageOutcome, distribution_for, missing_module
from kernels.host.runroot import possible_run_parents
from kernels.host.safefs import PinnedFile
from kernels.host.workspace import STATE_DIR, FileInfo, SavedFile, Workspace, WorkspaceManager, sanitize_name
from kernels.local.launcher import KernelLauncher
from kernels.oneshot.runner import OneShot, OneShotUnavailableError
from kernels.pool.pool import KernelPool
from kernels.pool.reaper import Reaper
from kernels.seam.options import KernelOptions
from kernels.seam.plan import KernelHandle, Launcher, LaunchPlan
from kernels.seam.result import (
    CHAT_IMAGE_MIMES,
    DisplayOutput,
    ErrorInfo,
    ExecutionResult,
    KernelError,
    KernelStartError,
    KernelUnavailableError,
    Outcome,
    PoolFullError,
    QueueFullError,
    QueueLeftError,
    QueueTimeoutError,
    QuotaError,
    SandboxUnavailableError,
    StreamChunk,
    UnsafePathError,
)
from kernels.seam.settings import KernelSettings
from kernels.seam.units import human_age, human_size
from kernels.session.session import KernelSession
from kernels.spawn.handle import LocalKernelHandle

__all__ = [
    "CHAT_IMAGE_MIMES",
    "STATE_DIR",
    "UNSANDBOXED",
    "DisplayOutput",
    "ErrorInfo",
    "ExecutionResult",
    "FileInfo",
    "KernelError",
    "KernelHandle",
    "KernelLauncher",
    "KernelOptions",
    "KernelPool",
    "KernelSession",
    "KernelSettings",
    "KernelStartError",
    "KernelUnavailableError",
    "LaunchPlan",
    "Launcher",
    "LocalKernelHandle",
    "OneShot",
    "OneShotUnavailableError",
    "Outcome",
    "PackageInstaller",
    "PackageOutcome",
    "PinnedFile",
    "PoolFullError",
    "QueueFullError",
    "QueueLeftError",
    "QueueTimeoutError",
    "QuotaError",
    "Reaper",
    "SandboxUnavailableError",
    "SavedFile",
    "StreamChunk",
    "UnsafePathError",
    "Workspace",
    "WorkspaceManager",
    "build_launcher",
    "build_pool",
    "distribution_for",
    "human_age",
    "human_size",
    "missing_module",
    "oneshot_for",
    "package_installer",
    "possible_run_parents",
    "safefs",
    "sandbox_in_force",
    "sanitize_name",
]
