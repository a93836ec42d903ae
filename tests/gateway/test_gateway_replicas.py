"""Two replicas (in-process Cores) on one PostgreSQL with their kernels on one real Kernel
Gateway: when the replica that ran a thread dies, the other takes over the thread's kernel
itself, with what no snapshot can carry (an open file) still live; while that replica lives,
the other restores the thread's saved variables into a kernel of its own."""

from __future__ import annotations

import asyncio
import re
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from bot.app import Core
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call
from tests.gateway.conftest import KERNEL_NAME, KernelGateway

pytestmark = pytest.mark.timeout(120)


def echo_tool_output(request: dict[str, Any]) -> Any:
    """Answer with what the code printed after ``OUT``."""
    found = re.search(r"OUT (\S+)", str(request["messages"][-1]["content"]))
    return answer(found.group(1) if found else "nothing printed")


def settings_for(root: Path, name: str, llm: ScriptedOpenAI, gateway: KernelGateway, pg_url: str) -> Any:
    gateway_kernels = {
        "url": gateway.url,
        "auth_token": gateway.token,
        "kernel_name": KERNEL_NAME,
        "request_timeout_s": 30,
    }
    return make_settings(
        root / name,
        llm_url=llm.base_url,
        storage={"url": pg_url, "replica_timeout_s": 1},
        kernels={"gateway": gateway_kernels, "workspace_root": str(root / "workspaces")},
    )


async def test_a_dead_replicas_gateway_kernel_is_taken_over_live(
    tmp_path: Path, gateway: KernelGateway, pg_url: str
) -> None:
    async with ScriptedOpenAI() as llm, AsyncExitStack() as stack:
        a = await stack.enter_async_context(Core.open(settings_for(tmp_path, "a", llm, gateway, pg_url)))
        llm.script(
            tool_call("fh = open('notes.txt', 'w')\nfh.write('kept')\nx = 41\nprint('OUT', x)"), echo_tool_output
        )
        chat_a = MemoryChat(a.dispatcher)
        assert (await chat_a.say("open a file")).reply.text == "41"
        [kernel_id] = gateway.kernels()

        # Replica a dies: its heartbeat stops, and nothing of it touches the thread again
        # (its kernel stays on the gateway, as a killed process leaves it).
        assert a.store.replicas._heartbeat is not None
        a.store.replicas._heartbeat.cancel()
        b = await stack.enter_async_context(Core.open(settings_for(tmp_path, "b", llm, gateway, pg_url)))
        await asyncio.sleep(1.2)  # past storage.replica_timeout_s
        llm.script(tool_call("fh.write(' and more'); fh.flush(); print('OUT', fh.closed)"), echo_tool_output)
        reply = (await MemoryChat(b.dispatcher).say("use it")).reply.text
        assert reply == "False"  # the open file is still open: the kernel itself, not a restore
        assert gateway.kernels() == [kernel_id]  # b drives a's kernel; no second one was started
        assert b.pool.get(str(chat_a.key())).remote_id == kernel_id  # type: ignore[union-attr]
        await b.pool.shutdown_all()
        assert gateway.kernels() == []
        a.pool._sessions.clear()  # a is dead: it must not stop the kernel b took over


async def test_a_live_replicas_kernel_is_left_alone_and_the_snapshot_restored(
    tmp_path: Path, gateway: KernelGateway, pg_url: str
) -> None:
    async with ScriptedOpenAI() as llm, AsyncExitStack() as stack:
        a = await stack.enter_async_context(Core.open(settings_for(tmp_path, "a", llm, gateway, pg_url)))
        b = await stack.enter_async_context(Core.open(settings_for(tmp_path, "b", llm, gateway, pg_url)))
        llm.script(tool_call("x = 41\nprint('OUT', x)"), echo_tool_output)
        assert (await MemoryChat(a.dispatcher).say("set x")).reply.text == "41"
        llm.script(tool_call("print('OUT', x + 1)"), echo_tool_output)
        assert (await MemoryChat(b.dispatcher).say("use x")).reply.text == "42"  # restored in b's own kernel
        assert len(gateway.kernels()) == 2  # a still holds its (now out-of-date) kernel
        llm.script(tool_call("x = x + 100\nprint('OUT', x)"), echo_tool_output)
        assert (await MemoryChat(a.dispatcher).say("back on a")).reply.text == "141"  # a dropped its stale kernel
    assert gateway.kernels() == []
