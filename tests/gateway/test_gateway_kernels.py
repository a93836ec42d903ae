"""Every kernel through a real Jupyter Kernel Gateway: the session keeps its semantics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from bot.app import Core
from bot.turn import KERNEL_SERVICE_NOTICE
from kernels import KernelPool, KernelUnavailableError, Outcome, Reaper, build_pool
from kernels.gateway.launcher import GatewayLauncher
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call
from tests.gateway.conftest import KERNEL_NAME, KernelGateway, free_port
from tests.kernels.conftest import kernel_settings

PNG = b"\x89PNG\r\n\x1a\n"


def gateway_settings(root: Path, gateway: KernelGateway, **overrides: object) -> dict[str, object]:
    return {
        "gateway": {
            "url": gateway.url,
            "auth_token": gateway.token,
            "kernel_name": KERNEL_NAME,
            "request_timeout_s": 30,
        },
        "idle_timeout_s": 0.2,
        **overrides,
    }


@pytest_asyncio.fixture
async def pool(tmp_path: Path, gateway: KernelGateway) -> AsyncIterator[KernelPool]:
    kernel_pool = build_pool(kernel_settings(tmp_path, **gateway_settings(tmp_path, gateway)))
    assert isinstance(kernel_pool.launcher, GatewayLauncher)
    await kernel_pool.start()
    yield kernel_pool
    await kernel_pool.shutdown_all()


async def test_state_plots_and_files_through_the_gateway(pool: KernelPool, gateway: KernelGateway) -> None:
    session = await pool.get_or_start("g:a")
    assert (await session.execute("x = 20")).ok
    assert (await session.execute("x + 1")).result == "21"
    plot = await session.execute("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    assert plot.ok and plot.chat_images and plot.chat_images[0][0].startswith(PNG)
    wrote = await session.execute("open('out.csv', 'w').write('a,b\\n1,2\\n')")
    assert wrote.changed_files == ["out.csv"]
    with session.workspace.open_file("out.csv") as pinned:
        assert pinned.read() == b"a,b\n1,2\n"
    assert await session.evaluate("x * 2", 10) == "40"
    assert len(gateway.kernels()) == 1 and "gateway" in pool.launcher.isolation


async def test_timeout_interrupts_and_the_next_execution_works(pool: KernelPool) -> None:
    session = await pool.get_or_start("g:slow")
    await session.execute("kept = 1")
    slow = await session.execute("import time\ntime.sleep(30)", timeout=1.5)
    assert slow.outcome is Outcome.TIMEOUT_INTERRUPTED and "variables are kept" in (slow.notice or "")
    assert (await session.execute("kept + 1")).result == "2"


async def test_a_dying_kernel_is_reported_and_a_fresh_one_follows(pool: KernelPool, gateway: KernelGateway) -> None:
    session = await pool.get_or_start("g:dies")
    await session.execute("before = 5")
    died = await session.execute("import os\nos._exit(1)")
    assert died.outcome is Outcome.DIED and "The kernel died" in (died.notice or "")
    after = await session.execute("1 + 1")
    assert after.result == "2" and after.kernel_restarted
    assert len(gateway.kernels()) == 1  # the dead one (restarted by the gateway) was deleted


async def test_two_threads_are_isolated(pool: KernelPool) -> None:
    one, two = await asyncio.gather(pool.get_or_start("g:one"), pool.get_or_start("g:two"))
    await asyncio.gather(one.execute("secret = 'one'\nopen('mine.txt', 'w').write('one')"), two.execute("pass"))
    seen = await two.execute("import os\nprint('secret' in dir(), os.path.exists('mine.txt'), os.getcwd())")
    assert seen.stdout.split()[:2] == ["False", "False"] and seen.stdout.split()[2] == str(two.workspace.path)


async def test_the_reaper_leaves_the_gateway_without_kernels(pool: KernelPool, gateway: KernelGateway) -> None:
    session = await pool.get_or_start("g:reap")
    await session.execute("value = [1, 2, 3]")
    await asyncio.sleep(0.3)
    assert await Reaper(pool, pool.settings).cull_kernels() == ["g:reap"]
    assert gateway.kernels() == []
    again = await pool.get_or_start("g:reap")  # and its variables come back from the snapshot
    assert (await again.execute("value")).result == "[1, 2, 3]"


async def test_a_stopped_gateway_gives_a_clear_error_and_a_restarted_one_works(tmp_path: Path) -> None:
    server = KernelGateway(tmp_path / "own")
    server.start()
    pool = build_pool(kernel_settings(tmp_path, **gateway_settings(tmp_path, server, snapshot=False)))
    try:
        assert (await (await pool.get_or_start("g:up")).execute("1")).result == "1"
        server.stop()
        with pytest.raises(KernelUnavailableError, match="did not answer"):
            await pool.get_or_start("g:down")
        lost = await pool.get("g:up").execute("2")  # type: ignore[union-attr]
        assert lost.outcome is Outcome.DIED or not lost.ok
        server.start()
        assert (await (await pool.get_or_start("g:back")).execute("3")).result == "3"
    finally:
        await pool.shutdown_all()
        server.stop()


async def test_the_thread_hears_one_sentence_when_the_gateway_is_down(tmp_path: Path, gateway: KernelGateway) -> None:
    """A whole turn through the bot against a gateway that does not answer: one clear
    sentence, nothing asked of the model; a thread then works once it is back."""
    async with ScriptedOpenAI() as llm:
        down = {"url": f"http://127.0.0.1:{free_port()}", "kernel_name": KERNEL_NAME, "request_timeout_s": 5}
        settings = make_settings(tmp_path, llm_url=llm.base_url, kernels={"gateway": down})
        async with Core.open(settings) as core:
            out = await MemoryChat(core.dispatcher).say("compute something")
            assert out.reply.text == KERNEL_SERVICE_NOTICE and llm.requests == []

        up = {"url": gateway.url, "auth_token": gateway.token, "kernel_name": KERNEL_NAME}
        settings = make_settings(tmp_path, llm_url=llm.base_url, kernels={"gateway": up})
        async with Core.open(settings) as core:
            llm.script(tool_call("print(6 * 7)"), lambda r: answer(r["messages"][-1]["content"]))
            assert "42" in (await MemoryChat(core.dispatcher).say("compute something")).reply.text
        assert gateway.kernels() == []


async def test_warm_gateway_kernels_are_handed_to_new_threads(tmp_path: Path, gateway: KernelGateway) -> None:
    pool = build_pool(kernel_settings(tmp_path, **gateway_settings(tmp_path, gateway, warm_pool=1, max_kernels=2)))
    await pool.start()
    try:
        assert pool.warm is not None
        await pool.warm.wait_ready(timeout=60)
        session = await pool.get_or_start("g:warm")
        result = await session.execute("import os\nopen('here.txt', 'w').write('x')\nprint(os.getcwd())")
        assert result.stdout.strip() == str(session.workspace.path) and result.changed_files == ["here.txt"]
        await pool.warm.wait_ready(timeout=60)  # refilled: the thread's kernel and a warm one
        assert len(gateway.kernels()) == 2
    finally:
        await pool.shutdown_all()
    assert gateway.kernels() == []


async def test_an_oversized_output_is_refused_and_the_kernel_goes_on(pool: KernelPool) -> None:
    session = await pool.get_or_start("g:big")
    await session.execute("kept = 3")
    big = await session.execute("print('x' * 20_000_000)")
    assert big.outcome is not Outcome.DIED and len(big.stdout) < 1_000_000
    assert (await session.execute("kept")).result == "3"


async def test_max_kernels_evicts_gateway_kernels(tmp_path: Path, gateway: KernelGateway) -> None:
    pool = build_pool(kernel_settings(tmp_path, **gateway_settings(tmp_path, gateway, max_kernels=1)))
    try:
        first = await pool.get_or_start("g:first")
        await first.execute("mine = 'first'")
        second = await pool.get_or_start("g:second")  # evicts first: its kernel leaves the gateway
        assert pool.get("g:first") is None and len(gateway.kernels()) == 1
        assert (await second.execute("'mine' in dir()")).result == "False"
        back = await pool.get_or_start("g:first")  # evicts second; first's variables are restored
        assert (await back.execute("mine")).result == "'first'" and len(gateway.kernels()) == 1
    finally:
        await pool.shutdown_all()
