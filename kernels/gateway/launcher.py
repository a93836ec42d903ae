"""Kernels on a Jupyter gateway (Kernel Gateway, or Enterprise Gateway / gateway-provisioners
on Kubernetes): the same launch seam, carried out over the gateway's REST + websocket API.

REST (``/api/kernels``) starts, interrupts, inspects and deletes kernels; one websocket per
kernel (``/api/kernels/<id>/channels``, the JSON protocol every Jupyter server speaks)
carries the shell and iopub messages, which a reader task sorts into asyncio queues.

Why not jupyter_server's own ``GatewayKernelClient``: its channel queues wait by spinning
the event loop (``await asyncio.sleep(0)`` in a loop) for as long as a cell runs, it opens its
websocket with a blocking call on the loop, it reads messages of any size, and it forwards
every ``KERNEL_*`` variable of the bot's own environment to the gateway. Here messages are
built with jupyter_client's :class:`~jupyter_client.session.Session`, the websocket is
aiohttp's (already a dependency), waiting is an awaited queue, and a message over
:data:`kernels.seam.wire.MAX_MESSAGE_BYTES` is refused by the websocket before it is decoded.

Files stay where they are: the thread's workspace must be on a volume the bot and the
kernels share at the same path (``KERNEL_WORKING_DIR`` tells gateway-provisioners where to
start the kernel; the setup code changes into it as well, for gateways that ignore it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session

from kernels.seam.options import KernelOptions
from kernels.seam.plan import KernelChannels, KernelHandle, LaunchPlan, ResourceLimits
from kernels.seam.result import KernelStartError, KernelUnavailableError
from kernels.seam.settings import GatewaySettings, KernelSettings
from kernels.seam.wire import (
    KERNEL_SETUP,
    MAX_MESSAGE_BYTES,
    START_TIMEOUT_S,
    run_silently,
    shell_reply,
    wait_ready,
    warm_up_code,
)

log = logging.getLogger(__name__)

#: How often a lost websocket is reconnected before the kernel counts as gone.
_RECONNECTS = 3


class GatewayApi:
    """The gateway's REST API, over one aiohttp session."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.base = settings.url.strip().rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session (made on first use, on the running loop)."""
        if self._session is None or self._session.closed:
            token = self.settings.auth_token.get_secret_value()
            headers = {"Authorization": f"token {token}"} if token else {}
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout_s),
                connector=aiohttp.TCPConnector(ssl=self.settings.validate_cert),  # False: no certificate check
            )
        return self._session

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """JSON of a request; None for 404. Raises :class:`KernelUnavailableError` when the
        gateway cannot be reached or answers with an error."""
        url = f"{self.base}{path}"
        bound = aiohttp.ClientTimeout(total=timeout) if timeout is not None else None
        try:
            async with self.session.request(method, url, json=body, timeout=bound) as response:
                if response.status == 404:
                    return None
                if response.status >= 400:
                    text = (await response.text())[:300]
                    raise KernelUnavailableError(f"the kernel gateway answered {response.status}: {text}")
                if response.status == 204 or response.content_length == 0:
                    return {}
                return await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise KernelUnavailableError(f"the kernel gateway at {self.base} did not answer ({exc!r})") from exc

    async def start_kernel(self, env: dict[str, str], timeout: float) -> str:
        """Start a kernel of the configured kernelspec with ``env``; its id."""
        model = await self._request("POST", "/api/kernels", {"name": self.settings.kernel_name, "env": env}, timeout)
        if not isinstance(model, dict) or not isinstance(model.get("id"), str):
            raise KernelUnavailableError(f"the kernel gateway did not start a kernel: {model!r}"[:300])
        return str(model["id"])

    async def kernel(self, kernel_id: str) -> dict[str, Any] | None:
        """The kernel's model, or None when the gateway has no such kernel."""
        model = await self._request("GET", f"/api/kernels/{quote(kernel_id)}")
        return model if isinstance(model, dict) else None

    async def interrupt(self, kernel_id: str) -> None:
        """Interrupt the kernel's running execution."""
        await self._request("POST", f"/api/kernels/{quote(kernel_id)}/interrupt", {})

    async def delete(self, kernel_id: str) -> None:
        """Shut the kernel down (gone already: nothing to do)."""
        await self._request("DELETE", f"/api/kernels/{quote(kernel_id)}")

    async def connect(self, kernel_id: str, session_id: str) -> aiohttp.ClientWebSocketResponse:
        """A websocket on the kernel's channels (messages over the cap are refused)."""
        scheme, netloc, path, _, _ = urlsplit(self.base)
        ws_scheme = "wss" if scheme == "https" else "ws"
        url = urlunsplit(
            (ws_scheme, netloc, f"{path}/api/kernels/{quote(kernel_id)}/channels", f"session_id={session_id}", "")
        )
        try:
            return await self.session.ws_connect(url, max_msg_size=MAX_MESSAGE_BYTES, heartbeat=30.0)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KernelUnavailableError(f"could not open the kernel's channels on the gateway ({exc!r})") from exc


class GatewayChannels:
    """A gateway kernel's shell and iopub channels (:class:`kernels.seam.plan.KernelChannels`)."""

    def __init__(self, api: GatewayApi, kernel_id: str) -> None:
        self._api = api
        self._kernel_id = kernel_id
        # Messages on the websocket are not signed (the gateway signs them toward the kernel);
        # a key only keeps the session from warning.
        self._session = Session(key=secrets.token_bytes(16), username="threadbook")
        self._queues: dict[str, asyncio.Queue[dict[str, Any]]] = {"shell": asyncio.Queue(), "iopub": asyncio.Queue()}
        self._outgoing: asyncio.Queue[str] = asyncio.Queue()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: The kernel is gone (deleted, culled, restarted by the gateway after a crash, or
        #: unreachable): nothing more will come.
        self.gone = False
        self.closing = False

    async def open(self) -> None:
        """Connect, and start reading and writing in the background."""
        self._ws = await self._api.connect(self._kernel_id, self._session.session)
        self._tasks = [
            asyncio.create_task(self._read(), name=f"gateway-read-{self._kernel_id}"),
            asyncio.create_task(self._write(), name=f"gateway-write-{self._kernel_id}"),
        ]

    async def close(self) -> None:
        """Stop reading and writing and close the websocket."""
        self.closing = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._ws is not None:
            await self._ws.close()

    def _send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        msg = self._session.msg(msg_type, content)
        msg["channel"] = channel
        msg["buffers"] = []
        self._outgoing.put_nowait(json.dumps(msg, default=json_default))
        return str(msg["header"]["msg_id"])

    def execute(
        self,
        code: str,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool | None = None,
        stop_on_error: bool = True,
    ) -> str:
        """Send an ``execute_request``; its msg_id."""
        content = {
            "code": code,
            "silent": silent,
            "store_history": store_history,
            "user_expressions": user_expressions or {},
            "allow_stdin": bool(allow_stdin),
            "stop_on_error": stop_on_error,
        }
        return self._send("shell", "execute_request", content)

    def kernel_info(self) -> str:
        """Send a ``kernel_info_request``; its msg_id."""
        return self._send("shell", "kernel_info_request", {})

    async def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:
        """The next iopub message; ``queue.Empty`` after ``timeout`` seconds."""
        return await self._get("iopub", timeout)

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        """The next shell reply; ``queue.Empty`` after ``timeout`` seconds."""
        return await self._get("shell", timeout)

    async def _get(self, channel: str, timeout: float | None) -> dict[str, Any]:
        queue = self._queues[channel]
        try:
            return queue.get_nowait() if timeout == 0 else await asyncio.wait_for(queue.get(), timeout)
        except (asyncio.QueueEmpty, TimeoutError):
            raise Empty from None

    async def _write(self) -> None:
        while True:
            text = await self._outgoing.get()
            while not self.gone:
                try:
                    assert self._ws is not None
                    await self._ws.send_str(text)
                    break
                except (ConnectionError, aiohttp.ClientError, RuntimeError):
                    await asyncio.sleep(0.1)  # the reader reconnects (or declares the kernel gone)

    async def _read(self) -> None:
        reconnects = 0
        while not self.gone:
            ws = self._ws
            assert ws is not None
            quick_ack = _quick_ack(ws)
            quick_ack()
            async for message in ws:
                quick_ack()
                if message.type is aiohttp.WSMsgType.TEXT:
                    reconnects = 0  # the connection works again: a later loss gets its own tries
                    self._route(message.data)
                elif message.type is aiohttp.WSMsgType.ERROR:
                    log.warning("gateway channels of %s: %r", self._kernel_id, ws.exception())
                    break
            if self.closing or self.gone:
                return
            # Closed under us (an oversized message, a proxy, a gateway restart): the kernel
            # may still run. Reconnect with the same session id (the server replays what it
            # buffered meanwhile); a kernel the gateway no longer has is gone.
            reconnects += 1
            try:
                alive = reconnects <= _RECONNECTS and await self._api.kernel(self._kernel_id) is not None
                if alive:
                    self._ws = await self._api.connect(self._kernel_id, self._session.session)
                    log.info("reconnected the gateway channels of %s", self._kernel_id)
                    continue
            except KernelUnavailableError as exc:
                log.warning("gateway channels of %s lost: %s", self._kernel_id, exc)
            self.gone = True

    def _route(self, data: str) -> None:
        try:
            msg = json.loads(data)
            channel = msg.get("channel")
        except (ValueError, AttributeError):
            return
        if channel == "iopub" and msg.get("msg_type") == "status" and not msg.get("parent_header"):
            # The server's own notices: the kernel died and is being restarted (a fresh
            # process behind the same id) or could not be restarted.
            if (msg.get("content") or {}).get("execution_state") in ("restarting", "dead"):
                self.gone = True
        queue = self._queues.get(str(channel))
        if queue is not None:
            queue.put_nowait(msg)


def _quick_ack(ws: aiohttp.ClientWebSocketResponse) -> Callable[[], None]:
    """A function that asks Linux to acknowledge what arrives on ``ws`` at once.

    Jupyter servers do not turn off Nagle's algorithm on their websockets, so a reply
    written right after a status message waits for our acknowledgement of that one, which
    a delayed ACK holds back ~40 ms: every round trip (an execution's reply, idle) would
    cost that. ``TCP_QUICKACK`` lapses, so it is set again after every message.
    """
    sock = ws.get_extra_info("socket")
    option = getattr(socket, "TCP_QUICKACK", None)
    if sock is None or option is None:
        return lambda: None

    def quick_ack() -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, option, 1)

    return quick_ack


class GatewayKernelHandle:
    """A ready kernel on the gateway (:class:`kernels.seam.plan.KernelHandle`)."""

    def __init__(self, api: GatewayApi, kernel_id: str, channels: GatewayChannels) -> None:
        self.api = api
        self.kernel_id = kernel_id
        self.channels = channels

    @property
    def client(self) -> KernelChannels:
        """Its channels."""
        return self.channels

    @property
    def pid(self) -> int | None:
        """None: the process is the gateway's."""
        return None

    @property
    def remote_id(self) -> str | None:
        """The gateway's id of the kernel: any replica of the bot can attach to it."""
        return self.kernel_id

    async def reply(self, msg_id: str, timeout: float) -> dict[str, Any] | None:
        """The shell reply to ``msg_id`` (see :func:`kernels.seam.wire.shell_reply`)."""
        return await shell_reply(self.channels, msg_id, timeout)

    async def renew_iopub(self, timeout: float = 5.0) -> bool:
        """The channels reconnect by themselves after a refused message."""
        return not self.channels.gone

    async def out_of_memory(self) -> bool:
        """Unknown on a gateway (its provisioner's limits apply)."""
        return False

    async def stop_leftovers(self) -> int:
        """Processes a cell left behind live and die with the kernel's pod or process group."""
        return 0

    async def is_alive(self) -> bool:
        """Whether the gateway still runs this kernel process (no round trip: the channels
        hear when it dies, is restarted or is deleted)."""
        return not self.channels.gone

    async def exit_code(self) -> int | None:
        """Unknown on a gateway."""
        return None

    async def interrupt(self) -> None:
        """Interrupt through the gateway."""
        await self.api.interrupt(self.kernel_id)

    async def shutdown(self) -> None:
        """Close the channels and delete the kernel on the gateway."""
        try:
            await self.channels.close()
        finally:
            try:
                await self.api.delete(self.kernel_id)
            except KernelUnavailableError as exc:
                log.warning("could not delete kernel %s on the gateway: %s", self.kernel_id, exc)

    async def log_tail(self, max_bytes: int = 2000) -> str:
        """The gateway keeps the kernel's log."""
        return ""

    async def freeze(self) -> bool:
        """Nothing: the gateway's kernel processes are not the bot's to stop (its pod's limits hold)."""
        return True

    def freeze_blocking(self) -> bool:
        """Nothing (see :meth:`freeze`)."""
        return True

    async def thaw(self) -> None:
        """Nothing (see :meth:`freeze`)."""

    async def cpu_seconds(self) -> float | None:
        """Unknown: the gateway does not report it (turns count the wall time of cells)."""
        return None

    async def memory_bytes(self) -> int | None:
        """Unknown on a gateway."""
        return None


class GatewayLauncher:
    """Starts every kernel on a Jupyter gateway (:class:`kernels.seam.plan.Launcher`)."""

    def __init__(self, settings: KernelSettings, *, start_slots: int = 16) -> None:
        self.settings = settings
        self.api = GatewayApi(settings.gateway)
        self._start_slots = asyncio.Semaphore(start_slots)

    @property
    def isolation(self) -> str:
        """Which isolation kernels get (``status`` shows it: the gateway's address is left out)."""
        return "kernels on a Jupyter gateway (isolated by the gateway's provisioner)"

    def kernel_view(self, options: KernelOptions) -> KernelOptions:
        """The gateway's kernels see the shared volume at the bot's paths."""
        return options

    def plan(self, workspace: Path, options: KernelOptions) -> LaunchPlan:
        """A plan whose environment is what the gateway passes on (``KERNEL_*`` variables)."""
        environment = {
            # gateway-provisioners names pods after the user and refuses "root" by default.
            "KERNEL_USERNAME": "threadbook",
            "KERNEL_WORKING_DIR": str(workspace),
            "KERNEL_NETWORK": "true" if options.network else "false",
        }
        if options.data_dir is not None:
            environment["KERNEL_THREADBOOK_DATA_DIR"] = str(options.data_dir)
        return LaunchPlan(
            kernel_id=uuid.uuid4().hex,
            workspace=workspace,
            run_dir=workspace,
            environment=environment,
            limits=ResourceLimits.from_settings(self.settings),
            data_dir=options.data_dir,
            network=options.network,
            packages_dir=None,
            identity=None,
        )

    async def start(self, plan: LaunchPlan) -> KernelHandle:
        """Start a kernel on the gateway, connect its channels, wait until it answers and
        set it up in the thread's folder; nothing is left on the gateway when that fails."""
        async with self._start_slots:
            timeout = max(START_TIMEOUT_S, self.settings.gateway.request_timeout_s)
            kernel_id = await self.api.start_kernel(dict(plan.environment), timeout)
            channels = GatewayChannels(self.api, kernel_id)
            handle = GatewayKernelHandle(self.api, kernel_id, channels)
            try:
                await channels.open()
                await wait_ready(handle, timeout)
                await run_silently(handle, setup_code(plan.workspace, self.settings.preload))
                return handle
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await handle.shutdown()
                if isinstance(exc, Exception) and not isinstance(exc, KernelStartError):
                    raise KernelStartError(f"could not start a kernel on the gateway: {exc}") from exc
                raise

    async def attach(self, remote_id: str) -> KernelHandle | None:
        """Connect to a kernel on the gateway that another replica started (it died): interrupt
        what it was running and wait until it answers. None when the gateway no longer has it
        or it does not answer (then it is deleted)."""
        if await self.api.kernel(remote_id) is None:
            return None
        channels = GatewayChannels(self.api, remote_id)
        handle = GatewayKernelHandle(self.api, remote_id, channels)
        timeout = max(START_TIMEOUT_S, self.settings.gateway.request_timeout_s)
        try:
            await channels.open()
            await self.api.interrupt(remote_id)
            await wait_ready(handle, timeout)
            return handle
        except Exception as exc:
            log.warning("could not take over kernel %s on the gateway (%s): deleting it", remote_id, exc)
            with contextlib.suppress(Exception):
                await handle.shutdown()
            return None

    async def open(self) -> None:
        """Nothing runs in the background."""

    async def close(self) -> None:
        """Close the HTTP session (kernels are deleted by their sessions)."""
        await self.api.close()


def setup_code(workspace: Path, preload: tuple[str, ...]) -> str:
    """What a gateway kernel runs first: into the thread's folder (a gateway may ignore
    ``KERNEL_WORKING_DIR``), Threadbook's kernel setup, the preloaded modules."""
    return f"__import__('os').chdir({str(workspace)!r})\n{KERNEL_SETUP}\n{warm_up_code(preload)}"
