"""Fail closed, run for real: the bot as a child process (``python -m bot``).

- ``kernels.sandbox: auto`` where bubblewrap cannot run (a stand-in ``bwrap`` first on
  ``PATH`` fails as it does in a container with masked ``/proc``) stops start-up with one
  line naming what is missing and what fixes it, and starts no kernel.
- ``kernels.sandbox: none``: a kernel runs as the bot's own uid (an unprivileged one here),
  and still cannot read the bot's environment or memory through ``/proc``: the bot dropped
  its secrets from ``os.environ`` and made itself non-dumpable (``bot/hardening.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from kernels.sandbox.remedy import CONTAINER_FLAGS, in_container
from tests.conftest import kernel_config
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call
from tests.security.test_nonroot import Layout, _child_env, _drop, _host_uid, layout  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
#: How bubblewrap fails under a container runtime's default flags (issue 29).
MASKED_PROC = "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"
FAKE_BWRAP = f"""#!/bin/sh
if [ "$1" = "--help" ]; then echo "usage: bwrap [OPTIONS...] [--] COMMAND [ARGS...]"; exit 0; fi
echo "{MASKED_PROC}" >&2
exit 1
"""

#: Run in the kernel (``CANARY_REVERSED`` prepended: the code the model sends, which the bot
#: keeps in memory, must not itself hold the canary). Prints one JSON line.
SNOOP = r"""
import json, os, re
canary = CANARY_REVERSED[::-1].encode()
bot = os.getppid()  # sandbox none, no fork server: the bot spawned this kernel

def attempt(action):
    try:
        return action()
    except OSError as exc:
        return type(exc).__name__

def environ_hits():
    hits = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            data = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        if canary in data:
            hits.append(int(pid))
    return hits

def memory_hit():
    maps = open(f"/proc/{bot}/maps").read().splitlines()
    with open(f"/proc/{bot}/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if not perms.startswith("rw") or end - start > 1 << 28:
                continue
            try:
                mem.seek(start)
                if canary in mem.read(end - start):
                    return "found"
            except OSError:
                continue
    return "not found"

status = dict(l.split(":", 1) for l in open(f"/proc/{bot}/status").read().splitlines() if ":" in l)
print(json.dumps({
    "uid": os.getuid(), "bot_uid": int(status["Uid"].split()[0]),
    "environ_hits": environ_hits(),
    "bot_environ": attempt(lambda: "read" if open(f"/proc/{bot}/environ", "rb").read() is not None else ""),
    "bot_memory": attempt(memory_hit),
    "own_environ": canary.decode() in json.dumps(dict(os.environ)),
}))
"""


def _fake_bwrap(folder: Path) -> Path:
    folder.mkdir()
    bwrap = folder / "bwrap"
    bwrap.write_text(FAKE_BWRAP)
    bwrap.chmod(0o755)
    return folder


def _kernels_of(marker: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "ipykernel" in " ".join(proc.info["cmdline"] or []) and str(marker) in " ".join(proc.info["cmdline"]):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("command", ["run", "console"])
async def test_auto_without_a_working_sandbox_refuses_to_start(tmp_path: Path, command: str) -> None:
    config = {
        "llm": {"base_url": "http://127.0.0.1:9/v1", "api_key": "test-key", "model": "fake-model"},
        "slack": {"bot_token": "xoxb-test", "app_token": "xapp-test", "api_url": "http://127.0.0.1:9/api/"},
        "kernels": {**kernel_config(tmp_path), "sandbox": "auto", "warm_pool": 2, "fork_server": True},
        "storage": {"path": str(tmp_path / "data" / "tb.db")},
        "ops": {"http_port": 0},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    bin_dir = _fake_bwrap(tmp_path / "bin")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    process = (
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            command,
            "--config",
            str(path),
            "--out",
            str(tmp_path / "out"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=tmp_path,
            env=env,
        )
        if command == "console"
        else await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            command,
            "--config",
            str(path),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=tmp_path,
            env=env,
        )
    )
    out, err = await asyncio.wait_for(process.communicate(b"what is 1 + 1?\n"), 60)
    stderr = err.decode()

    assert process.returncode == 2, stderr
    refusals = [line for line in stderr.splitlines() if line.startswith("threadbook: kernels.sandbox is 'auto' but")]
    assert len(refusals) == 1, stderr
    line = refusals[0]
    assert MASKED_PROC in line, "says what is missing"
    assert "or set kernels.sandbox: none to run kernels without a sandbox" in line
    assert (CONTAINER_FLAGS in line) == in_container(), "the runtime flags where they are the fix"
    assert "Traceback" not in stderr and not out.strip()
    if command == "console":  # through a pipe stderr carries warnings and errors only: just that line
        assert stderr.strip().splitlines() == [line]
    # No kernel ran, none was even planned: no fork server, no warm kernel, no launcher.
    assert "kernel isolation" not in stderr and "fork server" not in stderr
    assert not _kernels_of(tmp_path)
    workspaces = tmp_path / "ws"
    assert not workspaces.exists() or not any(workspaces.iterdir())


@pytest.mark.timeout(120)
async def test_an_unsandboxed_kernel_cannot_read_the_bots_environment_or_memory(layout: Layout) -> None:  # noqa: F811
    canary = f"tb-canary-{uuid.uuid4().hex}"
    async with ScriptedOpenAI() as llm:
        llm.script(
            tool_call(f"CANARY_REVERSED = {canary[::-1]!r}\n{SNOOP}"),
            lambda request: answer("REPORT " + request["messages"][-1]["content"]),
        )
        config = {
            "llm": {"base_url": llm.base_url, "api_key": "${OPENAI_API_KEY}", "model": "fake-model", "max_retries": 0},
            "slack": {"bot_token": "${SLACK_BOT_TOKEN:-}", "app_token": "${SLACK_APP_TOKEN:-}"},
            "kernels": {
                **kernel_config(layout.tmp),
                "workspace_root": str(layout.workspaces),
                "sandbox": "none",
                "fork_server": False,
                "python": str(layout.venv / "bin" / "python"),
            },
            "storage": {"path": str(layout.tmp / "tb.db")},
        }
        path = layout.root / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o644)
        env = _child_env(
            layout, OPENAI_API_KEY=canary, SLACK_BOT_TOKEN=canary, SLACK_APP_TOKEN=canary, DISCORD_BOT_TOKEN=canary
        )
        argv = [
            *_drop(),
            str(layout.venv / "bin" / "python"),
            "-m",
            "bot",
            "console",
            "--config",
            str(path),
            "--out",
            str(layout.tmp / "out"),
        ]
        child = subprocess.Popen(
            argv,
            cwd=layout.root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = await asyncio.to_thread(child.communicate, "look around\n", 90)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, err = child.communicate()
            pytest.fail(f"the bot did not answer:\n{err[-3000:]}")
    assert child.returncode == 0, err[-3000:]
    observed = out.split("REPORT ", 1)[1]  # the tool observation, echoed by the model
    report: dict[str, Any] = json.loads(next(line for line in observed.splitlines() if line.startswith("{")))

    # Same uid on both sides: only the bot's own hardening stands between them.
    assert report["uid"] == report["bot_uid"] == _host_uid()
    assert report["environ_hits"] == [], "a process's environment still holds the token"
    assert report["bot_environ"] == "PermissionError"
    assert report["bot_memory"] == "PermissionError"
    assert report["own_environ"] is False


async def test_a_run_root_someone_else_made_refuses_to_start(tmp_path: Path) -> None:
    """The kernels' run root sits where anyone may make a folder first (``/dev/shm``, ``/tmp``):
    one open to others is not used; the bot stops with one line naming the fix."""
    shared = tmp_path / "shared"
    planted = shared / f"threadbook-{os.getuid()}"
    planted.mkdir(parents=True)
    planted.chmod(0o777)
    config = {
        "llm": {"base_url": "http://127.0.0.1:9/v1", "api_key": "test-key", "model": "fake-model"},
        "slack": {"bot_token": "xoxb-test", "app_token": "xapp-test", "api_url": "http://127.0.0.1:9/api/"},
        "kernels": {**kernel_config(tmp_path), "run_root": str(shared)},
        "storage": {"path": str(tmp_path / "data" / "tb.db")},
        "ops": {"http_port": 0},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "run",
        "--config",
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    stderr = err.decode()

    assert process.returncode == 2, stderr
    refusals = [line for line in stderr.splitlines() if line.startswith("threadbook: the kernels' run folder")]
    assert len(refusals) == 1, stderr
    assert "remove it, or set kernels.run_root" in refusals[0]
    assert "Traceback" not in stderr and not out.strip()
    assert os.listdir(planted) == [] and not _kernels_of(tmp_path)  # nothing was put in it
