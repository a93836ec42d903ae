"""One cell in a thread's kernel process and what follows from its end.

The :class:`~kernels.session.execution.Execution` runs the cell; here its end is settled: a
kernel that died is lost (the result says how), a stuck one is replaced, processes the cell
left running are stopped unless the channel allows them, the snapshot hears whether the
kernel holds anything worth saving, and the files the cell changed are listed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kernels.host.workspace import FileStamps, changed_files
from kernels.seam.result import ExecutionResult, Outcome
from kernels.session.execution import Execution, joined
from kernels.session.notices import THAW_FAILED_NOTICE, death_notice, exit_text, fresh_kernel_notice
from kernels.session.process import KernelProcess
from kernels.session.snapshots import HOLDS_STATE_EXPRESSION

#: The name of the cell's user expression that says whether a save would write anything.
_HOLDS_STATE = "threadbook_holds_state"


class Cell:
    """One cell, run in ``kernel``'s current (running) kernel."""

    def __init__(self, kernel: KernelProcess, timeout: float, on_output: Callable[[str, str], None] | None) -> None:
        """``on_output(name, text)`` hears each stream message as it arrives."""
        handle = kernel.handle
        assert handle is not None
        self._kernel = kernel
        self._handle = handle
        self.execution = Execution(
            handle,
            kernel.workspace,
            kernel.settings,
            timeout,
            key=kernel.key,
            on_output=on_output,
            thaw=kernel.thaw,
            frozen=kernel.frozen_by_probe,
            # Asked until the kernel says it holds something: then it almost always goes on
            # holding something, and the question costs each cell ~0.5 ms.
            expressions={_HOLDS_STATE: HOLDS_STATE_EXPRESSION} if kernel.ask_holds_state else None,
        )

    async def stop(self) -> None:
        """The Stop button (see :meth:`Execution.stop`)."""
        await self.execution.stop()

    async def run(self, code: str) -> ExecutionResult:
        """Run ``code``; its result, with what its end meant for the kernel."""
        kernel, handle, execution = self._kernel, self._handle, self.execution
        await execution.start(code)
        kernel.executions += 1
        kernel.snapshots.unsaved = True
        result = await execution.finish()
        holds_state = execution.expression_answers.get(_HOLDS_STATE)
        kernel.snapshots.ran(holds_state)
        kernel.ask_holds_state = kernel.ask_holds_state and holds_state != "True"
        if result.outcome is Outcome.DIED and kernel.handle is not handle:  # lost: it could not be thawed
            result.notice = joined(THAW_FAILED_NOTICE, result.notice)
            kernel.state = "dead"
            kernel.notices.lost_state = True
        elif result.outcome is Outcome.DIED:
            quota_notice = execution.watchdog.quota_notice
            result.notice = joined(quota_notice or await death_notice(handle, kernel.settings.memory_mb), result.notice)
            # The next result (in a fresh kernel) says that variables were lost too.
            await kernel.lose(
                "it wrote past the workspace quota" if quota_notice else exit_text(await handle.exit_code())
            )
        elif execution.stuck_notice is not None:
            await kernel.replace(execution.watchdog.reason)
            result.kernel_restarted = True
            restarted = fresh_kernel_notice(kernel.snapshots.restored)
            result.notice = joined(f"{execution.stuck_notice} {restarted}", result.notice)
        elif not kernel.options.background_processes:
            result.notice = joined(result.notice, await kernel.stop_leftovers(handle))
        after = await asyncio.to_thread(self._stamps_and_touch)
        result.changed_files = changed_files(execution.before, after)
        result.duration_s = time.monotonic() - execution.started
        return result

    def _stamps_and_touch(self) -> FileStamps:
        self._kernel.workspace.touch()
        return self._kernel.workspace.stamps()
