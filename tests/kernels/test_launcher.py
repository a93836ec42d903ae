"""KernelLauncher start-up failures: typed error, nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels import KernelLauncher, KernelOptions, KernelStartError, ThreadbookProvisioner
from tests.kernels.conftest import kernel_settings


class _BrokenSetUp(KernelLauncher):
    """A launcher whose per-start set-up fails (as a sandbox's can: unwritable run dir, ...)."""

    def configure_provisioner(
        self, provisioner: ThreadbookProvisioner, *, workspace: Path, run_dir: Path, options: KernelOptions
    ) -> None:
        raise OSError("no space left for the identity files")


async def test_failed_set_up_is_a_start_error_and_leaves_no_run_dir(tmp_path: Path) -> None:
    launcher = _BrokenSetUp(kernel_settings(tmp_path), run_root=tmp_path / "run")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with pytest.raises(KernelStartError, match="no space left"):
        await launcher.start(workspace)
    assert list(launcher.run_root.glob("kernel-*")) == []
