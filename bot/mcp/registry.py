"""Every configured MCP server: connected when the bot starts, watched while it runs, closed
with it.

A server that cannot be reached at start-up is logged and left down; the bot starts anyway.
Every :data:`CHECK_EVERY_S` a task tries the down servers again and pings the connected ones
(a ping that fails marks the connection broken, so the next call opens a new one). Which of a
server's tools are offered, and under which function names, is decided here from its latest
listing (:func:`offered_tools`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from bot import metrics
from bot.mcp.connection import CONNECT_TIMEOUT_S, Connection, Health
from bot.mcp.hiding import URL_LOGGERS, Hider, HidingFilter
from bot.mcp.names import function_names
from bot.mcp.settings import McpServerSettings

log = logging.getLogger(__name__)

#: How often down servers are tried again and connected ones pinged.
CHECK_EVERY_S = 30.0
#: A tool whose input schema is larger than this (as JSON) is not offered: it would fill the prompt.
MAX_SCHEMA_CHARS = 16_000
#: The description the model reads for one tool (the server's and the tool's own) is cut here.
MAX_DESCRIPTION_CHARS = 2_000


@dataclass(frozen=True)
class OfferedTool:
    """One tool of a server as the model is offered it."""

    server: str
    #: The server's name for it (what is called).
    tool: str
    #: The model's name for it: ``<server>__<tool>`` (:mod:`bot.mcp.names`).
    function: str
    description: str
    #: The tool's input schema (a JSON Schema object).
    parameters: dict[str, Any]


class McpServers:
    """The bot's MCP servers by name, one shared session each."""

    def __init__(
        self,
        settings: Mapping[str, McpServerSettings],
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        #: Every server's credentials, hidden from whatever any of them says (and the log).
        self.hider = Hider(secret for each in settings.values() for secret in each.secrets())
        self._connections = {
            name: Connection(name, each, self.hider, connect_timeout_s=connect_timeout_s)
            for name, each in settings.items()
        }
        self._check_every_s = check_every_s
        metrics.mcp_servers(self._connections)
        self._watcher: asyncio.Task[None] | None = None
        self._filter = HidingFilter(self.hider)

    def __bool__(self) -> bool:
        return bool(self._connections)

    @property
    def names(self) -> list[str]:
        """The configured servers' names."""
        return list(self._connections)

    def connection(self, name: str) -> Connection:
        """The server ``name``'s connection (``KeyError`` when it is not configured)."""
        return self._connections[name]

    async def open(self) -> None:
        """Connect every server at once (each within its connect timeout; one that fails is
        logged and tried again later), then start watching them."""
        for name in URL_LOGGERS:
            logging.getLogger(name).addFilter(self._filter)
        if not self._connections:
            return
        await asyncio.gather(*(connection.connect() for connection in self._connections.values()))
        up = [name for name, c in self._connections.items() if c.connected]
        log.info("MCP servers: %d of %d connected (%s)", len(up), len(self._connections), ", ".join(up) or "none")
        self._watcher = asyncio.create_task(self._watch(), name="mcp-watch")

    async def close(self) -> None:
        """Stop watching and close every session (stdio servers are stopped)."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        await asyncio.gather(*(c.close() for c in self._connections.values()), return_exceptions=True)
        for name in URL_LOGGERS:
            logging.getLogger(name).removeFilter(self._filter)

    def health(self) -> dict[str, Health]:
        """Each server's state as last seen (no I/O; for ``/readyz``)."""
        return {name: c.health for name, c in self._connections.items()}

    async def check(self, names: Sequence[str], timeout_s: float = 3.0) -> dict[str, Health]:
        """Whether each of ``names`` answers now: a connected one is pinged; a down one keeps its
        last state (it is tried again every :data:`CHECK_EVERY_S`)."""

        async def one(name: str) -> Health:
            connection = self._connections[name]
            if connection.connected:
                await connection.ping(timeout_s)
            return connection.health

        found = await asyncio.gather(*(one(name) for name in names))
        return dict(zip(names, found, strict=True))

    def offered(self, granted: Sequence[str]) -> list[OfferedTool]:
        """The tools offered to a channel granted ``granted`` servers (those connected now or
        listed before: a server down now offers what it listed when it was last up, and a call
        tries to reach it)."""
        return [tool for name in granted for tool in offered_tools(self._connections[name])]

    def down_note(self, granted: Sequence[str]) -> str:
        """One sentence for the model on the ``granted`` servers that do not answer now (empty
        when all do): what they offer may fail, and a server never reached offers nothing."""
        down = [name for name in granted if not self._connections[name].connected]
        if not down:
            return ""
        listed = ", ".join(f"`{name}`" for name in down)
        return (
            f"The MCP server{'s' if len(down) > 1 else ''} {listed} of this channel did not answer when last tried, "
            "so calls to their tools may fail (and a server never reached offers none)."
        )

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._check_every_s)
            for name, connection in self._connections.items():
                try:
                    if connection.connected:
                        await connection.ping()
                    else:
                        was = connection.health.detail
                        if await connection.connect(retry=True):
                            log.info("MCP server %s: reconnected (was down: %s)", name, was)
                except Exception:  # one server's trouble never ends the watch
                    log.exception("MCP server %s: health check failed", name)


def offered_tools(connection: Connection) -> list[OfferedTool]:
    """The tools of ``connection``'s latest listing that its settings offer, named for the model."""
    settings = connection.settings
    tools = list(connection.tools)
    if settings.tools is not None:
        wanted = set(settings.tools)
        tools = [tool for tool in tools if tool.name in wanted]
    else:
        tools = [tool for tool in tools if not destructive(tool)]
    tools = [tool for tool in tools if _schema_fits(connection.name, tool)]
    names = function_names(connection.name, [tool.name for tool in tools])
    return [
        OfferedTool(
            server=connection.name,
            tool=tool.name,
            function=names[tool.name],
            description=_description(settings.description, tool),
            parameters=_parameters(tool.input_schema),
        )
        for tool in sorted(tools, key=lambda t: names[t.name])
    ]


def destructive(tool: types.Tool) -> bool:
    """Whether the server annotates ``tool`` as destructive (``destructiveHint: true`` on a tool
    not marked ``readOnlyHint: true``)."""
    hints = tool.annotations
    return hints is not None and hints.destructive_hint is True and hints.read_only_hint is not True


def _description(server: str, tool: types.Tool) -> str:
    own = (tool.description or tool.title or "").strip()
    text = f"[{server.strip()}] {own}".strip() if server.strip() else own
    text = text or f"The tool {tool.name} of an MCP server."
    return text if len(text) <= MAX_DESCRIPTION_CHARS else text[: MAX_DESCRIPTION_CHARS - 1] + "…"


def _parameters(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The input schema as a function's parameters (an object schema, whatever the server sent)."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return {"type": "object", "properties": {}}
    if not isinstance(schema.get("properties"), dict):
        return {**schema, "properties": {}}
    return schema


def _schema_fits(server: str, tool: types.Tool) -> bool:
    size = len(json.dumps(tool.input_schema, default=str))
    if size > MAX_SCHEMA_CHARS:
        log.warning(
            "MCP server %s: tool %r not offered, its input schema is %d characters (over %d)",
            server,
            tool.name[:80],
            size,
            MAX_SCHEMA_CHARS,
        )
        return False
    return True
