"""What talking to any kernel shares, whoever started it: the wire's size limit, the one way a
shell reply is waited for, readiness, silent set-up code, and what every kernel runs first.

Every launcher's handle answers :meth:`~kernels.seam.plan.KernelHandle.reply` with
:func:`shell_reply`, and every start waits with :func:`wait_ready`; local and gateway kernels
alike.
"""

from __future__ import annotations

import time
from queue import Empty
from typing import Any

from kernels.seam.plan import KernelChannels, KernelHandle
from kernels.seam.result import KernelStartError

#: Default budget for rich outputs (images, HTML) of one execution.
MAX_DISPLAY_BYTES = 20 * 1024 * 1024
#: One kernel message larger than this is refused by the ZMQ socket (``MAXMSGSIZE``) or the
#: gateway's websocket and never decoded: half the display budget, base64-encoded, plus room
#: for the JSON around it.
MAX_MESSAGE_BYTES = (MAX_DISPLAY_BYTES // 2) * 4 // 3 + 1024 * 1024
#: How long a kernel may take to start and answer.
START_TIMEOUT_S = 60.0
#: Run first in every kernel, spawned, forked or on a gateway: the kernel-side set-up (``kernels/runtime``).
KERNEL_SETUP = "__import__('threadbook_kernel').setup()"
_REPLY_TIMEOUT_S = 30.0


async def shell_reply(client: KernelChannels, msg_id: str, timeout: float) -> dict[str, Any] | None:
    """The shell reply to request ``msg_id``, waiting at most ``timeout`` seconds (0: only
    what has arrived already); None when it did not come. Replies to older requests found on
    the way are dropped. Every handle's ``reply`` is this."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg: dict[str, Any] = await client.get_shell_msg(timeout=max(deadline - time.monotonic(), 0))
        except Empty:
            return None
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


async def wait_ready(handle: KernelHandle, timeout: float) -> None:
    """Ready = our kernel_info answered on shell and one iopub message seen (iopub subscribed)."""
    client = handle.client
    deadline = time.monotonic() + timeout
    msg_id = client.kernel_info()
    replied = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise KernelStartError(f"kernel did not answer within {timeout:.0f} s")
        if not await handle.is_alive():
            raise KernelStartError(f"kernel process exited during start (exit code {await handle.exit_code()})")
        if not replied:
            replied = await handle.reply(msg_id, min(0.25, remaining)) is not None
            continue
        try:
            await client.get_iopub_msg(timeout=min(0.25, remaining))
            return
        except Empty:
            client.kernel_info()  # provoke iopub traffic until the subscription is live


async def run_silently(handle: KernelHandle, code: str, timeout: float = _REPLY_TIMEOUT_S) -> None:
    """Run ``code`` in the kernel without history or output and wait for its reply.

    Silent executions do not advance the execution count, so the thread's first cell is
    still ``[1]``. Raises :class:`KernelStartError` when the code fails or times out.
    """
    msg_id = handle.client.execute(code, silent=True, store_history=False, allow_stdin=False)
    reply = await handle.reply(msg_id, timeout)
    if reply is None:
        raise KernelStartError(f"warm-up did not answer within {timeout:g} s")
    content = reply["content"]
    if content.get("status") != "ok":
        raise KernelStartError(f"warm-up failed: {content.get('ename')}: {content.get('evalue')}")


def warm_up_code(preload: tuple[str, ...]) -> str:
    """What a kernel runs before a thread gets it: ``preload`` imported, inline plots ready,
    the first cell's first-time work done (``threadbook_kernel.prime``)."""
    lines = [f"__import__({module!r})" for module in preload]
    if "matplotlib" in preload:
        # A forked kernel's shell has it already (the fork server set it up before forking):
        # set up again, the inline backend costs ~5 ms and copies pages into the kernel.
        lines.append("if not hasattr(get_ipython(), '_saved_rcParams'):")
        lines.append("    get_ipython().run_line_magic('matplotlib', 'inline')")
    lines.append("__import__('threadbook_kernel').prime()")
    return "\n".join(lines)
