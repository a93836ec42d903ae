"""Shared pieces for the agent tests: the scripted LLM server and a prepared-result runner."""

from __future__ import annotations

from typing import Any

from bot.agent import CodeRunner
from bot.config import LLMSettings
from kernels.seam.result import ExecutionResult
from tests.fakes.openai_server import ScriptedOpenAI


def llm_settings(server: ScriptedOpenAI, **overrides: Any) -> LLMSettings:
    """Settings pointing at ``server`` with test-sized timeouts and retries."""
    values: dict[str, Any] = {
        "model": "fake-model",
        "base_url": server.base_url,
        "api_key": "test-key",
        "request_timeout_s": 5.0,
        "max_retries": 2,
        "max_rounds": 5,
    }
    return LLMSettings(**{**values, **overrides})


class PreparedRunner:
    """A CodeRunner test double that returns prepared results in order and records the code
    it was given and the results it returned (as the bot's own runner collects them)."""

    def __init__(self, *results: ExecutionResult) -> None:
        self._results = list(results)
        self.codes: list[str] = []
        self.results: list[ExecutionResult] = []

    async def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
        self.codes.append(code)
        if not self._results:
            raise AssertionError(f"unexpected execution: {code!r}")
        result = self._results.pop(0)
        self.results.append(result)
        return result


class RecordingRunner:
    """A CodeRunner that runs code on another one (a real kernel session) and keeps every
    result, as the bot's turn runner does (``bot.turn``)."""

    def __init__(self, runner: CodeRunner) -> None:
        self._runner = runner
        self.results: list[ExecutionResult] = []

    async def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
        result = await self._runner.execute(code, timeout)
        self.results.append(result)
        return result


def assert_valid_transcript(messages: list[dict[str, Any]]) -> None:
    """Every assistant tool call has a tool result right after it; no tool result is orphaned."""
    pending: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in pending, f"orphan tool message {message}"
            pending.remove(message["tool_call_id"])
            continue
        assert not pending, f"tool calls without results: {pending}"
        if message["role"] == "assistant":
            pending = {call["id"] for call in message.get("tool_calls") or ()}
    assert not pending, f"tool calls without results: {pending}"
