"""Per-kernel launch options that come from the channel policy, not from global settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KernelOptions:
    """What one thread's kernel may reach.

    ``data_dir`` is offered read-only to the kernel (for now announced through the
    ``THREADBOOK_DATA_DIR`` variable; the bubblewrap sandbox will bind-mount it read-only).
    ``network`` is recorded for the sandbox, which will unshare the network when False.
    """

    data_dir: Path | None = None
    network: bool = False
