"""Where the kernels' run dirs live (kernels/host/runroot.py): a tmpfs when there is one."""

from __future__ import annotations

import ast
import asyncio
import os
import stat
import tempfile
from pathlib import Path

import pytest

from kernels import KernelPool, KernelSettings, SandboxUnavailableError
from kernels.host.cgroups import Cgroups
from kernels.host.runroot import SHM, is_tmpfs, make_private, run_parent
from kernels.local.launcher import KernelLauncher
from tests.kernels.conftest import kernel_settings

MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:21 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw,size=65536k
26 22 0:22 / /run rw shared:4 - tmpfs tmpfs rw
27 26 254:0 /srv /run rw shared:5 - ext4 /dev/vda rw
28 22 0:23 / /mnt/with\\040space rw shared:6 - tmpfs tmpfs rw
"""


def test_a_tmpfs_is_found_by_its_own_mount_the_last_one_there_winning(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO)
    assert is_tmpfs(Path("/dev/shm"), table)
    assert not is_tmpfs(Path("/run"), table)  # a disk mounted over the tmpfs
    assert not is_tmpfs(Path("/"), table)
    assert not is_tmpfs(Path("/dev"), table)  # only the mount point itself, not what is under it
    assert is_tmpfs(Path("/mnt/with space"), table)
    assert not is_tmpfs(Path("/dev/shm"), tmp_path / "missing")


def test_the_configured_folder_wins_else_dev_shm_when_a_capped_tmpfs_else_the_temp_dir(tmp_path: Path) -> None:
    assert run_parent(tmp_path / "run", memory_capped=False) == tmp_path / "run"
    assert run_parent(tmp_path / "run", memory_capped=True) == tmp_path / "run"
    in_memory = is_tmpfs(SHM) and os.access(SHM, os.W_OK | os.X_OK)
    assert run_parent(None, memory_capped=True) == (SHM if in_memory else Path(tempfile.gettempdir()))
    # Without a memory cap per kernel, one kernel's files could fill the shared tmpfs.
    assert run_parent(None, memory_capped=False) == Path(tempfile.gettempdir())


@pytest.mark.skipif(not is_tmpfs(SHM), reason="/dev/shm is not a tmpfs here")
@pytest.mark.skipif(
    not Cgroups.detected(memory_mb=512, max_processes=64).caps_memory, reason="no memory cgroup for kernels here"
)
def test_a_kernel_started_with_the_defaults_has_its_run_dir_and_sockets_in_memory(tmp_path: Path) -> None:
    """A real start where kernels get memory cgroups: its connection file and ipc sockets are
    in /dev/shm, and gone after it stops."""

    async def scenario() -> tuple[Path, list[str]]:
        settings: KernelSettings = kernel_settings(tmp_path)
        assert settings.run_root is None
        pool = KernelPool(settings, launcher=KernelLauncher(settings))
        await pool.start()
        try:
            session = await pool.get_or_start("t:runroot")
            result = await session.execute(
                "__import__('ipykernel.kernelapp').kernelapp.IPKernelApp.instance().connection_file"
            )
            run_dir = Path(ast.literal_eval(result.result or "''")).parent
            made = sorted(os.listdir(run_dir))
            await pool.shutdown("t:runroot")
        finally:
            await pool.shutdown_all()
        return run_dir, made

    run_dir, made = asyncio.run(scenario())
    assert run_dir.parent == SHM / f"threadbook-{os.getuid()}"
    assert "kernel.json" in made and any(name.startswith("ipc-") for name in made)
    assert not run_dir.exists()


def test_a_run_root_someone_else_could_read_stops_the_kernels(tmp_path: Path) -> None:
    """The run root sits in a folder anyone may write into: one made open to others (or a link
    planted in its place) is refused with a line naming the fix, not used."""
    mine = tmp_path / "mine"
    make_private(mine)
    assert stat.S_IMODE(os.lstat(mine).st_mode) == 0o700
    make_private(mine)  # it exists and is the bot's own: fine
    opened = tmp_path / "opened"
    opened.mkdir(mode=0o777)
    opened.chmod(0o777)
    with pytest.raises(SandboxUnavailableError, match="kernels.run_root"):
        make_private(opened)
    planted = tmp_path / "planted"
    planted.symlink_to(mine)
    with pytest.raises(SandboxUnavailableError, match="not this bot's own"):
        make_private(planted)


def test_a_launcher_does_not_open_on_a_run_root_that_is_not_the_bots_own(tmp_path: Path) -> None:
    settings = kernel_settings(tmp_path, run_root=tmp_path / "shared")
    launcher = KernelLauncher(settings)
    launcher.spawner.run_root.mkdir(parents=True, mode=0o755)
    launcher.spawner.run_root.chmod(0o755)
    with pytest.raises(SandboxUnavailableError, match="not this bot's own"):
        asyncio.run(launcher.open())
