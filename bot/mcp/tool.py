"""An MCP server's tool, offered to the model for one turn (the agent loop's ``Tool``).

The bot makes the call, never the kernel: the arguments the model wrote go to the server
over the bot's shared session (:mod:`bot.mcp.connection`), bounded by the server's
``timeout_s`` and by Stop; the result comes back as the tool message
(:mod:`bot.mcp.result`: text cut to a bounded size, the rest saved into the workspace). The
call's wall time counts in the turn's kernel seconds (as an ``sql`` query's does) and in
``/metrics``. Whatever happens, the model gets text: a failure is one sentence.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bot import metrics
from bot.mcp.connection import CallFailed
from bot.mcp.hiding import one_line
from bot.mcp.registry import McpServers, OfferedTool
from bot.mcp.result import present
from kernels import Workspace

log = logging.getLogger(__name__)

#: Shows a status line in the thread (the turn's progress message).
Status = Callable[[str], Awaitable[None]]


class McpTool:
    """One offered tool of one MCP server, for one turn of a thread."""

    def __init__(
        self,
        *,
        servers: McpServers,
        offered: OfferedTool,
        workspace: Workspace,
        status: Status | None = None,
        leave: asyncio.Event | None = None,
    ) -> None:
        """``leave``: set by Stop (a call then running is abandoned, no later one starts)."""
        self._servers = servers
        self._offered = offered
        self._workspace = workspace
        self._status = status
        self._leave = leave
        #: The function name the model calls.
        self.name = offered.function
        #: The OpenAI function tool offered to the model (chat completions shape).
        self.spec: dict[str, Any] = {
            "type": "function",
            "function": {
                "name": offered.function,
                "description": offered.description,
                "parameters": offered.parameters,
            },
        }
        #: Seconds spent in calls this turn (counted with the turn's kernel seconds).
        self.seconds = 0.0

    async def call(self, arguments: str) -> str:
        """Run one call with the model's raw JSON ``arguments``; the text is the tool result."""
        server, tool = self._offered.server, self._offered.tool
        if self._leave is not None and self._leave.is_set():
            return "Not run: the user pressed Stop; no tool runs any more in this turn."
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"Error: the arguments were not valid JSON ({exc.msg} at position {exc.pos}); nothing was called."
        if not isinstance(parsed, dict):
            return "Error: the arguments must be a JSON object; nothing was called."
        if self._status is not None:
            try:
                shown = one_line(tool, 60).replace("`", "'")
                await self._status(f"🔌 Calling `{server}` → `{shown}`")
            except Exception:  # the status is cosmetic
                log.exception("could not show the call's status")
        loop = asyncio.get_running_loop()
        started = loop.time()
        outcome = "failed"
        try:
            result = await self._servers.connection(server).call(tool, parsed, leave=self._leave)
            presented = await present(result, function=self.name, workspace=self._workspace, hider=self._servers.hider)
            del result
            outcome = "tool_error" if presented.error else "ok"
            return presented.text
        except CallFailed as exc:
            outcome = exc.outcome
            return exc.sentence
        except Exception as exc:  # one sentence for the model; no message (it could hold a secret)
            log.warning("MCP server %s: call of %r failed (%s)", server, tool[:80], type(exc).__name__)
            return f"The call to the MCP server `{server}` failed ({type(exc).__name__}); nothing came back."
        finally:
            elapsed = loop.time() - started
            self.seconds += elapsed
            metrics.mcp_call(server, outcome, elapsed)


def tools_for(
    servers: McpServers | None,
    granted: Sequence[str],
    *,
    workspace: Workspace,
    status: Status | None = None,
    leave: asyncio.Event | None = None,
) -> list[McpTool]:
    """The tools a turn offers for the ``granted`` servers (none without a grant)."""
    if servers is None or not granted:
        return []
    return [
        McpTool(servers=servers, offered=offered, workspace=workspace, status=status, leave=leave)
        for offered in servers.offered(granted)
    ]
