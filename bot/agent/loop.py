"""The tool loop for one user message: ask the model, run its code, feed back, repeat.

Rules (DESIGN.md "Flow" step 4 and "Decisions"):

- One function tool, ``python(code)``. Every call runs in the thread's kernel, in order,
  also when one reply holds several calls. Errors in user code go back to the model.
- ``max_rounds`` counts tool calls (code runs) for this user message. A call with invalid
  JSON arguments or an unknown tool name counts too: it is a round the model spent, and
  counting it stops a model that keeps sending garbage. When the model asks for a run past
  the limit, the call is answered "not run", the model is asked once (tools off) to sum up,
  and the user gets that summary with a note that the limit stopped the turn.
- A reply without tool calls but with ```` ```python ```` / ```` ```py ```` fences runs those
  blocks (joined, as one round); the output goes back as a user-role message starting with
  :data:`~bot.agent.history.FENCED_OUTPUT_HEADER`. A reply with neither is the answer.
- ``new_messages`` is always a valid transcript: every assistant tool call has its tool
  result, and it ends with an assistant message holding the text the user was shown.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import openai

from bot.agent.history import FENCED_OUTPUT_HEADER, trim_history
from bot.agent.llm import Completion, LLMClient, LLMError, ToolCall, Usage
from bot.agent.observation import format_observation
from bot.config import LLMSettings
from kernels.result import ExecutionResult, KernelError, Outcome

log = logging.getLogger(__name__)

StopReason = Literal["answer", "max_rounds", "llm_error", "interrupted", "kernel_error"]
OnStep = Callable[[int, str], Awaitable[None]]

PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": (
            "Run Python code in this thread's persistent Jupyter kernel. The working directory is the "
            "thread's workspace. Returns stdout, stderr, the last expression's value, errors, and the "
            "files created or changed. Figures shown with plt.show() are sent to the user."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}

_FENCE = re.compile(r"^```[ \t]*(?:python|py)[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE | re.IGNORECASE)
_DATA_URI_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*data:[^)]*\)")
_DATA_URI = re.compile(r"data:[\w.+-]+/[\w.+-]+;base64,[A-Za-z0-9+/=\s]{16,}")
_WRAP_UP = (
    "The limit of {n} code runs for this message is reached, so no more code can run now. "
    "Answer the user with what you found so far and say briefly what is left to do."
)


class CodeRunner(Protocol):
    """Runs code in a thread's kernel; :class:`kernels.KernelSession` satisfies it."""

    async def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
        """Run ``code`` and report what it produced."""
        ...


@dataclass
class CellRun:
    """One code execution during a turn."""

    code: str
    result: ExecutionResult
    started_at: float


@dataclass
class TurnResult:
    """What one user message produced."""

    text: str  # final Markdown for the user, with a note when the turn did not end normally
    new_messages: list[dict[str, Any]]  # user message first; replay as history next turn
    cells: list[CellRun]
    usage: Usage
    stop_reason: StopReason

    @property
    def ok(self) -> bool:
        """True when the model gave its answer."""
        return self.stop_reason == "answer"


class Agent:
    """Runs turns against one OpenAI-compatible endpoint."""

    def __init__(
        self,
        settings: LLMSettings,
        *,
        client: openai.AsyncOpenAI | None = None,
        history_chars: int = 48_000,
    ) -> None:
        self._settings = settings
        self._llm = LLMClient(settings, client=client)
        self._history_chars = history_chars

    async def close(self) -> None:
        """Close the HTTP connections to the LLM endpoint."""
        await self._llm.close()

    async def run_turn(
        self,
        *,
        history: list[dict[str, Any]],
        user_content: str,
        runner: CodeRunner,
        system_prompt: str,
        model: str | None = None,
        max_rounds: int | None = None,
        on_step: OnStep | None = None,
    ) -> TurnResult:
        """Answer ``user_content``, running code in ``runner`` as the model asks.

        ``history`` is earlier turns' ``new_messages`` (trimmed here to the char budget);
        ``on_step(round, first_line_of_code)`` is awaited before each execution.
        """
        user = {"role": "user", "content": user_content}
        messages = [{"role": "system", "content": system_prompt}, *trim_history(history, self._history_chars), user]
        turn = _Turn(
            llm=self._llm,
            messages=messages,
            new_messages=[user],
            runner=runner,
            model=model or self._settings.model,
            max_rounds=max_rounds or self._settings.max_rounds,
            on_step=on_step,
        )
        return await turn.run()


@dataclass
class _Turn:
    """The mutable state of one turn."""

    llm: LLMClient
    messages: list[dict[str, Any]]  # everything sent to the model
    new_messages: list[dict[str, Any]]  # what this turn adds to the thread's history
    runner: CodeRunner
    model: str
    max_rounds: int
    on_step: OnStep | None
    cells: list[CellRun] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    rounds: int = 0

    async def run(self) -> TurnResult:
        while True:
            try:
                reply = await self._ask()
            except LLMError as exc:
                return self._finish("llm_error", str(exc))
            if reply.tool_calls:
                self._add(reply.message())
                if (done := await self._run_tool_calls(reply.tool_calls)) is not None:
                    return done
                continue
            code = fenced_python(reply.content or "")
            if not code:
                return self._finish("answer", reply.content or "")
            if self.rounds >= self.max_rounds:
                return self._finish("max_rounds", f"{reply.content}\n\n{self._limit_note()}")
            self._add(reply.message())
            if (done := await self._run_fenced(code)) is not None:
                return done

    async def _ask(self, *, wrap_up: bool = False) -> Completion:
        messages = self.messages
        if wrap_up:  # sent once, not kept in the history
            messages = [*messages, {"role": "user", "content": _WRAP_UP.format(n=self.max_rounds)}]
        reply = await self.llm.complete(
            messages, model=self.model, tools=[PYTHON_TOOL], tool_choice="none" if wrap_up else None
        )
        self.usage.add(reply.usage)
        return reply

    async def _run_tool_calls(self, calls: tuple[ToolCall, ...]) -> TurnResult | None:
        """Run each call in order; every call gets a tool message, run or not."""
        stop: StopReason | None = None
        kernel_failure = ""
        for call in calls:
            if stop is not None:
                self._add(_tool_message(call.id, f"Not run: {_SKIPPED[stop]}"))
                continue
            if self.rounds >= self.max_rounds:
                stop = "max_rounds"
                self._add(_tool_message(call.id, f"Not run: {_SKIPPED[stop]}"))
                continue
            self.rounds += 1
            code, problem = _parse_call(call)
            if code is None:
                self._add(_tool_message(call.id, problem))
                continue
            outcome = await self._execute(code)
            if isinstance(outcome, KernelError):
                stop, kernel_failure = "kernel_error", _one_line(outcome)
                self._add(_tool_message(call.id, f"The kernel could not run the code: {kernel_failure}"))
                continue
            self._add(_tool_message(call.id, format_observation(outcome)))
            if outcome.outcome is Outcome.INTERRUPTED:
                stop = "interrupted"
        if stop == "max_rounds":
            return await self._wrap_up()
        if stop == "interrupted":
            return self._finish("interrupted", self._interrupted_note())
        if stop == "kernel_error":
            return self._finish("kernel_error", f"The Python kernel for this thread failed: {kernel_failure}")
        return None

    async def _run_fenced(self, code: str) -> TurnResult | None:
        self.rounds += 1
        outcome = await self._execute(code)
        if isinstance(outcome, KernelError):
            return self._finish("kernel_error", f"The Python kernel for this thread failed: {_one_line(outcome)}")
        self._add({"role": "user", "content": f"{FENCED_OUTPUT_HEADER}\n\n{format_observation(outcome)}"})
        if outcome.outcome is Outcome.INTERRUPTED:
            return self._finish("interrupted", self._interrupted_note())
        return None

    async def _execute(self, code: str) -> ExecutionResult | KernelError:
        if self.on_step is not None:
            try:
                await self.on_step(self.rounds, first_line(code))
            except Exception:  # progress is cosmetic; a failed status edit must not end the turn
                log.exception("on_step callback failed")
        started = time.time()
        try:
            result = await self.runner.execute(code)
        except KernelError as exc:
            log.warning("kernel failed during a turn: %r", exc)
            return exc
        self.cells.append(CellRun(code=code, result=result, started_at=started))
        return result

    async def _wrap_up(self) -> TurnResult:
        """Ask once, with tools off, for a summary of what the runs found."""
        try:
            reply = await self._ask(wrap_up=True)
            summary = (reply.content or "").strip()
        except LLMError:
            summary = ""
        note = self._limit_note()
        return self._finish("max_rounds", f"{summary}\n\n{note}" if summary else note)

    def _limit_note(self) -> str:
        return f"_Stopped after {_runs(self.rounds)}, the limit for one message. Reply “continue” to let me go on._"

    def _interrupted_note(self) -> str:
        return f"_Stopped on request after {_runs(self.rounds)}._"

    def _add(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.new_messages.append(message)

    def _finish(self, stop_reason: StopReason, text: str) -> TurnResult:
        text = strip_base64(text).strip() or "_(The model gave an empty answer.)_"
        self._add({"role": "assistant", "content": text})
        return TurnResult(
            text=text, new_messages=self.new_messages, cells=self.cells, usage=self.usage, stop_reason=stop_reason
        )


_SKIPPED: dict[StopReason, str] = {
    "max_rounds": "the limit of code runs for this message was reached.",
    "interrupted": "the user stopped the execution.",
    "kernel_error": "the kernel failed.",
}


def fenced_python(text: str) -> str:
    """The ```` ```python ```` / ```` ```py ```` blocks of ``text``, joined; ``""`` when none."""
    blocks = [m.group(1).strip("\n") for m in _FENCE.finditer(text)]
    return "\n\n".join(b for b in blocks if b.strip())


def first_line(code: str, limit: int = 80) -> str:
    """The first non-blank line of ``code``, shortened for a status message."""
    line = next((ln.strip() for ln in code.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def strip_base64(text: str) -> str:
    """Replace inline base64 data (data: URIs, also as Markdown images) with a short marker."""
    return _DATA_URI.sub("[data omitted]", _DATA_URI_IMAGE.sub("[image omitted]", text))


def _parse_call(call: ToolCall) -> tuple[str | None, str]:
    """``(code, "")`` for a good ``python`` call, else ``(None, message for the model)``."""
    if call.name != "python":
        return None, f"Error: there is no tool named {call.name!r}. The only tool is python(code)."
    try:
        arguments = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as exc:
        return None, (
            f"Error: the tool arguments were not valid JSON ({exc.msg} at position {exc.pos}); nothing ran. "
            'Call python again with arguments like {"code": "print(1)"}, escaping quotes and newlines.'
        )
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if not isinstance(code, str) or not code.strip():
        return None, 'Error: the python tool needs a non-empty string argument "code"; nothing ran.'
    return code, ""


def _runs(count: int) -> str:
    return f"{count} code run{'' if count == 1 else 's'}"


def _tool_message(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:199] + "…"
