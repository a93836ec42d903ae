"""Fixtures of the operations tests: a running core behind its real ops HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from bot.app import Core, serve_ops
from bot.health import OpsServer
from tests.conftest import make_settings
from tests.fakes.openai_server import ScriptedOpenAI


class Switch:
    """A TCP forwarder to ``target`` on one port of 127.0.0.1 that can be switched off (the
    port refuses connections, open ones are cut) and on again at the same port: the model
    endpoint going down and coming back, while ``llm.base_url`` stays the same."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._server is not None

    async def on(self) -> None:
        assert self._server is None
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def off(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._open):
            writer.close()
        await self._server.wait_closed()
        self._server = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self._open.update((writer, up_writer))

        async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        try:
            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        finally:
            self._open.difference_update((writer, up_writer))


@dataclass
class Ops:
    """A core, its ops server and an HTTP client for it."""

    core: Core
    server: OpsServer
    http: aiohttp.ClientSession

    async def get(self, path: str) -> tuple[int, str]:
        async with self.http.get(self.server.url + path) as response:
            return response.status, await response.text()

    async def ready(self) -> tuple[int, dict[str, Any]]:
        async with self.http.get(self.server.url + "/readyz") as response:
            return response.status, await response.json()

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics: (name, sorted labels) → value."""
        status, text = await self.get("/metrics")
        assert status == 200
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """One sample's value (0 when it is absent)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest_asyncio.fixture
async def llm() -> AsyncIterator[ScriptedOpenAI]:
    """The scripted model server (script it in the test)."""
    async with ScriptedOpenAI() as server:
        yield server


@pytest_asyncio.fixture
async def switch(llm: ScriptedOpenAI) -> AsyncIterator[Switch]:
    """The model server behind a port that can go down and come back."""
    port = int(llm.base_url.rsplit(":", 1)[1].split("/", 1)[0])
    forwarder = Switch(port)
    await forwarder.on()
    try:
        yield forwarder
    finally:
        if forwarder.running:
            await forwarder.off()


@pytest_asyncio.fixture
async def ops(tmp_path: Path, switch: Switch) -> AsyncIterator[Ops]:
    """A real core (model behind ``switch``, real kernels, SQLite) and its ops server on a
    free port of 127.0.0.1 (bound with port 0, as the config's port 0 means "off")."""
    settings = make_settings(tmp_path, llm_url=switch.base_url, llm={"max_retries": 0})
    async with Core.open(settings) as core, serve_ops(core, host="127.0.0.1", port=0) as server:
        async with aiohttp.ClientSession() as http:
            yield Ops(core, server, http)
