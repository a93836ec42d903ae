"""A real Jupyter Kernel Gateway (PyPI ``jupyter-kernel-gateway``, in ``.venv-gateway``, built by
``make gateway-env``) on 127.0.0.1, whose kernels run from the kernel environment through a
kernelspec written here. Stopped by its pid; the tests skip, saying why, where it is missing."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import KERNEL_PYTHON

REPO = Path(__file__).resolve().parents[2]
GATEWAY = REPO / ".venv-gateway" / "bin" / "jupyter-kernelgateway"
KERNEL_NAME = "threadbook-test"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class KernelGateway:
    """One Kernel Gateway process; :meth:`stop` and :meth:`start` again keep its address."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        spec = root / "share" / "jupyter" / "kernels" / KERNEL_NAME
        spec.mkdir(parents=True, exist_ok=True)
        argv = [str(KERNEL_PYTHON), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Threadbook", "language": "python"}))

    def start(self) -> None:
        """Start it and wait until it answers."""
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(self.root),
            "JUPYTER_PATH": str(self.root / "share" / "jupyter"),
            "JUPYTER_DATA_DIR": str(self.root / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.root / "runtime"),
            "KG_AUTH_TOKEN": self.token,
        }
        args = [
            str(GATEWAY), "--KernelGatewayApp.ip=127.0.0.1", f"--KernelGatewayApp.port={self.port}",
            "--JupyterWebsocketPersonality.list_kernels=True", f"--KernelGatewayApp.default_kernel_name={KERNEL_NAME}",
            "--KernelGatewayApp.env_process_whitelist=['HOME','JUPYTER_PATH','JUPYTER_RUNTIME_DIR']",
        ]  # fmt: skip
        log = open(self.root / "gateway.log", "ab")  # noqa: SIM115 - the process keeps it
        self.process = subprocess.Popen(args, env=env, stdout=log, stderr=log, cwd=self.root, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the kernel gateway exited: {(self.root / 'gateway.log').read_text()[-2000:]}")
            try:
                request = urllib.request.Request(f"{self.url}/api", headers={"Authorization": f"token {self.token}"})
                with urllib.request.urlopen(request, timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the kernel gateway did not answer within 60 s")

    def stop(self) -> None:
        """Stop it (its kernels with it) by its pid."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)

    def kernels(self) -> list[str]:
        """The ids of the kernels it runs (straight from its REST API)."""
        request = urllib.request.Request(f"{self.url}/api/kernels", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return [k["id"] for k in json.loads(response.read())]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelGateway]:
    if not GATEWAY.exists():
        pytest.skip(f"no Jupyter Kernel Gateway at {GATEWAY} (make gateway-env builds it)")
    server = KernelGateway(tmp_path_factory.mktemp("gateway"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
