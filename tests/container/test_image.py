"""The shipped image, built from the working tree, answers a console turn with its kernel
sandboxed when run with the flags docs/security.md documents, and refuses to run kernels with
a runtime's default flags; in neither case does a secret of the bot reach a kernel or the output.

The console runs in pipe mode inside the container; the scripted OpenAI server runs on the
host's 127.0.0.1, which the container shares (``--network=host``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.container.podman import SANDBOX_FLAGS, Podman
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

#: Building the stand-in and the image (about 1.5 min on 2 cores) counts against the first test.
pytestmark = pytest.mark.timeout(900)

#: In the bot's environment (so in /proc/1/environ, tini's, and the bot's own) ...
ENV_CANARY = "xoxb-canary-from-the-environment-5f1c"
#: ... and in its config file only.
CONFIG_CANARY = "sk-canary-from-the-config-file-93ad"

#: What a prompt-injected cell would try: every visible process's environment, the bot's pid
#: in the container (tini is 1), the config; then the work the user asked for, with pandas.
PROBE = """
import glob, os
import pandas as pd
leaks, refused = [], 0
for path in sorted(set(glob.glob('/proc/[0-9]*/environ') + ['/proc/1/environ', '/proc/2/environ', '/app/config.yaml'])):
    try:
        data = open(path, 'rb').read()
    except OSError:
        refused += 1
        continue
    if b'canary-from' in data:
        leaks.append(path)
status = open('/proc/self/status').read()
print('uid', os.getuid(), 'cwd', os.getcwd(), 'pids', len(glob.glob('/proc/[0-9]*')))
print('nonewprivs', 'NoNewPrivs:\\t1' in status, 'capeff0', 'CapEff:\\t0000000000000000' in status)
print('config visible', os.path.exists('/app/config.yaml'), 'forked', os.path.isdir('/.threadbook-host'))
print('leaks', leaks)
print('total', pd.DataFrame({'x': [1, 2, 3]})['x'].sum())
"""


def write_config(folder: Path, llm_url: str) -> Path:
    config: dict[str, Any] = {
        "llm": {"base_url": llm_url, "api_key": CONFIG_CANARY, "model": "fake-model", "max_retries": 0},
        "kernels": {
            "sandbox": "auto",
            "fork_server": True,
            "warm_pool": 0,
            "memory_mb": 1024,
            "workspace_root": "data/workspaces",
        },
        "storage": {"path": "data/threadbook.db"},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)  # the image's bot is uid 10001
    return path


def console(image: str, config: Path, *flags: str) -> list[str]:
    """``podman run`` arguments for one console turn in ``image``."""
    return [
        "run",
        "--rm",
        "-i",
        "--network=host",
        *flags,
        "-e",
        f"SLACK_BOT_TOKEN={ENV_CANARY}",
        "-v",
        f"{config}:/app/config.yaml:ro",
        image,
        "python",
        "-m",
        "bot",
        "console",
        "--config",
        "/app/config.yaml",
        "--out",
        "/app/data/out",
    ]


def tool_results(llm: ScriptedOpenAI) -> list[str]:
    return [str(m.get("content")) for r in llm.requests for m in r["messages"] if m.get("role") == "tool"]


async def test_documented_flags_sandbox_the_kernel_and_it_answers(podman: Podman, image: str, tmp_path: Path) -> None:
    async with ScriptedOpenAI(api_key=CONFIG_CANARY) as llm:
        llm.script(tool_call(PROBE), lambda r: answer("The kernel said: " + r["messages"][-1]["content"]))
        started = time.monotonic()
        code, out, err = await podman.run_async(
            *console(image, write_config(tmp_path, llm.base_url), *SANDBOX_FLAGS), stdin="what is the total of x?\n"
        )
        print(f"\nconsole turn in the image (documented flags): {time.monotonic() - started:.1f} s")
    assert code == 0, err[-3000:]
    seen = "\n".join(tool_results(llm))
    assert "total 6" in out and "total 6" in seen, (out, err[-2000:])
    # Sandboxed: uid 1000 of its own user namespace, no capabilities, its own pid namespace
    # (the bot, tini and the fork server are not in it), cwd the thread's workspace.
    assert "uid 1000 cwd /workspace" in seen
    assert "nonewprivs True capeff0 True" in seen
    assert int(seen.split("pids ")[1].split()[0]) <= 4
    assert "config visible False" in seen
    # A new thread's kernel came from the fork server, running as the image's non-root user.
    assert "forked True" in seen
    assert "leaks []" in seen
    for canary in (ENV_CANARY, CONFIG_CANARY):
        assert canary not in out and canary not in err and canary not in seen


async def test_runtime_defaults_refuse_to_run_kernels_and_leak_nothing(
    podman: Podman, image: str, tmp_path: Path
) -> None:
    async with ScriptedOpenAI(api_key=CONFIG_CANARY) as llm:
        llm.script(tool_call(PROBE), lambda r: answer("The kernel said: " + r["messages"][-1]["content"]))
        code, out, err = await podman.run_async(
            *console(image, write_config(tmp_path, llm.base_url)), stdin="what is the total of x?\n"
        )
    assert code != 0, f"the bot ran kernels without a sandbox: {out[-2000:]}"
    assert tool_results(llm) == [], "a kernel ran code"
    for canary in (ENV_CANARY, CONFIG_CANARY):
        assert canary not in out and canary not in err
    # One line that says what is missing and which flags fix it; no traceback.
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and "Traceback" not in err, err[-3000:]
    assert "sandbox" in lines[-1] and "systempaths=unconfined" in lines[-1], lines[-1]
