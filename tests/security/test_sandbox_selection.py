"""``kernels.sandbox: auto | bwrap | none``, the start-up probe, and what the model is told."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from kernels import KernelLauncher, KernelOptions, KernelStartError
from kernels.launchers import spawn_launcher
from kernels.sandbox.args import DATA
from kernels.sandbox.launcher import BwrapLauncher
from kernels.settings import KernelSettings
from tests.security.conftest import NO_SLIRP, SKIP_REASON

MISSING = "/nonexistent/bwrap"


def settings(tmp_path: Path, mode: str) -> KernelSettings:
    return KernelSettings(  # type: ignore[arg-type]
        sandbox=mode, workspace_root=tmp_path / "ws", preload=(), packages={"dir": tmp_path / "packages"}
    )


def test_none_is_the_plain_launcher(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    launcher = spawn_launcher(settings(tmp_path, "none"))
    assert type(launcher) is KernelLauncher and not caplog.records
    options = KernelOptions(data_dir=tmp_path, network=True)
    assert launcher.kernel_view(options) == options


def test_auto_falls_back_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        launcher = spawn_launcher(settings(tmp_path, "auto"), bwrap=MISSING)
    assert type(launcher) is KernelLauncher
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "sandbox off" in warnings[0].getMessage()
    assert MISSING in warnings[0].getMessage()  # says what is missing


def test_bwrap_refuses_to_start_without_it(tmp_path: Path) -> None:
    with pytest.raises(KernelStartError, match="kernels.sandbox is 'bwrap' but .*nonexistent/bwrap"):
        spawn_launcher(settings(tmp_path, "bwrap"), bwrap=MISSING)


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_auto_uses_bwrap_when_it_works(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        launcher = spawn_launcher(settings(tmp_path, "auto"))
    assert isinstance(launcher, BwrapLauncher) and not caplog.records
    assert launcher.transport == "ipc" and launcher.kernel_spec().interrupt_mode == "message"
    # The model is told the in-sandbox data path, and network only where slirp4netns gives it.
    view = launcher.kernel_view(KernelOptions(data_dir=tmp_path, network=True))
    assert view == KernelOptions(data_dir=DATA, network=NO_SLIRP is None)
    assert launcher.kernel_view(KernelOptions()) == KernelOptions()
    if NO_SLIRP is None:
        assert launcher.network is not None, f"slirp4netns is installed but not usable: {launcher.network_missing}"


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
async def test_network_without_slirp_stays_offline_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A fresh machine without slirp4netns: the bot starts, network: true kernels run offline, one warning."""
    launcher = spawn_launcher(settings(tmp_path, "bwrap"), slirp4netns="/nonexistent/slirp4netns")
    assert isinstance(launcher, BwrapLauncher) and launcher.network is None
    assert launcher.kernel_view(KernelOptions(network=True)) == KernelOptions(network=False)
    interfaces = "import socket; print(sorted(n for _, n in socket.if_nameindex()))"
    workspaces = [tmp_path / "a", tmp_path / "b"]
    for workspace in workspaces:
        workspace.mkdir()
    seen: list[dict[str, Any]] = []
    with caplog.at_level(logging.WARNING):
        plans = [launcher.plan(ws, KernelOptions(network=True)) for ws in workspaces]
        assert [plan.network for plan in plans] == [False, False]
        handles = await asyncio.gather(*(launcher.start(plan) for plan in plans))
    try:
        for handle in handles:
            reply = await handle.client.execute_interactive(interfaces, timeout=10, output_hook=seen.append)
            assert reply["content"]["status"] == "ok"
    finally:
        await asyncio.gather(*(handle.shutdown() for handle in handles))
    streams = [msg["content"]["text"] for msg in seen if msg["msg_type"] == "stream"]
    assert streams == ["['lo']\n", "['lo']\n"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "network: true" in warnings[0] and "apt-get install slirp4netns" in warnings[0]
