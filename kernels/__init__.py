"""Kernel runtime: one Jupyter kernel and one workspace folder per chat thread.

The bottom layer: nothing here imports the bot or its adapters. The bot builds a pool with
:func:`build_pool` (or :func:`build_launcher` and :class:`KernelPool`) from its
:class:`KernelSettings`; kernels start through one seam, :class:`Launcher` carrying out a
:class:`LaunchPlan` (:mod:`kernels.launch.plan`).
"""

from __future__ import annotations

from kernels.build import build_launcher, build_pool
from kernels.launch.local import KernelLauncher, LocalKernelHandle
from kernels.launch.plan import KernelHandle, Launcher, LaunchPlan
from kernels.options import KernelOptions
from kernels.packages import PackageInstaller, PackageOutcome
from kernels.pool import KernelPool
from kernels.reaper import Reaper
from kernels.result import (
    DisplayOutput,
    ErrorInfo,
    ExecutionResult,
    KernelError,
    KernelStartError,
    KernelUnavailableError,
    Outcome,
    PoolFullError,
    QuotaError,
    StreamChunk,
    UnsafePathError,
)
from kernels.session.session import KernelSession
from kernels.settings import KernelSettings
from kernels.workspace import FileInfo, SavedFile, Workspace, WorkspaceManager, sanitize_name

__all__ = [
    "DisplayOutput",
    "ErrorInfo",
    "ExecutionResult",
    "FileInfo",
    "KernelError",
    "KernelHandle",
    "LocalKernelHandle",
    "KernelLauncher",
    "KernelOptions",
    "KernelSettings",
    "LaunchPlan",
    "Launcher",
    "KernelPool",
    "KernelSession",
    "KernelStartError",
    "KernelUnavailableError",
    "Outcome",
    "PackageInstaller",
    "PackageOutcome",
    "PoolFullError",
    "QuotaError",
    "Reaper",
    "SavedFile",
    "StreamChunk",
    "UnsafePathError",
    "Workspace",
    "WorkspaceManager",
    "build_launcher",
    "build_pool",
    "sanitize_name",
]
