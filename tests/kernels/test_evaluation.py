"""The bot's own questions to a thread's kernel (``KernelSession.evaluate``, the snapshots'
asks) are watched by the same watchdog as a cell: here, a question whose answer writes past
the workspace quota loses the kernel, and the thread hears why, once."""

from __future__ import annotations

from pathlib import Path

from kernels import build_pool
from tests.kernels.conftest import kernel_settings

#: Writes 4 MiB into a 1 MiB workspace, then keeps the answer back long enough for the watchdog to look.
OVER_QUOTA = "[open(f'f{i}.bin', 'wb').write(b'0' * 2**20) for i in range(4)] and __import__('time').sleep(3)"


async def test_an_evaluation_that_writes_past_the_quota_loses_the_kernel_and_the_thread_hears_why(
    tmp_path: Path,
) -> None:
    pool = build_pool(kernel_settings(tmp_path, workspace_quota_mb=1, snapshot=False))
    try:
        session = await pool.get_or_start("t:eval-quota")
        assert (await session.execute("kept = 1")).ok
        assert await session.evaluate(OVER_QUOTA, 20) is None
        assert session.state == "dead" and session.pid is None
        told = session.take_thread_notices()
        assert len(told) == 1 and "wrote past the workspace quota while the bot asked it something" in told[0]
        after = await session.execute("1 + 1")
        assert (
            after.result == "2" and after.kernel_restarted and "variables from before were lost" in (after.notice or "")
        )
        assert session.take_thread_notices() == []
    finally:
        await pool.shutdown_all()
