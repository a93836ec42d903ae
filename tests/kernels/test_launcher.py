"""KernelLauncher: plans are complete and frozen; start-up failures are typed and leave nothing behind."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from jupyter_client.manager import AsyncKernelManager

from kernels import KernelLauncher, KernelOptions, KernelStartError, LaunchPlan
from kernels.seam.plan import KernelHandle
from kernels.spawn.process import ThreadbookProvisioner
from tests.kernels.conftest import kernel_settings


class _BrokenSetUp(KernelLauncher):
    """A launcher whose per-start set-up fails (as a sandbox's can: unwritable run dir, ...)."""

    def provisioner(self, plan: LaunchPlan, manager: AsyncKernelManager) -> ThreadbookProvisioner:
        raise OSError("no space left for the identity files")


async def test_failed_set_up_is_a_start_error_and_leaves_no_run_dir(tmp_path: Path) -> None:
    launcher = _BrokenSetUp(kernel_settings(tmp_path), run_root=tmp_path / "run")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with pytest.raises(KernelStartError, match="no space left"):
        await launcher.start(launcher.plan(workspace, KernelOptions()))
    assert list(launcher.spawner.run_root.glob("kernel-*")) == []


def test_a_plan_is_complete_frozen_and_starts_nothing(tmp_path: Path) -> None:
    launcher = KernelLauncher(kernel_settings(tmp_path, memory_mb=640), run_root=tmp_path / "run")
    data = tmp_path / "data"
    plan = launcher.plan(tmp_path / "ws", KernelOptions(data_dir=data))
    assert plan.run_dir.parent == launcher.spawner.run_root and plan.kernel_id in plan.run_dir.name
    assert not plan.run_dir.exists() and not launcher.spawner.run_root.exists()  # planning touched nothing
    assert plan.environment["HOME"] == str(tmp_path / "ws") and plan.environment["THREADBOOK_DATA_DIR"] == str(data)
    assert plan.limits.memory_mb == 640 and plan.identity is None and plan.data_dir == data
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.workspace = tmp_path  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.environment["OPENAI_API_KEY"] = "sk-leak"  # type: ignore[index]
    assert launcher.plan(tmp_path / "ws", KernelOptions()).kernel_id != plan.kernel_id


class _CountingLauncher(KernelLauncher):
    """Records how many starts ran at once."""

    running = 0
    most = 0

    async def _start(self, plan: LaunchPlan) -> KernelHandle:
        type(self).running += 1
        type(self).most = max(type(self).most, type(self).running)
        try:
            return await super()._start(plan)
        finally:
            type(self).running -= 1


async def test_a_burst_of_starts_takes_its_turns(tmp_path: Path) -> None:
    """A burst of new threads starts ``start_slots`` kernels at a time, so none of them runs
    out its start timeout sharing the CPU with all the others."""
    launcher = _CountingLauncher(kernel_settings(tmp_path), run_root=tmp_path / "run", start_slots=2)
    workspaces = [tmp_path / f"ws{n}" for n in range(5)]
    for workspace in workspaces:
        workspace.mkdir()
    handles = await asyncio.gather(*(launcher.start(launcher.plan(ws, KernelOptions())) for ws in workspaces))
    try:
        assert _CountingLauncher.most == 2 and all([await handle.is_alive() for handle in handles])
    finally:
        await asyncio.gather(*(handle.shutdown() for handle in handles))
