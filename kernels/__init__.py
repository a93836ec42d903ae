"""Kernel runtime: one Jupyter kernel and one workspace folder per chat thread.

The rest of the bot uses only the names re-exported here.
"""

from __future__ import annotations

from kernels.launcher import KernelHandle, KernelLauncher, ThreadbookProvisioner
from kernels.options import KernelOptions
from kernels.pool import KernelPool
from kernels.reaper import Reaper
from kernels.result import (
    DisplayOutput,
    ErrorInfo,
    ExecutionResult,
    KernelError,
    KernelStartError,
    Outcome,
    PoolFullError,
    QuotaError,
    StreamChunk,
    UnsafePathError,
)
from kernels.sandbox import make_launcher
from kernels.session import KernelSession
from kernels.workspace import FileInfo, SavedFile, Workspace, WorkspaceManager, sanitize_name

__all__ = [
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
    "KernelStartError",
    "Outcome",
    "PoolFullError",
    "QuotaError",
    "Reaper",
    "SavedFile",
    "StreamChunk",
    "ThreadbookProvisioner",
    "UnsafePathError",
    "Workspace",
    "WorkspaceManager",
    "make_launcher",
    "sanitize_name",
]
