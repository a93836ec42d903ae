"""KernelSession against real ipykernel processes."""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path

import psutil
import pytest
from PIL import Image

from kernels import KernelOptions, KernelPool, Outcome

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_state_persists_and_outputs_are_captured(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:persist")
    first = await session.execute("x = 41\nprint('out')\nimport sys; print('err', file=sys.stderr)\nx + 1")
    assert first.ok and first.result == "42" and first.stdout == "out\n" and first.stderr == "err\n"
    assert first.execution_count == 1 and first.duration_s > 0 and not first.kernel_restarted
    again = await session.execute("x")
    assert again.result == "41" and session.executions == 2


async def test_threads_are_isolated(pool: KernelPool) -> None:
    one = await pool.get_or_start("t:iso-1")
    two = await pool.get_or_start("t:iso-2")
    await one.execute("secret = 1\nimport os\nos.chdir('/tmp')")
    assert (await two.execute("secret")).error.ename == "NameError"
    assert (await two.execute("import os; os.getcwd()")).result == repr(str(two.workspace.path))
    assert one.workspace.path != two.workspace.path


async def test_error_and_rich_displays(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:rich")
    err = await session.execute("def f():\n    raise ValueError('bad thing')\nf()")
    assert err.outcome is Outcome.ERROR and err.error.ename == "ValueError" and err.error.evalue == "bad thing"
    assert "\x1b[" not in err.error.traceback and "bad thing" in err.error.traceback
    shown = await session.execute(
        "from IPython.display import display, HTML, Markdown, JSON, SVG\n"
        "display(HTML('<b>hi</b>')); display(Markdown('# T'))\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>')); display({'a': 1}, raw=False)\n"
        "import pandas as pd\npd.DataFrame({'a': [1, 2]})"
    )
    mimes = {mime for out in shown.displays for mime in out.data}
    assert {"text/html", "text/markdown", "image/svg+xml"} <= mimes
    assert "text/html" in shown.result_data.data and "a" in shown.result


async def test_plot_comes_back_as_png_and_savefig_as_changed_file(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:plot")
    shown = await session.execute("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    assert len(shown.images) == 1
    assert Image.open(io.BytesIO(shown.images[0])).format == "PNG"
    saved = await session.execute("plt.figure(); plt.bar([1], [2]); plt.savefig('chart.png'); plt.close('all')")
    assert saved.changed_files == ["chart.png"] and saved.images == []
    written = await session.execute("open('notes.txt', 'w').write('x')")
    assert written.changed_files == ["notes.txt"]


async def test_secrets_do_not_reach_the_kernel(
    pool: KernelPool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("DISCORD_TOKEN", "dc-test")
    # started after the variables were set
    session = await pool.get_or_start("t:env", KernelOptions(data_dir=tmp_path))
    got = await session.execute("import os; sorted(os.environ)")
    names = eval(got.result)  # a list of str repr'd by IPython
    assert not {"SLACK_BOT_TOKEN", "OPENAI_API_KEY", "DISCORD_TOKEN"} & set(names)
    assert "xoxb" not in got.result
    home = await session.execute("import os; os.environ['HOME'], os.environ['MPLBACKEND']")
    assert str(session.workspace.path) in home.result and "matplotlib_inline" in home.result
    data_dir = await session.execute("os.environ['THREADBOOK_DATA_DIR']")
    assert data_dir.result == repr(str(tmp_path))


async def test_timeout_interrupts_and_session_stays_usable(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:timeout")
    await session.execute("kept = 'yes'")
    result = await session.execute("while True: pass", timeout=0.5)
    assert result.outcome is Outcome.TIMEOUT_INTERRUPTED and not result.kernel_restarted
    assert "timed out" in result.notice
    assert (await session.execute("kept")).result == "'yes'"


async def test_timeout_restarts_a_kernel_that_ignores_interrupts(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:stuck")
    await session.execute("open('kept.txt', 'w').write('1'); v = 1")
    result = await session.execute(
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", timeout=0.5
    )
    assert result.outcome is Outcome.TIMEOUT_RESTARTED and result.kernel_restarted
    assert "variables" in result.notice
    after = await session.execute("import os; v if 'v' in dir() else os.listdir('.')")
    assert after.ok and "kept.txt" in after.result and not after.kernel_restarted


async def test_stop_button_interrupts(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:stop")
    task = asyncio.ensure_future(session.execute("import time\nprint('started', flush=True)\ntime.sleep(30)"))
    while session.state != "busy":
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    await session.interrupt()
    result = await asyncio.wait_for(task, 5)
    assert result.outcome is Outcome.INTERRUPTED and result.error.ename == "KeyboardInterrupt"
    assert (await session.execute("1+1")).result == "2"


async def test_stop_pressed_as_the_cell_starts_keeps_the_kernel(pool: KernelPool) -> None:
    """ipykernel ignores SIGINT until a cell runs: an interrupt that arrives just before must
    not end in a restart (variables lost) after the grace period."""
    session = await pool.get_or_start("t:early-stop")
    await session.execute("keep = 41")
    for delay in (0, 0.001, 0.005, 0, 0.001):
        task = asyncio.ensure_future(session.execute("import time\nfor _ in range(300): time.sleep(0.1)"))
        await asyncio.sleep(delay)
        await session.interrupt()
        result = await asyncio.wait_for(task, 10)
        assert result.outcome is Outcome.INTERRUPTED and not result.kernel_restarted, (delay, result.notice)
        after = await session.execute("print(keep + 1)")
        assert after.stdout == "42\n", (delay, after)


async def test_stop_during_a_pre_execute_callback_stops_the_cell(pool: KernelPool) -> None:
    """IPython swallows an interrupt that lands in a ``pre_execute`` callback (it prints "Error in
    callback" and runs the cell): the kernel keeps it for the cell, which stops at once instead
    of running on until the kernel is restarted. A slow callback holds the window open."""
    session = await pool.get_or_start("t:stop-in-callback")
    await session.execute(
        "keep = 41\nimport time\nget_ipython().events.register('pre_execute', lambda: time.sleep(0.5))"
    )
    task = asyncio.ensure_future(session.execute("for _ in range(300): time.sleep(0.1)"))
    while session.state != "busy":
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the cell is announced; the callback sleeps
    await session.interrupt()
    result = await asyncio.wait_for(task, 10)
    assert result.outcome is Outcome.INTERRUPTED and not result.kernel_restarted, result.notice
    assert result.error is not None and result.error.ename == "KeyboardInterrupt"
    assert result.duration_s < 2 and "Error in callback" not in result.stdout
    after = await session.execute("print(keep + 1)")
    assert after.stdout == "42\n", after


@pytest.mark.parametrize(
    ("code", "how"),
    [("import os; os._exit(1)", "exit code 1"), ("import ctypes; ctypes.string_at(0)", "SIGSEGV")],
)
async def test_death_is_reported_and_next_execute_gets_a_fresh_kernel(pool: KernelPool, code: str, how: str) -> None:
    session = await pool.get_or_start(f"t:death-{how}")
    await session.execute("lost = 1\nopen('stays.txt', 'w').write('1')")
    died = await session.execute(code)
    assert died.outcome is Outcome.DIED and how in died.notice and "Variables were lost" in died.notice
    assert not await session.is_alive()
    fresh = await session.execute("import os\nprint(os.path.exists('stays.txt'))\nlost")
    assert fresh.kernel_restarted and "variables" in fresh.notice and "files" in fresh.notice
    assert fresh.stdout == "True\n" and fresh.error.ename == "NameError"
    assert session.executions == 1
    assert not (await session.execute("1")).kernel_restarted


async def test_output_is_capped_head_and_tail(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:flood")
    result = await session.execute("for i in range(200000): print(i)", timeout=30)
    assert result.truncated and result.ok
    assert result.stdout.startswith("0\n1\n2\n") and result.stdout.endswith("199999\n")
    assert "bytes truncated]" in result.stdout and len(result.stdout) < 10_200


async def test_memory_bomb_and_disk_filler_end_in_clear_errors(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:limits")
    bomb = await session.execute("x = bytearray(8 * 1024**3)")  # memory_mb is 2048
    assert bomb.error is not None and bomb.error.ename == "MemoryError"
    filler = await session.execute(
        "f = open('big.bin', 'wb')\nchunk = b'0' * 2**20\nfor _ in range(100): f.write(chunk); f.flush()"
    )
    assert filler.error is not None and "File too large" in filler.error.evalue  # EFBIG at max_file_mb (20)
    os.unlink(session.workspace.path / "big.bin")
    assert (await session.execute("1+1")).result == "2"


async def test_forked_children_do_not_outlive_the_kernel(pool: KernelPool) -> None:
    # As root RLIMIT_NPROC is ignored, so the bound here is the timeout plus killing the
    # whole process tree (children that left the process group included).
    session = await pool.get_or_start("t:forks")
    result = await session.execute(
        "import os, signal, time\npids = []\n"
        "for i in range(30):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "        if i % 2: os.setsid()\n"
        "        time.sleep(60); os._exit(0)\n"
        "    pids.append(pid)\n"
        "print(pids)\nwhile True: pass",
        timeout=1,
    )
    pids = eval(result.stdout.strip())
    assert len(pids) == 30 and result.outcome is Outcome.TIMEOUT_INTERRUPTED
    await session.restart()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert session.executions == 0 and (await session.execute("1+1")).result == "2"


async def test_memory_bytes_reports_pss(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:persist")
    memory = await session.memory_bytes()
    assert memory is not None and 10 * 2**20 < memory < 500 * 2**20
