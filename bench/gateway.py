"""A real Jupyter Kernel Gateway for the ``gateway`` kernel sources (and the gateway tests):
PyPI ``jupyter-kernel-gateway`` from ``.venv-gateway`` (``make gateway-env``) on 127.0.0.1, its
kernels running from the kernel environment through a kernelspec written here, stopped by
its pid."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The kernel interpreter (the kernel environment) the gateway's kernelspec runs.
KERNEL_PYTHON = Path(os.environ.get("THREADBOOK_TEST_KERNEL_PYTHON") or REPO / ".venv-kernel" / "bin" / "python")
GATEWAY = REPO / ".venv-gateway" / "bin" / "jupyter-kernelgateway"
KERNEL_NAME = "threadbook-test"


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
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
        (spec / "kernel.json").write_text(
            json.dumps({"argv": argv, "display_name": "Threadbook", "language": "python"})
        )

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
            str(GATEWAY),
            "--KernelGatewayApp.ip=127.0.0.1",
            f"--KernelGatewayApp.port={self.port}",
            "--JupyterWebsocketPersonality.list_kernels=True",
            f"--KernelGatewayApp.default_kernel_name={KERNEL_NAME}",
            "--KernelGatewayApp.env_process_whitelist=['HOME','JUPYTER_PATH','JUPYTER_RUNTIME_DIR']",
        ]
        log = open(self.root / "gateway.log", "ab")
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


_shared: KernelGateway | None = None


def shared_gateway() -> KernelGateway:
    """One gateway for a bench run (started on first use; :func:`stop_shared_gateway` ends it)."""
    global _shared
    if _shared is None:
        if not GATEWAY.exists():
            raise RuntimeError(f"no Jupyter Kernel Gateway at {GATEWAY}: run `make gateway-env`")
        _shared = KernelGateway(Path(tempfile.mkdtemp(prefix="bench-gateway-")))
        _shared.start()
    return _shared


def stop_shared_gateway() -> None:
    """Stop the bench's gateway, if one was started."""
    global _shared
    if _shared is not None:
        _shared.stop()
        _shared = None


def gateway_config(server: KernelGateway) -> dict[str, Any]:
    """``kernels.gateway`` for kernels on ``server``."""
    return {"url": server.url, "auth_token": server.token, "kernel_name": KERNEL_NAME, "request_timeout_s": 60}
