"""The operations HTTP server of ``python -m bot run``: ``/healthz``, ``/readyz``, ``/metrics``.

Served by aiohttp on ``ops.http_host:ops.http_port`` when the port is set (0, the default:
no server). docs/operations.md describes the endpoints, the metrics and the probes.

The server runs on an event loop of its own, in a thread of its own, so that a stuck bot loop
is reported instead of silently unanswered:

- ``/healthz`` (liveness): 200 while the bot's event loop turns; 503 while the watchdog
  (:mod:`bot.loopwatch`) sees it stalled (no turn for over a second), so an orchestrator
  restarts a bot that hangs.
- ``/readyz`` (readiness): 200 when every check passes, else 503; the JSON body names each
  check and what it found:

  - ``store``: a cheap read of the database answers within ``STORE_TIMEOUT_S``;
  - ``sandbox``: the kernel sandbox that ``kernels.sandbox`` asks for is in force. Start-up
    already refuses ``auto``/``bwrap`` where bubblewrap cannot run (fail closed), so this
    fails only if kernels somehow run unsandboxed without ``none``; ``none`` passes and says
    plainly that kernels run without a sandbox; gateway kernels ask for nothing here;
  - ``llm``: the model endpoint answered one of the bot's own requests in the last
    ``LLM_RECENT_S`` and none failed since; else readiness asks it itself
    (``GET {llm.base_url}/models``, ``PROBE_TIMEOUT_S``), an answer kept ``PROBE_CACHE_S``;
  - ``stopping``: the process has not begun to stop (SIGTERM).

  The body's ``mcp`` (when MCP servers are configured) says whether each answered when last
  tried; it informs and decides nothing: a server that is down never makes the bot unready.

- ``/metrics``: :data:`bot.metrics.REGISTRY` in Prometheus' text format.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bot import metrics
from bot.config import LLMSettings
from bot.loopwatch import LoopWatchdog
from bot.mcp.registry import McpServers
from bot.store import Store
from kernels import UNSANDBOXED, KernelSettings, Launcher, sandbox_in_force

log = logging.getLogger(__name__)

#: The model endpoint counts as up without asking when one of the bot's requests got an
#: answer this recently (and none failed since).
LLM_RECENT_S = 60.0
#: How long readiness keeps the result of asking the endpoint itself.
PROBE_CACHE_S = 10.0
PROBE_TIMEOUT_S = 3.0
STORE_TIMEOUT_S = 3.0
#: ``/readyz`` and ``/metrics`` fail when the bot's event loop has not answered within this.
LOOP_ANSWER_S = 10.0
_T = TypeVar("_T")


@dataclass(frozen=True)
class Check:
    """One readiness check: whether it passed, and one line saying what was found."""

    ok: bool
    detail: str


def sandbox_check(settings: KernelSettings, launcher: Launcher) -> Check:
    """Whether the kernel sandbox that ``settings`` ask for is what ``launcher`` (as chosen at
    start, after the sandbox probe) gives kernels."""
    if settings.gateway.enabled:
        return Check(True, "kernels run on the Jupyter gateway (the kernel pod is the sandbox)")
    sandbox = sandbox_in_force(launcher)
    if sandbox is not None:
        return Check(True, f"{sandbox}; {launcher.isolation}")
    if settings.sandbox == "none":
        return Check(True, f"{UNSANDBOXED}; {launcher.isolation}")
    return Check(
        False,
        f"kernels.sandbox is {settings.sandbox} but kernels run without a sandbox "
        "(kernels.sandbox: none is the only setting that accepts that)",
    )


class Readiness:
    """The checks behind ``/readyz``."""

    def __init__(
        self,
        *,
        store: Store,
        llm: LLMSettings,
        kernels: KernelSettings,
        launcher: Launcher,
        llm_recent_s: float = LLM_RECENT_S,
        probe_cache_s: float = PROBE_CACHE_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        store_timeout_s: float = STORE_TIMEOUT_S,
        mcp: McpServers | None = None,
    ) -> None:
        self._store = store
        self._mcp = mcp
        self._llm = llm
        #: Decided once: the launcher was chosen (and the sandbox probed) at start.
        self.sandbox = sandbox_check(kernels, launcher)
        self.llm_recent_s = llm_recent_s
        self.probe_cache_s = probe_cache_s
        self.probe_timeout_s = probe_timeout_s
        self.store_timeout_s = store_timeout_s
        #: Set when the process begins to stop: unready from then on.
        self.stopping = False
        self._probe: tuple[float, Check] | None = None  # (monotonic time, result)
        self._probe_lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        """Close the HTTP client of the endpoint probe."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def checks(self) -> dict[str, Check]:
        """Every check, by name (the store and the model endpoint asked concurrently)."""
        store, llm = await asyncio.gather(self.store_check(), self.llm_check())
        stopping = Check(False, "the process is stopping") if self.stopping else Check(True, "running")
        return {"store": store, "sandbox": self.sandbox, "llm": llm, "stopping": stopping}

    def mcp_servers(self) -> dict[str, Check]:
        """Each MCP server's state as last seen (informational: not part of readiness)."""
        if not self._mcp:
            return {}
        return {name: Check(health.up, health.detail) for name, health in self._mcp.health().items()}

    async def store_check(self) -> Check:
        """A cheap read of the store (its schema revision)."""
        started = time.monotonic()
        try:
            revision = await asyncio.wait_for(self._store.schema_version(), self.store_timeout_s)
        except TimeoutError:
            return Check(False, f"the store did not answer within {self.store_timeout_s:g} s")
        except Exception as exc:
            log.warning("readiness: the store could not be read: %r", exc)
            return Check(False, f"the store could not be read ({type(exc).__name__})")
        return Check(True, f"schema {revision}, read in {1000 * (time.monotonic() - started):.0f} ms")

    async def llm_check(self) -> Check:
        """Whether the model endpoint answers: the bot's own recent requests, else a probe."""
        seen = metrics.endpoint_seen(self._llm.base_url)
        now = time.monotonic()
        if (
            seen.last_ok is not None
            and now - seen.last_ok <= self.llm_recent_s
            and (seen.last_failure is None or seen.last_failure <= seen.last_ok)
        ):
            return Check(True, f"answered a request {now - seen.last_ok:.0f} s ago")
        async with self._probe_lock:  # concurrent scrapes share one probe
            if self._probe is not None and time.monotonic() - self._probe[0] <= self.probe_cache_s:
                return self._probe[1]
            result = await self._ask_endpoint()
            self._probe = (time.monotonic(), result)
            return result

    async def _ask_endpoint(self) -> Check:
        """``GET {llm.base_url}/models``: any answer but a server error or a refused key means
        the endpoint is up (some servers have no ``/models``: their 404 still answers)."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        key = self._llm.api_key.get_secret_value()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        url = self._llm.base_url.rstrip("/") + "/models"
        try:
            timeout = aiohttp.ClientTimeout(total=self.probe_timeout_s)
            async with self._session.get(url, headers=headers, timeout=timeout, allow_redirects=False) as response:
                status = response.status
        except TimeoutError:
            return Check(False, f"llm.base_url did not answer GET /models within {self.probe_timeout_s:g} s")
        except aiohttp.ClientError as exc:
            return Check(False, f"llm.base_url could not be reached ({type(exc).__name__})")
        if status in (401, 403):
            return Check(False, f"llm.base_url refused the API key (GET /models: HTTP {status})")
        if status >= 500:
            return Check(False, f"llm.base_url had a server error (GET /models: HTTP {status})")
        return Check(True, f"GET /models answered HTTP {status}")


class OpsServer:
    """The aiohttp server of ``/healthz``, ``/readyz`` and ``/metrics``, on an event loop of its
    own in a thread of its own: ``/healthz`` answers even while the bot's loop is stuck (from
    ``watchdog``); ``/readyz`` and ``/metrics`` are computed on the bot's loop and answer 503
    when it does not answer within :data:`LOOP_ANSWER_S`."""

    def __init__(self, readiness: Readiness, *, host: str, port: int, watchdog: LoopWatchdog | None = None) -> None:
        self.readiness = readiness
        self.watchdog = watchdog
        self._host = host
        self._requested_port = port
        self._runner: web.AppRunner | None = None
        self._main: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        host = "127.0.0.1" if self._host in ("0.0.0.0", "", "::") else self._host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Listen (port 0: any free port, then :attr:`port` says which). Raises OSError when it cannot."""
        self._main = asyncio.get_running_loop()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ops-http", daemon=True)
        self._thread.start()
        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._listen(), self._loop))
        except BaseException:
            await self._end_thread()
            raise
        log.info("operations endpoints on %s:%d (/healthz, /readyz, /metrics)", self._host, self.port)

    async def _listen(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._requested_port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop listening, end the server's thread, close the readiness probe's client."""
        await self._end_thread()
        await self.readiness.close()

    async def _end_thread(self) -> None:
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        if self._runner is not None:
            runner, self._runner = self._runner, None
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(runner.cleanup(), loop))
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, 5.0)
        if not thread.is_alive():
            loop.close()

    async def _on_bot_loop(self, work: Coroutine[Any, Any, _T]) -> _T:
        """(On the server's loop) ``work`` run on the bot's loop; TimeoutError when that loop
        does not finish it within :data:`LOOP_ANSWER_S`."""
        assert self._main is not None
        future = asyncio.run_coroutine_threadsafe(work, self._main)
        return await asyncio.wait_for(asyncio.wrap_future(future), LOOP_ANSWER_S)

    async def _healthz(self, request: web.Request) -> web.Response:
        stalled = self.watchdog.stalled_for if self.watchdog is not None else None
        if stalled is not None:
            return web.json_response({"status": "stalled", "event_loop_stalled_s": round(stalled, 1)}, status=503)
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        try:
            checks = await self._on_bot_loop(self.readiness.checks())
        except TimeoutError:
            loop = Check(False, f"the bot's event loop did not answer within {LOOP_ANSWER_S:g} s")
            return web.json_response(
                {"ready": False, "failed": ["event_loop"], "checks": {"event_loop": asdict(loop)}}, status=503
            )
        failed = [name for name, check in checks.items() if not check.ok]
        body = {
            "ready": not failed,
            "failed": failed,
            "checks": {name: asdict(check) for name, check in checks.items()},
        }
        if servers := self.readiness.mcp_servers():  # each server's last state, read as it stands
            body["mcp"] = {name: asdict(check) for name, check in servers.items()}
        return web.json_response(body, status=503 if failed else 200)

    async def _metrics(self, request: web.Request) -> web.Response:
        try:  # scraped on the bot's loop: the collectors read the pool's and dispatcher's state
            body = await self._on_bot_loop(_scrape())
        except TimeoutError:
            return web.Response(status=503, text="the bot's event loop did not answer\n")
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _scrape() -> bytes:
    return generate_latest(metrics.REGISTRY)
