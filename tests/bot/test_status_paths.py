"""`status` tells chat users how kernels are isolated without naming a host path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot.app import Core
from tests.conftest import KERNEL_PYTHON, make_settings
from tests.fakes.memory import MemoryChat
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call
from tests.security.conftest import SKIP_REASON

#: Something that looks like an absolute path: a slash starting a word, followed by a name.
ABSOLUTE_PATH = re.compile(r"(?<![\w/.:])/[\w.-]")


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
async def test_status_names_the_sandbox_and_no_host_path(tmp_path: Path, llm: ScriptedOpenAI, sandbox: str) -> None:
    if sandbox == "bwrap" and SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    settings = make_settings(
        tmp_path, llm_url=llm.base_url, kernels={"sandbox": sandbox, "fork_server": sandbox == "bwrap"}
    )
    async with Core.open(settings) as core:
        chat = MemoryChat(core.dispatcher)
        llm.script(tool_call("x = 1"), answer("done"))
        await chat.say("start a kernel")
        status = (await chat.say("status", mentioned=False)).reply.text

    assert "**Kernel:** " in status and "**Isolation:** " in status
    if sandbox == "none":
        assert "**Sandbox:** ⚠️ kernels run WITHOUT a sandbox (kernels.sandbox: none)" in status
    else:
        assert "**Sandbox:** bubblewrap: own namespaces and file system" in status
    # No host path: not the workspace root, the interpreter, a cgroup folder, or any other.
    for path in (tmp_path, KERNEL_PYTHON, Path("/sys/fs/cgroup")):
        assert str(path) not in status
    assert "threadbook-bot" not in status and "/threadbook" not in status
    assert not ABSOLUTE_PATH.findall(status), status
