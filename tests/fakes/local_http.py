"""Serve an aiohttp application on 127.0.0.1 with an ephemeral port (for the fakes)."""

from __future__ import annotations

from aiohttp import web


async def serve_locally(
    app: web.Application, *, shutdown_timeout: float = 1.0, host: str = "127.0.0.1"
) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``host`` (127.0.0.1), port 0; returns the runner (to clean up) and the bound port."""
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return runner, runner.addresses[0][1]
