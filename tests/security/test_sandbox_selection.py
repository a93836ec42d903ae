"""``kernels.sandbox: auto | bwrap | none``: the start-up probe fails closed; what the model is told."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from kernels import KernelLauncher, KernelOptions, build
from kernels.build import UNSANDBOXED, sandbox_in_force, spawn_launcher
from kernels.bwrap.launcher import BwrapLauncher
from kernels.sandbox.args import DATA
from kernels.sandbox.remedy import CONTAINER_FLAGS, SECCOMP_PROFILE, refusal
from kernels.seam.result import SandboxUnavailableError
from kernels.seam.settings import KernelSettings
from tests.security.conftest import NO_SLIRP, SKIP_REASON

MISSING = "/nonexistent/bwrap"


def settings(tmp_path: Path, mode: str) -> KernelSettings:
    return KernelSettings(  # type: ignore[arg-type]
        sandbox=mode, workspace_root=tmp_path / "ws", preload=(), packages={"dir": tmp_path / "packages"}
    )


def test_none_is_the_plain_launcher_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        launcher = spawn_launcher(settings(tmp_path, "none"))
    assert type(launcher) is KernelLauncher
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"⚠️ {UNSANDBOXED}: kernels run as this bot's user and can read its files"]
    assert "WITHOUT a sandbox (kernels.sandbox: none)" in warnings[0]
    assert sandbox_in_force(launcher) is None
    options = KernelOptions(data_dir=tmp_path, network=True)
    assert launcher.kernel_view(options) == options


@pytest.mark.parametrize("mode", ["auto", "bwrap"])
@pytest.mark.parametrize("container", [True, False])
def test_a_sandbox_that_cannot_start_stops_start_up(
    tmp_path: Path, mode: str, container: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed: no launcher at all, one line saying what is missing and what fixes it here."""
    monkeypatch.setattr(build, "in_container", lambda: container)
    with pytest.raises(SandboxUnavailableError) as refused:
        spawn_launcher(settings(tmp_path, mode), bwrap=MISSING)
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(f"kernels.sandbox is '{mode}' but bubblewrap at {MISSING} does not run")
    assert "or set kernels.sandbox: none to run kernels without a sandbox" in line
    if container:
        assert f"--security-opt seccomp={SECCOMP_PROFILE} --security-opt systempaths=unconfined" in line
    else:
        assert "--security-opt" not in line and "kernel.unprivileged_userns_clone=1" in line


def test_the_refusal_names_the_fix_for_what_is_missing() -> None:
    missing = refusal("auto", "bubblewrap not found (install the bubblewrap package)", container=False)
    assert "To fix: install bubblewrap (apt-get install bubblewrap" in missing
    masked = refusal(
        "auto",
        "bubblewrap cannot start a sandboxed kernel here: Can't mount proc on /newroot/proc: Operation not permitted",
        container=True,
    )
    assert "Can't mount proc" in masked and f"run the container with {CONTAINER_FLAGS}" in masked
    # Runtime flags cannot make up for a missing program: the image needs it.
    image = refusal(
        "bwrap",
        "setpriv (util-linux) not found: as root it is how the kernel drops to an unprivileged uid",
        container=True,
    )
    assert "To fix: install util-linux in the image" in image and "--security-opt" not in image
    userns = refusal(
        "auto",
        "bubblewrap cannot start a sandboxed kernel here: bwrap: No permissions to create new namespace",
        container=False,
    )
    assert "kernel.unprivileged_userns_clone=1" in userns and "apparmor_restrict_unprivileged_userns=0" in userns


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_auto_uses_bwrap_when_it_works(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        launcher = spawn_launcher(settings(tmp_path, "auto"))
    assert isinstance(launcher, BwrapLauncher) and not caplog.records
    assert (sandbox_in_force(launcher) or "").startswith("bubblewrap: own namespaces")
    assert launcher.spawner.transport == "ipc" and launcher.kernel_spec().interrupt_mode == "message"
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
