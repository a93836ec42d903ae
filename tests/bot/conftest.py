"""Fixtures of the end-to-end bot tests: a scripted model server and a running core."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from bot.app import Core
from tests.conftest import make_settings
from tests.fakes.openai_server import ScriptedOpenAI


@pytest_asyncio.fixture
async def llm() -> AsyncIterator[ScriptedOpenAI]:
    """A scripted OpenAI-compatible server (script it in the test)."""
    async with ScriptedOpenAI() as server:
        yield server


@pytest_asyncio.fixture
async def core(tmp_path: Path, llm: ScriptedOpenAI) -> AsyncIterator[Core]:
    """The bot's core with test settings, talking to ``llm``."""
    async with Core.open(make_settings(tmp_path, llm_url=llm.base_url)) as running:
        yield running
