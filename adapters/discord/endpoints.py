"""Point discord.py at a configured REST base and gateway (a proxy, a compatible server, a test fake).

How discord.py (2.7) finds Discord, and why these two class attributes are the whole story:

- **REST.** Every request is built as ``Route(method, path)`` whose ``url`` is
  ``Route.BASE + path`` (``discord/http.py``). That covers the bot's ``HTTPClient`` *and* the
  webhook adapter that answers component interactions (``discord/webhook/async_.py``, which
  imports the same ``Route``), so the Stop button's callback goes to the same place.
  discord.py itself changes ``Route.BASE`` this way when the API version is switched
  (``http._set_api_version``).
- **Gateway.** A non-sharded ``Client`` never asks ``GET /gateway/bot``: ``Client.connect``
  opens ``DiscordWebSocket.from_client`` with ``gateway=None``, which falls back to the class
  attribute ``DiscordWebSocket.DEFAULT_GATEWAY`` and adds ``?v=10&encoding=json&compress=zlib-stream``.
  Resumes go to READY's ``resume_gateway_url`` (the server chooses it), and after an
  INVALID_SESSION discord.py goes back to ``DEFAULT_GATEWAY``.
- **CDN.** Attachment URLs arrive in message payloads, so downloads follow the server.

Both are class attributes, so the override is per process: :func:`install` sets them before
login and returns the undo; a second, different override while one is active is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

_installed: tuple[str, yarl.URL] | None = None
_original: tuple[str, yarl.URL] = (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)
_users = 0


def install(api_url: str | None, gateway_url: str | None) -> Callable[[], None]:
    """Make discord.py use ``api_url`` (REST base incl. ``/api/v10``) and ``gateway_url``.

    ``None`` keeps Discord's own endpoint. Call before ``Client.login``; call the returned
    function after ``Client.close``: the last one restores discord.py's defaults.
    """
    global _installed, _users
    wanted = (api_url.rstrip("/") if api_url else _original[0], yarl.URL(gateway_url) if gateway_url else _original[1])
    if _installed is not None and _installed != wanted:
        raise RuntimeError(
            f"discord.py already points at {_installed[0]} / {_installed[1]}; one process serves one Discord API"
        )
    Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = _installed = wanted
    _users += 1
    undone = False

    def undo() -> None:
        global _installed, _users
        nonlocal undone
        if undone:
            return
        undone = True
        _users -= 1
        if _users == 0:
            Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = _original
            _installed = None

    return undo
