"""Downloading files users attach in Slack (``url_private_download`` + the bot token).

The bot token goes only to Slack's own hosts: ``files.slack.com`` (over https) and the host of
the configured ``slack.api_url`` (its scheme and port too: GovSlack, a proxy, the tests). A file
object whose URL names any other host is refused before any request is made; a redirect to
another origin is followed without the token (aiohttp drops ``Authorization`` there).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bot.events import FetchBytes, FetchRefused

log = logging.getLogger("threadbook.slack")

CHUNK = 256 * 1024
#: Where Slack serves files (``url_private`` / ``url_private_download``).
FILES_HOST = "files.slack.com"


class SlackFileError(Exception):
    """A file on a Slack message could not be downloaded."""


class FileDownloader:
    """Makes lazy, authenticated byte streams for Slack file objects."""

    def __init__(self, session: aiohttp.ClientSession, token: str, *, api_url: str) -> None:
        """``api_url``: the configured ``slack.api_url``, whose origin may receive the token too."""
        self._session = session
        self._token = token
        api = urlsplit(api_url)
        self._origins = frozenset({("https", FILES_HOST), (api.scheme.lower(), api.netloc.lower())})

    def fetcher(self, file: Mapping[str, Any]) -> FetchBytes:
        """The :data:`~bot.events.FetchBytes` for one file object of an event."""
        return lambda: self._stream(file)

    async def _stream(self, file: Mapping[str, Any]) -> AsyncIterator[bytes]:
        name = file.get("name") or file.get("id")
        url = file.get("url_private_download") or file.get("url_private")
        if not url:
            raise SlackFileError(f"Slack gave no download link for {name!r} (file_access={file.get('file_access')!r})")
        if not self.slack_hosted(str(url)):
            log.warning("Slack: refused to download %r from %s: not a Slack host", name, _host_of(str(url)))
            raise FetchRefused("its download link points outside Slack, and I fetch files only from Slack.")
        headers = {"Authorization": f"Bearer {self._token}"}
        async with self._session.get(
            url, headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_read=60)
        ) as resp:
            if resp.status != 200:
                raise SlackFileError(f"downloading {name!r} failed: HTTP {resp.status}")
            # Slack answers a request it does not authorise with its HTML sign-in page (status 200).
            if resp.content_type == "text/html" and not str(file.get("mimetype", "")).startswith("text/html"):
                raise SlackFileError(f"downloading {name!r} failed: Slack refused the bot token (check files:read)")
            async for chunk in resp.content.iter_chunked(CHUNK):
                yield chunk

    def slack_hosted(self, url: str) -> bool:
        """True when ``url`` is on one of Slack's hosts (the only ones given the bot token)."""
        try:
            parts = urlsplit(url)
        except ValueError:
            return False
        if parts.username is not None or parts.password is not None:
            return False
        return (parts.scheme.lower(), parts.netloc.lower()) in self._origins


def _host_of(url: str) -> str:
    try:
        return urlsplit(url).hostname or "no host"
    except ValueError:
        return "an unreadable address"
