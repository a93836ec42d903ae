"""Downloading files users attach in Slack (``url_private_download`` + the bot token)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

from bot.events import FetchBytes

CHUNK = 256 * 1024


class SlackFileError(Exception):
    """A file on a Slack message could not be downloaded."""


class FileDownloader:
    """Makes lazy, authenticated byte streams for Slack file objects."""

    def __init__(self, session: aiohttp.ClientSession, token: str) -> None:
        self._session = session
        self._token = token

    def fetcher(self, file: Mapping[str, Any]) -> FetchBytes:
        """The :data:`~bot.events.FetchBytes` for one file object of an event."""
        return lambda: self._stream(file)

    async def _stream(self, file: Mapping[str, Any]) -> AsyncIterator[bytes]:
        name = file.get("name") or file.get("id")
        url = file.get("url_private_download") or file.get("url_private")
        if not url:
            raise SlackFileError(f"Slack gave no download link for {name!r} (file_access={file.get('file_access')!r})")
        headers = {"Authorization": f"Bearer {self._token}"}
        async with self._session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_read=60)) as resp:
            if resp.status != 200:
                raise SlackFileError(f"downloading {name!r} failed: HTTP {resp.status}")
            # Slack answers a request it does not authorise with its HTML sign-in page (status 200).
            if resp.content_type == "text/html" and not str(file.get("mimetype", "")).startswith("text/html"):
                raise SlackFileError(f"downloading {name!r} failed: Slack refused the bot token (check files:read)")
            async for chunk in resp.content.iter_chunked(CHUNK):
                yield chunk
