"""deploy/compose brought up with podman-compose (the bot and kernel images built from the
working tree, PostgreSQL from a Debian stand-in where no registry can be pulled from) answers a
console turn: the bot in its container, the kernel in the kernel container through the Jupyter
Kernel Gateway, the store in PostgreSQL. The kernel holds no secret, reaches neither the
database nor the outside, and cannot read the gateway's token from /proc."""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.container.podman import REPO, Podman
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

#: Two more images to build and a stack to bring up: about 2 min on 2 cores beside the bot's image.
pytestmark = [
    pytest.mark.timeout(1500),
    pytest.mark.skipif(
        shutil.which("podman-compose") is None, reason="podman-compose is not installed (.ci/run installs it)"
    ),
]

COMPOSE = REPO / "deploy" / "compose" / "compose.yaml"
PROJECT = "threadbook-ci"
KERNEL_IMAGE = "localhost/threadbook-ci-kernels:test"
POSTGRES_IMAGE = "localhost/threadbook-ci-postgres:test"

#: Every secret of the deployment carries this marker, so a probe can look for all of them.
MARK = "canary-from"
SECRETS = {
    "OPENAI_API_KEY": f"sk-{MARK}-compose-{secrets.token_hex(4)}",
    "SLACK_BOT_TOKEN": f"xoxb-{MARK}-compose-{secrets.token_hex(4)}",
    "SLACK_APP_TOKEN": f"xapp-{MARK}-compose-{secrets.token_hex(4)}",
    "KG_AUTH_TOKEN": f"kg-{MARK}-compose-{secrets.token_hex(8)}",
    "POSTGRES_PASSWORD": f"pg-{MARK}-compose-{secrets.token_hex(8)}",
}

#: What podman-compose 1.0 itself prints (the podman command lines, with the values compose
#: interpolated into them, and the exit code): not the bot's output.
COMPOSE_CHATTER = re.compile(r"^(\['podman'|using podman version|podman |exit code: )")

CONSOLE = "python -m bot console --config /app/config.yaml --out /app/data/out"
#: podman 4.3's DNS (aardvark-dns 1.4) may answer a container's first lookups before it knows
#: the container's networks; the bot would then fail to open the store and exit (deployed,
#: compose restarts it). The test waits until the names resolve.
WAIT_FOR_NAMES = (
    "timeout 30 sh -c 'until getent hosts postgres kernel-gateway >/dev/null; do sleep 0.2; done' "
    "|| { echo 'the names postgres and kernel-gateway do not resolve' >&2; exit 3; };"
)

PROBE = f"""
import glob, os, socket
import pandas as pd
leaks = []
for path in glob.glob('/proc/[0-9]*/environ'):
    try:
        data = open(path, 'rb').read()
    except OSError:
        continue
    if b'{MARK}' in data:
        leaks.append(path)
def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return 'open'
    except OSError as exc:
        return type(exc).__name__
print('uid', os.getuid(), 'cwd', os.getcwd().startswith('/data/workspaces/'))
print('secret in env', any('{MARK}' in v for v in os.environ.values()), 'KG_AUTH_TOKEN' in os.environ)
print('postgres', reach('postgres', 5432), 'outside', reach('192.0.2.1', 80), 'dns', reach('example.com', 443))
print('leaks', leaks)
print('total', pd.DataFrame({{'x': [1, 2, 3]}})['x'].sum())
"""


class Stack:
    """podman-compose on deploy/compose/compose.yaml, as project :data:`PROJECT`."""

    def __init__(self, podman: Podman, bot_image: str, llm_url: str) -> None:
        self.podman = podman
        self.env = {
            **podman.env,
            **SECRETS,
            "THREADBOOK_IMAGE": bot_image,
            "THREADBOOK_KERNEL_IMAGE": KERNEL_IMAGE,
            "POSTGRES_IMAGE": POSTGRES_IMAGE,
            "OPENAI_BASE_URL": llm_url,
            "THREADBOOK_MODEL": "fake-model",
        }

    async def compose(self, *args: str, stdin: str = "", timeout: float = 300) -> tuple[int, str, str]:
        """podman-compose ``args``: the exit code (of the container, for ``run``) and stdout and
        stderr without podman-compose's own lines."""
        process = await asyncio.create_subprocess_exec(
            "podman-compose",
            "-p",
            PROJECT,
            "-f",
            str(COMPOSE),
            *args,
            env=self.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        raw_out, raw_err = await asyncio.wait_for(process.communicate(stdin.encode()), timeout)
        code = process.returncode or 0
        streams = []
        for raw in (raw_out, raw_err):
            lines = raw.decode(errors="replace").splitlines()
            for line in lines:
                if line.startswith("exit code: "):  # podman-compose 1.0 exits 0 whatever ran
                    code = code or int(line.split()[-1])
            streams.append("\n".join(line for line in lines if not COMPOSE_CHATTER.match(line)))
        return code, streams[0], streams[1]

    async def ready(self, service: str, command: str, timeout: float = 120) -> None:
        """Wait until ``command`` succeeds in the service's container."""
        deadline = time.monotonic() + timeout
        while True:
            code, out, err = await self.podman.run_async(
                "exec", f"{PROJECT}_{service}_1", "sh", "-c", command, timeout=30
            )
            if code == 0:
                return
            if time.monotonic() > deadline:
                logs = await self.podman.run_async("logs", f"{PROJECT}_{service}_1")
                raise AssertionError(f"{service} not ready: {out}{err}\n{logs[1][-2000:]}{logs[2][-2000:]}")
            await asyncio.sleep(1)


@pytest.fixture
async def stack(podman: Podman, base_image: str, image: str) -> AsyncIterator[tuple[Stack, ScriptedOpenAI]]:
    started = time.monotonic()
    await asyncio.to_thread(
        podman.build,
        KERNEL_IMAGE,
        REPO,
        base=base_image,
        containerfile=REPO / "deploy/compose/kernel-gateway/Dockerfile",
    )
    await asyncio.to_thread(podman.build, POSTGRES_IMAGE, Path(__file__).parent / "postgres", base=base_image)
    size = podman.size(KERNEL_IMAGE) / 1e9
    print(
        f"\ncompose: kernel and postgres images built in {time.monotonic() - started:.0f} s (kernel image {size:.2f} GB)"
    )
    # The bot's container reaches the scripted model on the host through the host's address.
    async with ScriptedOpenAI(api_key=SECRETS["OPENAI_API_KEY"], host="0.0.0.0") as llm:
        stack = Stack(podman, image, f"http://host.containers.internal:{llm.port}/v1")
        try:
            started = time.monotonic()
            code, out, err = await stack.compose("up", "-d", "--no-build", "postgres", "kernel-gateway")
            assert code == 0, out + err
            await stack.ready("postgres", "/usr/lib/postgresql/*/bin/pg_isready -q -h 127.0.0.1")
            await stack.ready(
                "kernel-gateway",
                '/opt/gateway/bin/python -c "import os, urllib.request as u; u.urlopen(u.Request('
                "'http://127.0.0.1:8888/api/kernelspecs', headers={'Authorization': 'token ' + os.environ['KG_AUTH_TOKEN']}), timeout=2)\"",
            )
            print(f"compose: postgres and the kernel gateway up in {time.monotonic() - started:.0f} s")
            yield stack, llm
        finally:
            await stack.compose("down", "-v", timeout=180)
            # podman-compose 1.0 leaves the project's networks behind.
            await podman.run_async("network", "rm", *(f"{PROJECT}_{net}" for net in ("egress", "kernels", "db")))


async def test_compose_answers_through_the_kernel_container(stack: tuple[Stack, ScriptedOpenAI]) -> None:
    compose, llm = stack
    llm.script(tool_call(PROBE), lambda r: answer("The kernel said: " + r["messages"][-1]["content"]))
    started = time.monotonic()
    code, out, err = await compose.compose(
        "run",
        "--rm",
        "-T",
        "--no-deps",
        "bot",
        "sh",
        "-c",
        f"{WAIT_FOR_NAMES} exec {CONSOLE}",
        stdin="what is the total of x?\n",
    )
    print(f"compose: console turn through the gateway in {time.monotonic() - started:.1f} s")
    assert code == 0, (out + err)[-3000:]
    seen = "\n".join(str(m.get("content")) for r in llm.requests for m in r["messages"] if m.get("role") == "tool")
    print(seen)
    assert "total 6" in out and "total 6" in seen, (out, err[-2000:])
    # The kernel container: the bot's uid, in the thread's folder on the shared volume ...
    assert "uid 10001 cwd True" in seen
    # ... no secret in its environment or any process's (the gateway is not dumpable) ...
    assert "secret in env False False" in seen
    assert "leaks []" in seen
    # ... and no way to the database (another network) or out (an internal network).
    reach = seen.split("postgres ")[1].split("\n")[0].split()
    assert reach[0] != "open" and reach[2] != "open" and reach[4] != "open", reach
    for secret in SECRETS.values():
        assert secret not in out and secret not in err and secret not in seen
