"""Calling the Slack Web API without letting one failed call take a turn down."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass

import aiohttp
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

log = logging.getLogger("threadbook.slack")


@dataclass(frozen=True, slots=True)
class Failure:
    """A Web API call that did not succeed: the method and Slack's error code (or the exception)."""

    method: str
    error: str


def make_client(token: str, api_url: str) -> AsyncWebClient:
    """The Web API client: ``api_url`` as base (GovSlack, proxies, tests), retries on 429 and resets."""
    return AsyncWebClient(
        token=token,
        base_url=api_url if api_url.endswith("/") else api_url + "/",
        timeout=30,
        retry_handlers=[
            AsyncConnectionErrorRetryHandler(max_retry_count=2),
            AsyncRateLimitErrorRetryHandler(max_retry_count=3),
        ],
    )


async def call(
    method: str, request: Awaitable[AsyncSlackResponse], *, expected: frozenset[str] = frozenset()
) -> AsyncSlackResponse | Failure:
    """Await ``request``; log a failure with the method name and return it instead of raising.

    Error codes in ``expected`` (e.g. ``already_reacted``) are logged at debug level only.
    """
    try:
        return await request
    except SlackApiError as exc:
        data = exc.response.data  # not a dict when a proxy or load balancer answered
        error = str((data.get("error") if isinstance(data, dict) else None) or f"HTTP {exc.response.status_code}")
    except (TimeoutError, SlackRequestError, aiohttp.ClientError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    level = logging.DEBUG if error in expected else logging.WARNING
    log.log(level, "slack %s failed: %s", method, error)
    return Failure(method, error)
