"""Real MCP servers for the tests (tests/mcp/servers.py, built with the official SDK): one over
streamable HTTP on 127.0.0.1 behind a bearer token, one over stdio started by the bot."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The HTTP server's bearer token, hunted everywhere it must not be.
TOKEN = "mcpTk-5e8a1c2b9d-hunt-me"
#: The stdio server's token (its environment), hunted likewise.
STDIO_TOKEN = "stdioTk-77d1f0a3c6-hunt-me"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class HttpServer:
    """``tests.mcp.servers http`` in a process of its own, started and stopped at will (same port)."""

    def __init__(self, folder: Path, *, json_response: bool = False) -> None:
        self.port = free_port()
        self.token_file = folder / "mcp-token"
        self.token_file.write_text(TOKEN, encoding="utf-8")
        self.token_file.chmod(0o600)
        self.json_response = json_response
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        command = [sys.executable, "-m", "tests.mcp.servers", "http", "--port", str(self.port)]
        command += ["--token-file", str(self.token_file), *(["--json"] if self.json_response else [])]
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the MCP test server exited with {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the MCP test server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def settings(self, **values: Any) -> dict[str, Any]:
        """An ``mcp.<name>`` entry for this server."""
        return {"url": self.url, "headers": {"Authorization": f"Bearer {TOKEN}"}, **values}


def stdio_settings(**values: Any) -> dict[str, Any]:
    """An ``mcp.<name>`` entry that starts ``tests.mcp.servers stdio``."""
    digest = hashlib.sha256(STDIO_TOKEN.encode()).hexdigest()
    return {
        "command": sys.executable,
        "args": ["-m", "tests.mcp.servers", "stdio", "--token-sha256", digest],
        "env": {"STDIO_TOKEN": STDIO_TOKEN, "PYTHONPATH": str(REPO)},
        **values,
    }


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
