"""A running Threadbook (real Core, kernels, bolt) wired to a fake Slack and a scripted model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.slack import SlackAdapter
from bot.app import Core
from tests.conftest import make_settings
from tests.fakes.openai_server import ScriptedOpenAI
from tests.fakes.slack_server import FakeSlack

DONE_MARKS = frozenset({"white_check_mark", "x"})


@dataclass
class Bot:
    """Everything a Slack end-to-end test touches."""

    slack: FakeSlack
    llm: ScriptedOpenAI
    core: Core
    adapter: SlackAdapter

    @property
    def events_url(self) -> str:
        return f"http://127.0.0.1:{self.adapter.port}/slack/events"

    async def finished(self, event: dict[str, Any], timeout: float = 30.0) -> set[str]:
        """Wait until the turn for ``event`` ended (its ✅/❌ reaction); return its reactions."""
        key = (event["channel"], event["ts"])
        await self.slack.wait_for(lambda: DONE_MARKS & self.slack.reactions.get(key, set()), timeout)
        await self.adapter.wait_idle()
        return self.slack.reactions[key]

    def answers(self, event: dict[str, Any]) -> list[str]:
        """Texts the bot left in the event's thread (deleted status messages excluded)."""
        thread = event.get("thread_ts") or event["ts"]
        return [m.text for m in self.slack.bot_messages(event["channel"], thread)]


@asynccontextmanager
async def running_bot(
    tmp_path: Path,
    *,
    socket_mode: bool,
    streaming: bool = False,
    slack_config: dict[str, Any] | None = None,
    **config: Any,
) -> AsyncIterator[Bot]:
    """Start fake Slack, scripted model, Core and the Slack adapter; stop them in reverse.

    Answers are posted whole unless ``streaming`` (tests/slack/test_streaming.py covers that
    path; the rest check the text, parts and uploads of whole answers, also its fallback).
    ``slack_config``: more ``slack:`` keys; ``config``: more settings sections (``channels=...``).
    """
    async with FakeSlack() as slack, ScriptedOpenAI() as llm:
        slack_settings: dict[str, Any] = {
            "bot_token": slack.bot_token,
            "signing_secret": slack.signing_secret,
            "api_url": slack.api_url,
            "http_host": "127.0.0.1",
            "http_port": 0,
            "streaming": streaming,
            # Statuses show at once: the Stop button and status tests need not run a second
            # first (test_live.py covers the delay that keeps a quick turn's status unposted).
            "status_after_s": 0,
            **(slack_config or {}),
        }
        if socket_mode:
            slack_settings["app_token"] = slack.app_token
        settings = make_settings(
            tmp_path, llm_url=llm.base_url, slack=slack_settings, kernels={"max_kernels": 10}, **config
        )
        async with Core.open(settings) as core:
            adapter = SlackAdapter(settings.slack, core.dispatcher, channels=settings.channels)
            await adapter.start()
            try:
                yield Bot(slack, llm, core, adapter)
            finally:
                await adapter.stop()
