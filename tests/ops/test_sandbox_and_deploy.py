"""Readiness's sandbox check against real launchers, and the Kubernetes probes against the config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bot.config import parse_settings
from bot.health import sandbox_check
from kernels.build import build_launcher
from kernels.seam.result import KernelStartError, SandboxUnavailableError
from kernels.seam.settings import KernelSettings
from tests.conftest import kernel_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def settings(tmp_path: Path, **overrides: object) -> KernelSettings:
    return KernelSettings.model_validate({**kernel_config(tmp_path), **overrides})


def test_no_sandbox_asked_for_is_ready_and_says_so(tmp_path: Path) -> None:
    kernels = settings(tmp_path, sandbox="none")
    check = sandbox_check(kernels, build_launcher(kernels))
    assert check.ok and check.detail.startswith("kernels run WITHOUT a sandbox (kernels.sandbox: none)")


def test_unsandboxed_kernels_not_asked_for_are_unready(tmp_path: Path) -> None:
    # build_launcher never gives `auto` an unsandboxed launcher (it refuses to start); should
    # one ever be handed over anyway, readiness fails.
    plain = build_launcher(settings(tmp_path, sandbox="none"))
    check = sandbox_check(settings(tmp_path, sandbox="auto"), plain)
    assert not check.ok and "kernels.sandbox: none is the only setting" in check.detail


def test_a_sandbox_that_cannot_start_refuses_to_build_a_launcher(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailableError, match="kernels.sandbox is 'auto' but .*kernels.sandbox: none"):
        build_launcher(settings(tmp_path, sandbox="auto"), bwrap="/nonexistent/bwrap")


@pytest.mark.parametrize("fork_server", [False, True])
def test_bubblewrap_in_force_is_ready(tmp_path: Path, fork_server: bool) -> None:
    kernels = settings(tmp_path, sandbox="bwrap", fork_server=fork_server)
    try:
        launcher = build_launcher(kernels)
    except KernelStartError as exc:
        pytest.skip(f"no bubblewrap sandbox here: {exc}")
    check = sandbox_check(kernels, launcher)
    assert check.ok and check.detail.startswith("bubblewrap")


def test_gateway_kernels_are_ready(tmp_path: Path) -> None:
    plain = build_launcher(settings(tmp_path, sandbox="none"))
    assert sandbox_check(settings(tmp_path, sandbox="auto", gateway={"url": "http://gateway:8888"}), plain).ok


def test_kubernetes_probes_use_the_configured_ops_port() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "bot.yaml").read_text(encoding="utf-8")))
    bot = next(d for d in docs if d and d["kind"] == "StatefulSet")
    container = bot["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "x") for e in container["env"]}
    env.update(POD_INDEX="0", THREADBOOK_STORAGE_URL="postgresql://bot:PASSWORD@db/threadbook")
    raw = yaml.safe_load((DEPLOY / "config" / "config.yaml").read_text(encoding="utf-8"))
    ops = parse_settings(raw, env=env).ops
    assert ops.http_host == "0.0.0.0", "the kubelet probes the pod's address"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ops.http_port == ports["ops"] == int(env["THREADBOOK_OPS_PORT"]) != 0
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ops"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "ops"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "ops"}
    annotations = bot["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ops.http_port) and annotations["prometheus.io/path"] == "/metrics"


def test_ops_server_is_off_by_default_and_in_config_yaml(tmp_path: Path) -> None:
    default = parse_settings({"llm": {"api_key": "k"}}, env={})
    assert (default.ops.http_host, default.ops.http_port, default.logging.format) == ("127.0.0.1", 0, "text")
    repo = Path(__file__).resolve().parents[2]
    raw = yaml.safe_load((repo / "config.yaml").read_text(encoding="utf-8"))
    key = {"OPENAI_API_KEY": "k"}
    quiet = parse_settings(raw, env=key)
    assert (quiet.ops.http_host, quiet.ops.http_port, quiet.logging.format) == ("127.0.0.1", 0, "text")
    on = parse_settings(
        raw,
        env={**key, "THREADBOOK_OPS_PORT": "9090", "THREADBOOK_OPS_HOST": "0.0.0.0", "THREADBOOK_LOG_FORMAT": "json"},
    )
    assert (on.ops.http_host, on.ops.http_port, on.logging.format) == ("0.0.0.0", 9090, "json")
