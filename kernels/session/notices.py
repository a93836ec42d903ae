"""What a thread is told about its kernel: a kernel that stopped unasked, variables lost with it.

:class:`Notices` is the value a :class:`~kernels.session.session.KernelSession` keeps of it (told
once each); the rest words a kernel's end for a result or the thread.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from kernels.seam.plan import KernelHandle
from kernels.session.snapshots import RestoreReport

LOST_STATE_NOTICE = "The kernel was restarted: variables from before were lost; files in the workspace remain."
THAW_FAILED_NOTICE = (
    "The kernel could not be resumed for this execution, so it was stopped. Variables were lost; files in "
    "the workspace remain. The next execution starts a fresh kernel."
)
LEFTOVERS_NOTICE = "{count} background process(es) left by this code were stopped."
#: What the thread is told, once, when its kernel stopped without being asked to (``{why}``).
KERNEL_LOST_THREAD_NOTICE = (
    "⚠️ This thread's kernel stopped ({why}): variables since the last save are lost; files in the "
    "workspace are kept, and a fresh kernel takes over."
)


@dataclass
class Notices:
    """What the thread has not been told yet about its kernels."""

    #: Why a kernel of the thread stopped unasked, until the thread is told.
    died: str | None = None
    #: A kernel of the thread that ran code is gone: the next result says its variables were lost.
    lost_state: bool = False

    def death(self, why: str, *, held_state: bool) -> None:
        """A kernel stopped unasked: the thread hears ``why`` if it held the thread's variables."""
        if held_state:
            self.died = why

    def take_lost_state(self) -> bool:
        """Whether the next result must say that variables were lost (each loss once)."""
        lost, self.lost_state = self.lost_state, False
        return lost

    def take_thread(self, failed_save: str | None) -> list[str]:
        """The sentences for the thread (a kernel that stopped unasked, then ``failed_save``),
        each once."""
        notices: list[str] = []
        if self.died is not None:
            notices.append(KERNEL_LOST_THREAD_NOTICE.format(why=self.died))
            self.died = None
        if failed_save is not None:
            notices.append(failed_save)
        return notices


def fresh_kernel_notice(restored: RestoreReport | None) -> str:
    """What a result says when it ran in a kernel that replaced one with variables."""
    if restored is None:
        return LOST_STATE_NOTICE
    return f"The kernel was restarted. {restored.notice()}"


async def death_notice(handle: KernelHandle, memory_mb: int) -> str:
    """What a result says of ``handle``'s kernel, which died during its execution."""
    how = exit_text(await handle.exit_code())
    if await handle.out_of_memory():
        how = f"{how}, stopped by its memory limit ({memory_mb} MiB for all its processes together)"
    tail = [line for line in (await handle.log_tail()).splitlines() if "Fatal Python error" in line]
    detail = f" ({tail[-1].strip()})" if tail else ""
    return (
        f"The kernel died during this execution: {how}{detail}. Variables were lost; files in "
        "the workspace remain. The next execution starts a fresh kernel."
    )


def exit_text(code: int | None) -> str:
    """How a kernel process that exited with ``code`` ended, in words."""
    if code is None:
        return "the process ended"
    if 128 < code < 128 + signal.NSIG:  # a wrapper (bubblewrap, a shell) passes a signal on as 128 + its number
        code = 128 - code
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (possibly out of memory)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit code {code}"
