"""One MCP server's client session, shared by every thread of the bot.

The SDK's transports and :class:`~mcp.client.session.ClientSession` are anyio context
managers that must be left in the task that entered them, so each connection has a task of
its own (the *owner*) that opens the transport (streamable HTTP with the configured headers,
or the stdio server started with only its own environment), initialises the session, lists
the tools and then holds it open until it is closed or drops. Calls come from the turns'
tasks, concurrently: the SDK matches each answer to its request, so one slow call holds up
no other. A call that finds no session connects first; one that fails because the session is
gone marks it broken, and the next call (or the registry's health check) connects again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from typing import Any, Literal, TextIO, cast

import anyio
import httpx2
import mcp_types as types
from mcp.client.session import ClientSession, IncomingMessage
from mcp.client.stdio import get_default_environment
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from bot.mcp import wire
from bot.mcp.hiding import Hider
from bot.mcp.http import http_transport
from bot.mcp.settings import McpServerSettings
from bot.mcp.stdio import stdio_transport

log = logging.getLogger(__name__)

#: Connecting (the transport, ``initialize`` and the tool listing) gives up after this long.
CONNECT_TIMEOUT_S = 10.0
#: One answer may be this large: one SSE event (the SDK's own default is 1 MiB), a JSON body,
#: which the SDK reads whole (:class:`_CappedBody`), or a stdio server's line. A server built
#: on the SDK sends a text result twice (content and structuredContent): ~8 MB of text.
MAX_MESSAGE_BYTES = 16 * 2**20
#: A call does not try to connect again within this long of a failed connect (the registry's
#: health check does, every ``CHECK_EVERY_S``): a server that is down costs a call no wait.
RETRY_AFTER_S = 5.0
#: The tool listing stops after this many pages (a server that pages without end).
MAX_TOOL_PAGES = 20
#: A stdio server's environment holds only ``env`` and these (plus the MCP SDK's minimal
#: PATH, HOME, USER, LOGNAME, SHELL, TERM); never the bot's own variables.
STDIO_BASE_ENV = {"LANG": "C.UTF-8"}
#: Kept of one line a stdio server writes to its stderr (logged, secrets hidden).
STDERR_LINE_CHARS = 300

Outcome = Literal["ok", "tool_error", "timeout", "failed", "unreachable", "stopped"]


class CallFailed(Exception):
    """A call that brought no result: :attr:`sentence` tells the model (no secret in it),
    :attr:`outcome` counts it."""

    def __init__(self, sentence: str, outcome: Outcome) -> None:
        super().__init__(sentence)
        self.sentence = sentence
        self.outcome = outcome


@dataclass(frozen=True)
class Health:
    """Whether a server answers, and one line on it (no secret, no URL)."""

    up: bool
    detail: str


class Connection:
    """The bot's one client session with the MCP server ``name``."""

    def __init__(
        self,
        name: str,
        settings: McpServerSettings,
        hider: Hider,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.name = name
        self.settings = settings
        self._hider = hider
        self._connect_timeout_s = connect_timeout_s
        self._max_message_bytes = max_message_bytes
        #: The server's tools as last listed (all of them; the registry picks those offered).
        self.tools: tuple[types.Tool, ...] = ()
        self.health = Health(False, "not connected yet")
        self._session: ClientSession | None = None
        self._owner: asyncio.Task[None] | None = None
        self._release = asyncio.Event()
        self._gone = asyncio.Event()
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._failed_at = -RETRY_AFTER_S  # when a connect last failed (monotonic)
        #: The server answered 404 to this session (see :meth:`_see_response`).
        self._stale = False
        #: The HTTP status of the server's last refusal (shown when connecting fails).
        self._refused_with: int | None = None

    @property
    def connected(self) -> bool:
        """Whether a session is open now (it may still have dropped unnoticed)."""
        return self._session is not None

    async def connect(self, *, retry: bool = False) -> bool:
        """Open the session unless it is open (one connect at a time; within the connect
        timeout). True when it is open; else :attr:`health` says why not. A connect that failed
        less than :data:`RETRY_AFTER_S` ago is not tried again unless ``retry``."""
        async with self._lock:
            if self._session is not None or self._closed:
                return self._session is not None
            if not retry and time.monotonic() - self._failed_at < RETRY_AFTER_S:
                return False
            await self._end_owner()
            ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._release = asyncio.Event()
            self._gone = asyncio.Event()
            self._stale = False
            self._refused_with = None
            self._owner = asyncio.create_task(self._own(ready), name=f"mcp-{self.name}")
            try:
                # The owner bounds its own connect; this bound only guards against a stuck SDK.
                return await asyncio.wait_for(asyncio.shield(ready), self._connect_timeout_s + 5)
            except TimeoutError:
                self._down(f"did not answer within {self._connect_timeout_s:g} s", failed=True)
                await self._end_owner()
                return False

    async def call(
        self, tool: str, arguments: dict[str, Any], *, leave: asyncio.Event | None = None
    ) -> types.CallToolResult:
        """Call ``tool`` within ``timeout_s``; :class:`CallFailed` with one sentence for the
        model when no result came (``leave`` set: the user pressed Stop)."""
        for attempt in (1, 2):
            if not await self.connect():
                raise CallFailed(
                    f"The MCP server `{self.name}` cannot be reached now ({self.health.detail}); nothing was called.",
                    "unreachable",
                )
            try:
                return await self._call_once(tool, arguments, leave)
            except _Stale:
                # The server lost the session (it restarted) and refused the call unrun: once more, anew.
                self._broken("the server ended the session")
                if attempt == 2:
                    break
        raise CallFailed(f"The MCP server `{self.name}` ended the session twice; try again later.", "failed")

    async def _call_once(
        self, tool: str, arguments: dict[str, Any], leave: asyncio.Event | None
    ) -> types.CallToolResult:
        session, gone = self._session, self._gone
        assert session is not None
        timeout = self.settings.timeout_s
        calling = asyncio.ensure_future(session.call_tool(tool, arguments, read_timeout_seconds=timeout))
        watchers = [asyncio.ensure_future(gone.wait())]
        if leave is not None:
            watchers.append(asyncio.ensure_future(leave.wait()))
        try:
            # The SDK's own timeout ends the call (and tells the server); this one is a backstop.
            await asyncio.wait([calling, *watchers], timeout=timeout + 5, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the turn itself is cancelled (shutdown): so is the call
            calling.cancel()
            raise
        finally:
            for watcher in watchers:
                watcher.cancel()
        if not calling.done():
            calling.cancel()
            with suppress(BaseException):
                await calling
            if leave is not None and leave.is_set():
                raise CallFailed("Not run to its end: the user pressed Stop.", "stopped")
            if gone.is_set():
                raise CallFailed(
                    f"The connection to the MCP server `{self.name}` dropped during the call; it will be reconnected.",
                    "failed",
                )
            raise self._timed_out()
        try:
            return calling.result()
        except MCPError as exc:
            raise self._refused(exc) from None
        except ValidationError:
            raise CallFailed(
                f"The MCP server `{self.name}` answered with something that is not an MCP result.", "failed"
            ) from None
        except (httpx2.HTTPError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._broken(type(exc).__name__)
            raise CallFailed(
                f"The MCP server `{self.name}` could not be reached ({type(exc).__name__}); it will be reconnected.",
                "failed",
            ) from None

    def _refused(self, exc: MCPError) -> Exception:
        if exc.code == types.REQUEST_TIMEOUT:
            return self._timed_out()
        if exc.code == types.CONNECTION_CLOSED:
            self._broken("the connection closed")
            return CallFailed(
                f"The connection to the MCP server `{self.name}` closed during the call; it will be reconnected.",
                "failed",
            )
        if self._stale:
            return _Stale()
        if wire.too_large(self._max_message_bytes) in exc.message:
            return CallFailed(
                f"The MCP server `{self.name}` answered with more than {self._max_message_bytes // 2**20} MiB; "
                "the answer was dropped.",
                "failed",
            )
        said = self._hider.line(exc.message, 200)
        return CallFailed(f"The MCP server `{self.name}` refused the call: {said}", "failed")

    def _timed_out(self) -> CallFailed:
        return CallFailed(
            f"The call took longer than {self.settings.timeout_s:g} s (this server's timeout_s) and was stopped.",
            "timeout",
        )

    async def ping(self, timeout_s: float = 5.0) -> bool:
        """Whether the open session answers a ping within ``timeout_s`` (a dead one is marked
        broken, to be opened again by the next connect)."""
        session = self._session
        if session is None:
            return False
        try:
            await asyncio.wait_for(session.send_ping(), timeout_s)
        except TimeoutError:
            self._broken(f"no answer to a ping within {timeout_s:g} s")
            return False
        except Exception as exc:
            self._broken(f"ping failed ({type(exc).__name__})")
            return False
        return True

    async def relist(self) -> None:
        """List the tools again (the server said its list changed)."""
        session = self._session
        if session is None:
            return
        try:
            self.tools = await asyncio.wait_for(_list_tools(session), self._connect_timeout_s)
        except Exception as exc:
            log.warning("MCP server %s: could not list its tools again (%s)", self.name, type(exc).__name__)

    async def close(self) -> None:
        """End the session (a stdio server is stopped) and every task of the connection."""
        self._closed = True
        async with self._lock:
            await self._end_owner()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _end_owner(self) -> None:
        owner, self._owner = self._owner, None
        if owner is None:
            return
        self._release.set()
        try:
            await asyncio.wait_for(asyncio.shield(owner), 10)
        except TimeoutError:
            owner.cancel()
            with suppress(BaseException):
                await owner
        except BaseException:
            pass

    def _broken(self, why: str) -> None:
        """The session does not work any more: let its owner close it."""
        if self._session is not None:
            log.warning("MCP server %s: connection lost (%s); reconnecting on next use", self.name, why)
            self._session = None
            self._down(why)
        self._release.set()

    def _down(self, why: str, *, failed: bool = False) -> None:
        """Mark the server down (``failed``: a connect failed, so calls do not retry at once)."""
        self.health = Health(False, why)
        if failed:
            self._failed_at = time.monotonic()

    async def _own(self, ready: asyncio.Future[bool]) -> None:
        """The owner task: open, hold until released or dropped, close."""
        started = time.monotonic()
        try:
            async with AsyncExitStack() as stack:
                read, write = await self._transport(stack)
                session = await stack.enter_async_context(
                    ClientSession(
                        read,
                        write,
                        client_info=types.Implementation(name="threadbook", version="1"),
                        message_handler=self._on_message,
                    )
                )
                with anyio.fail_after(self._connect_timeout_s):
                    await session.initialize()
                    self.tools = await _list_tools(session)
                self._session = session
                self.health = Health(True, f"{len(self.tools)} tools")
                if self.settings.tools is not None:
                    missing = set(self.settings.tools) - {tool.name for tool in self.tools}
                    if missing:
                        log.warning(
                            "MCP server %s lists no tool %s (mcp.%s.tools)", self.name, sorted(missing), self.name
                        )
                log.info(
                    "MCP server %s: connected in %.2f s, %d tools",
                    self.name,
                    time.monotonic() - started,
                    len(self.tools),
                )
                ready.set_result(True)
                await self._release.wait()
        except asyncio.CancelledError:
            self._down("closed", failed=not ready.done())
            raise
        except BaseException as exc:  # an ExceptionGroup of the transport's tasks included
            if isinstance(exc, TimeoutError):
                why = f"did not answer within {self._connect_timeout_s:g} s"
            elif not ready.done() and self._refused_with is not None:
                why = f"HTTP {self._refused_with}" + (
                    " (check its headers)" if self._refused_with in (401, 403) else ""
                )
            else:
                why = _why(exc, self._hider)
            if not ready.done():
                log.warning("MCP server %s: could not connect (%s); trying again later", self.name, why)
            elif self.health.up:
                log.warning("MCP server %s: connection lost (%s); reconnecting on next use", self.name, why)
            self._down(why, failed=not ready.done())
        finally:
            self._session = None
            if self.health.up:
                self._down("closed")
            self._gone.set()
            if not ready.done():
                ready.set_result(False)

    async def _transport(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        settings = self.settings
        if settings.url is not None:
            headers = {name: value.get_secret_value() for name, value in settings.headers.items()}
            read_s = max(300.0, settings.timeout_s + 30)
            client = httpx2.AsyncClient(
                # Uncompressed: a body's size on the wire is its size (see _see_response).
                headers={**headers, "Accept-Encoding": "identity"},
                timeout=httpx2.Timeout(30.0, read=read_s),
                follow_redirects=False,
                event_hooks={"response": [self._see_response]},
            )
            await stack.enter_async_context(client)
            streams = await stack.enter_async_context(
                http_transport(settings.url.get_secret_value(), client, max_message_bytes=self._max_message_bytes)
            )
            return cast(tuple[Any, Any], streams)
        assert settings.command is not None
        environment = {
            **get_default_environment(),
            **STDIO_BASE_ENV,
            **{name: value.get_secret_value() for name, value in settings.env.items()},
        }
        errlog = await self._stderr_pipe(stack)
        streams = await stack.enter_async_context(
            stdio_transport(
                settings.command,
                list(settings.args),
                environment,
                errlog=errlog,
                max_line_bytes=self._max_message_bytes,
                name=self.name,
            )
        )
        return cast(tuple[Any, Any], streams)

    async def _see_response(self, response: httpx2.Response) -> None:
        """Notes a 404 to a request that named a session: the server no longer knows it (it
        restarted), so it ran nothing, and the call may go again on a new session."""
        if response.status_code == 404 and response.request.headers.get("mcp-session-id"):
            self._stale = True
        if response.status_code >= 400:
            self._refused_with = response.status_code
        if not response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            # The SDK reads a JSON answer (or an error's body) whole: cap it. A body compressed
            # anyway is left undecoded (it fails to parse) rather than inflated without bound.
            response.headers.pop("content-encoding", None)
            response.stream = _CappedBody(response.stream, self._max_message_bytes)

    async def _stderr_pipe(self, stack: AsyncExitStack) -> TextIO:
        """A pipe for the stdio server's stderr whose lines go to the log, secrets hidden."""
        read_fd, write_fd = os.pipe()
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**16)
        try:
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb"))
        except BaseException:
            os.close(write_fd)
            raise
        task = asyncio.create_task(self._log_stderr(reader), name=f"mcp-{self.name}-stderr")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        errlog = os.fdopen(write_fd, "w", encoding="utf-8", errors="replace")
        stack.callback(errlog.close)  # the server keeps its own copy until it exits: then EOF
        return errlog

    async def _log_stderr(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):  # an over-long line: skip what is buffered
                with suppress(Exception):
                    await reader.read(2**16)
                continue
            if not line:
                return
            text = self._hider.line(line.decode("utf-8", "replace"), STDERR_LINE_CHARS)
            if text:
                log.info("MCP server %s (stderr): %s", self.name, text)

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            task = asyncio.create_task(self.relist(), name=f"mcp-{self.name}-relist")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif isinstance(message, Exception):
            log.debug("MCP server %s: transport error %s", self.name, type(message).__name__)


class _CappedBody(httpx2.AsyncByteStream):
    """A response body that ends with :class:`httpx2.StreamError` past ``limit`` bytes (the
    SDK turns that into a parse error of the call, one sentence for the model)."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream = stream
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self._stream:
            total += len(chunk)
            if total > self._limit:
                raise httpx2.StreamError(wire.too_large(self._limit))
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class _Stale(Exception):
    """The server no longer knows the session (it restarted): the call did not run."""


async def _list_tools(session: ClientSession) -> tuple[types.Tool, ...]:
    """Every tool the server lists (following its pages, at most :data:`MAX_TOOL_PAGES`)."""
    listed: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tuple(listed)


def _why(exc: BaseException, hider: Hider) -> str:
    """One line on why connecting failed: the innermost error's type, and for an HTTP status or
    a missing program what it was (no URL: its message could carry the server's address)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    if isinstance(exc, MCPError):
        return hider.line(exc.message, 120)
    if isinstance(exc, FileNotFoundError):
        return "its command was not found"
    if isinstance(exc, PermissionError):
        return "its command may not be run"
    return type(exc).__name__
