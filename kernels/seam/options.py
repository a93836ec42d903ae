"""Per-kernel launch options that come from the channel policy, not from global settings."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class KernelOptions:
    """What one thread's kernel may reach.

    ``data_dir``: a host folder offered read-only; its path (``/data`` under the bubblewrap
    sandbox, which bind-mounts it read-only) is in the kernel's ``THREADBOOK_DATA_DIR``.
    ``network``: whether the kernel may use the network. Only the sandbox enforces it: without
    it a sandboxed kernel has just its own ``lo``; with it slirp4netns adds ``tap0`` (when
    installed; else the kernel stays offline). Unsandboxed kernels use the host's network
    either way.
    ``background_processes``: processes a cell leaves running survive the end of its execution
    (default: they are killed, :mod:`kernels.host.leftovers`). Only the session acts on it: a kernel
    started for other options serves just as well.
    """

    data_dir: Path | None = None
    network: bool = False
    background_processes: bool = False

    def for_launch(self) -> KernelOptions:
        """These options without the ones that do not change how a kernel is started (for
        comparing what a forked or warm kernel was started for)."""
        return replace(self, background_processes=False)
