"""The tool loop for one user message: ask the model, run its code, feed back, repeat.

Rules (DESIGN.md "Flow" step 4 and "Decisions"):

- One function tool, ``python(code)``. Every call runs in the thread's kernel, in order,
  also when one reply holds several calls. Errors in user code go back to the model.
- ``max_rounds`` counts tool calls (code runs) for this user message. A call with invalid
  JSON arguments or an unknown tool name counts too: it is a round the model spent, and
  counting it stops a model that keeps sending garbage. Other tools a turn is given (the
  ``sql`` tool of a channel with data sources: :class:`Tool`) are offered beside ``python``
  and their calls count as rounds too. When the model asks for a run past
  the limit, the call is answered "not run", the model is asked once (tools off) to sum up,
  and the user gets that summary with a note that the limit stopped the turn.
- A reply without tool calls but with ```` ```python ```` / ```` ```py ```` fences, or whose
  whole text is a JSON tool call (``{"name": "python", "arguments": {...}}``, also in
  ``<tool_call>`` tags, as small local models write them), runs that code (joined, as one
  round); the output goes back as a user-role message starting with
  :data:`~bot.agent.history.FENCED_OUTPUT_HEADER`. A reply with none of these is the answer.
- Once per turn, an answer to a data question given without running code that is a refusal
  or a bare number is answered with a request to use the tool (:mod:`bot.agent.nudge`); the
  refused answer and the request are sent in this turn only, never stored.
- A context-length refusal shrinks the replayed history (oldest exchanges first, whole) and
  the request is retried once.
- ``new_messages`` holds only what the model said and saw, and is always a valid transcript:
  every assistant tool call has its tool result. It is empty when a model request failed,
  so that a failed exchange never reaches the thread's history. Our own words (errors,
  limit and stop notes, the cut-off note) are in ``notice``: shown, never replayed.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import openai

from bot.agent.history import FENCED_OUTPUT_HEADER, history_chars, stored, trim_history
from bot.agent.llm import Completion, ContextLengthError, LLMClient, LLMError, ToolCall, Usage
from bot.agent.nudge import NUDGE, should_nudge
from bot.agent.observation import format_observation
from bot.agent.steps import step_label
from bot.config import LLMSettings
from kernels import ExecutionResult, KernelError, Outcome

log = logging.getLogger(__name__)

StopReason = Literal["answer", "max_rounds", "llm_error", "interrupted", "kernel_error", "budget"]
#: Awaited before each code run: (round, what the step does, the code).
OnStep = Callable[[int, str, str], Awaitable[None]]
#: Given the turn's usage so far, the sentence that stops it (a spent budget) or None.
BudgetCheck = Callable[[Usage], Awaitable[str | None]]

PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": (
            "Run Python code in this thread's persistent Jupyter kernel. The working directory is the "
            "thread's workspace. Returns stdout, stderr, the last expression's value, errors, and the "
            "files created or changed. Figures shown with plt.show() are sent to the user. "
            "display_dataframe_to_user(name, dataframe) shows a DataFrame to the user as a table (its "
            "first 100 rows; the whole of it attached as a CSV file). show_chart(data, x=column, "
            "y=column or [columns], kind='bar'|'line'|'area'|'pie', title=...) shows a simple chart that "
            "chat apps can draw natively (Plotly and Altair charts can be too; matplotlib stays a picture)."
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
_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_JSON_FENCE = re.compile(r"\A```(?:json)?[ \t]*\n(.*?)\n```\s*\Z", re.DOTALL | re.IGNORECASE)
#: Shown under an answer the server stopped at ``max_tokens``.
CUT_OFF_NOTE = "_(answer cut off at the length limit)_"
EMPTY_NOTE = "_(The model gave an empty answer.)_"
_WRAP_UP = (
    "The limit of {n} code runs for this message is reached, so no more code can run now. "
    "Answer the user with what you found so far and say briefly what is left to do."
)


class Drafts(Protocol):
    """Shows a reply while the model writes it, before the turn knows it is the answer."""

    async def draft(self, text: str) -> None:
        """The reply's text so far (it grows; a new reply starts from its beginning)."""

    async def drop_draft(self) -> None:
        """The reply shown so far is not the answer (it runs code): take it away."""


#: A reply starting like this, or holding a Python fence, is code to run, never shown as it comes.
_CODE_REPLY = re.compile(r"\A\s*(?:\{|<tool_call>|```)|```[ \t]*(?:python|py)\b", re.IGNORECASE)


class Tool(Protocol):
    """A tool offered beside ``python`` for one turn (e.g. :class:`bot.sources.tool.SqlTool`)."""

    @property
    def name(self) -> str:
        """The function name the model calls."""
        ...

    @property
    def spec(self) -> dict[str, Any]:
        """The OpenAI function tool definition, in the chat completions shape (``{"type":
        "function", "function": {...}}``; the Responses API is sent it flattened)."""
        ...

    async def call(self, arguments: str) -> str:
        """Run one call with its raw JSON ``arguments``; the text is the tool result."""
        ...


class CodeRunner(Protocol):
    """Runs code in a thread's kernel; :class:`kernels.KernelSession` satisfies it."""

    async def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
        """Run ``code`` and report what it produced."""
        ...


@dataclass
class TurnResult:
    """What one user message produced."""

    text: str  # final Markdown for the user: the model's answer and then ``notice``
    #: The model-visible transcript (user message first) to store and replay next turn;
    #: empty when a model request failed.
    new_messages: list[dict[str, Any]]
    usage: Usage
    stop_reason: StopReason
    #: Our own words at the end of ``text`` (error, limit or stop note, cut-off note), if any:
    #: store them as a notice, never as the model's words.
    notice: str = ""
    #: The model was asked once to use the tool (see :mod:`bot.agent.nudge`).
    nudged: bool = False
    #: The history was shrunk after a context-length refusal.
    shrunk: bool = False

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
        history_chars: int | None = None,
    ) -> None:
        self._settings = settings
        self._llm = LLMClient(settings, client=client)
        self._history_chars = settings.context_chars if history_chars is None else history_chars
        #: model → the history budget its server accepted after a context-length refusal.
        self._fitted: dict[str, int] = {}

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
        has_files: bool = False,
        drafts: Drafts | None = None,
        budget: BudgetCheck | None = None,
        tools: Sequence[Tool] = (),
    ) -> TurnResult:
        """Answer ``user_content``, running code in ``runner`` as the model asks.

        ``history`` is earlier turns' ``new_messages`` (trimmed here to the char budget;
        entries of roles the model does not know, such as stored notices, are skipped);
        ``on_step(round, label, code)`` is awaited before each execution (``label``:
        :func:`~bot.agent.steps.step_label`, the model's words when it gave them);
        ``has_files`` says files came with this message (for the nudge); ``drafts`` is shown
        each reply as it streams in, and told when a reply turns out not to be the answer;
        ``budget`` is asked before each code run whether the turn's tokens are still within
        budget (a sentence ends the turn there, the code not run); ``tools`` are offered beside ``python``.
        """
        user = {"role": "user", "content": user_content}
        model = model or self._settings.model
        replayed = trim_history(history, min(self._history_chars, self._fitted.get(model, self._history_chars)))
        turn = _Turn(
            llm=self._llm,
            messages=[{"role": "system", "content": system_prompt}, *replayed, user],
            new_messages=[user],
            runner=runner,
            model=model,
            max_rounds=max_rounds or self._settings.max_rounds,
            on_step=on_step,
            fitted=self._fitted,
            replayed=len(replayed),
            question=user_content,
            has_files=has_files,
            drafts=drafts,
            budget=budget,
            tools={tool.name: tool for tool in tools},
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
    replayed: int  # messages[1 : 1 + replayed] are earlier turns' history
    question: str
    has_files: bool
    drafts: Drafts | None = None
    budget: BudgetCheck | None = None
    tools: dict[str, Tool] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    fitted: dict[str, int] = field(default_factory=dict)  # the Agent's: model → history budget that fits
    rounds: int = 0
    nudged: bool = False
    shrunk: bool = False
    #: The reply being streamed has been shown as a draft; ``_code_reply``: it is code, not shown.
    _drafted: bool = False
    _code_reply: bool = False

    async def run(self) -> TurnResult:
        while True:
            try:
                reply = await self._ask()
            except LLMError as exc:
                await self._drop_draft()
                return self._failed(str(exc))
            if reply.tool_calls:
                await self._drop_draft()
                self._add(reply.message())
                if (spent := await self._over_budget()) is not None:
                    for call in reply.tool_calls:
                        self._add(_tool_message(call.id, "Not run: the token budget ran out."))
                    return self._finish("budget", spent)
                if (done := await self._run_tool_calls(reply.tool_calls, reply.content)) is not None:
                    return done
                continue
            content = reply.content or ""
            code = fenced_python(content) or text_tool_call(content)
            if code:
                await self._drop_draft()
            if not code:
                if should_nudge(
                    self.question, content, has_files=self.has_files, ran_code=self.rounds > 0, nudged=self.nudged
                ):
                    await self._drop_draft()
                    self.nudged = True
                    # Sent in this turn only: the stored transcript shows the tool use, not the refusal.
                    self.messages.extend([reply.message(), {"role": "user", "content": NUDGE}])
                    continue
                return self._answer(reply)
            if self.rounds >= self.max_rounds:
                return self._finish("max_rounds", self._limit_note(), said=content)
            if (spent := await self._over_budget()) is not None:
                return self._finish("budget", spent, said=content)
            self._add(reply.message())
            if (done := await self._run_fenced(code, content.split("```", 1)[0])) is not None:
                return done

    async def _ask(self, *, wrap_up: bool = False) -> Completion:
        while True:
            messages = self.messages
            if wrap_up:  # sent once, not kept in the history
                messages = [*messages, {"role": "user", "content": _WRAP_UP.format(n=self.max_rounds)}]
            self._code_reply = False
            try:
                reply = await self.llm.complete(
                    messages,
                    model=self.model,
                    tools=[PYTHON_TOOL, *(tool.spec for tool in self.tools.values())],
                    tool_choice="none" if wrap_up else None,
                    on_text=self._draft if self.drafts is not None else None,
                )
            except ContextLengthError as exc:
                if self.shrunk or not self._shrink(exc):
                    raise
                continue
            self.usage.add(reply.usage)
            return reply

    async def _over_budget(self) -> str | None:
        """The sentence of a token budget this turn has spent, before it runs more code."""
        return await self.budget(self.usage) if self.budget is not None else None

    async def _draft(self, text: str) -> None:
        """Show the streaming reply, unless it is (or turns into) code to run."""
        assert self.drafts is not None
        if self._code_reply:
            return
        if _CODE_REPLY.search(text):
            self._code_reply = True
            await self._drop_draft()
            return
        self._drafted = True
        await self.drafts.draft(text)

    async def _drop_draft(self) -> None:
        if self._drafted and self.drafts is not None:
            self._drafted = False
            try:
                await self.drafts.drop_draft()
            except Exception:  # cosmetic, as the draft itself
                log.exception("could not take a draft away")

    def _shrink(self, refusal: ContextLengthError) -> bool:
        """Drop the oldest replayed exchanges so the request fits; False when none are left.

        When the server named its limit and the request's size, the history is cut to fit
        that ratio with a margin (and by half at least); when it did not, to a quarter, since
        there is only one retry. The budget used is remembered for the model (``fitted``), so
        later turns start within it instead of being refused first.
        """
        history = self.messages[1 : 1 + self.replayed]
        if not history:
            return False
        self.shrunk = True
        total, replayed = history_chars(self.messages), history_chars(history)
        if refusal.limit and refusal.requested and refusal.requested > refusal.limit:
            fits = int(total * refusal.limit / refusal.requested * 0.8) - (total - replayed)
            budget = max(0, min(replayed // 2, fits))
        else:
            budget = replayed // 4
        self.fitted[self.model] = min(self.fitted.get(self.model, budget), budget)
        kept = trim_history(history, budget)
        log.warning("context length exceeded; replaying %d of %d history messages", len(kept), len(history))
        self.messages[1 : 1 + self.replayed] = kept
        self.replayed = len(kept)
        return True

    async def _run_tool_calls(self, calls: tuple[ToolCall, ...], said: str | None) -> TurnResult | None:
        """Run each call in order; every call gets a tool message, run or not. ``said``: the
        text the model sent with the calls (the first call's label)."""
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
            if (tool := self.tools.get(call.name)) is not None:
                self._add(_tool_message(call.id, await _call_tool(tool, call)))
                continue
            code, problem = _parse_call(call)
            if code is None:
                self._add(_tool_message(call.id, problem))
                continue
            outcome = await self._execute(code, said)
            said = None
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

    async def _run_fenced(self, code: str, said: str) -> TurnResult | None:
        self.rounds += 1
        outcome = await self._execute(code, said)
        if isinstance(outcome, KernelError):
            return self._finish("kernel_error", f"The Python kernel for this thread failed: {_one_line(outcome)}")
        self._add({"role": "user", "content": f"{FENCED_OUTPUT_HEADER}\n\n{format_observation(outcome)}"})
        if outcome.outcome is Outcome.INTERRUPTED:
            return self._finish("interrupted", self._interrupted_note())
        return None

    async def _execute(self, code: str, said: str | None = None) -> ExecutionResult | KernelError:
        if self.on_step is not None:
            try:
                await self.on_step(self.rounds, step_label(code, said), code)
            except Exception:  # progress is cosmetic; a failed status edit must not end the turn
                log.exception("on_step callback failed")
        try:
            return await self.runner.execute(code)
        except KernelError as exc:
            log.warning("kernel failed during a turn: %r", exc)
            return exc

    async def _wrap_up(self) -> TurnResult:
        """Ask once, with tools off, for a summary of what the runs found."""
        try:
            reply = await self._ask(wrap_up=True)
            summary = reply.content or ""
        except LLMError:
            summary = ""  # the runs happened and are kept; the failed request adds nothing
        return self._finish("max_rounds", self._limit_note(), said=summary)

    def _limit_note(self) -> str:
        return f"_Stopped after {_runs(self.rounds)}, the limit for one message. Reply “continue” to let me go on._"

    def _interrupted_note(self) -> str:
        return f"_Stopped on request after {_runs(self.rounds)}._"

    def _add(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        # The reply's reasoning items go back with this turn's requests only, never to the store.
        self.new_messages.append(stored(message))

    def _answer(self, reply: Completion) -> TurnResult:
        """The model's final answer; an empty or cut-off one gets a note."""
        said = strip_base64(reply.content or "").strip()
        notes = [EMPTY_NOTE] if not said else []
        if reply.cut_off:
            notes.append(CUT_OFF_NOTE)
        # An empty answer is stored as "" so the next user message still follows an assistant one.
        self._add({"role": "assistant", "content": said})
        return self._result("answer", said, " ".join(notes))

    def _finish(self, stop_reason: StopReason, notice: str, *, said: str = "") -> TurnResult:
        """End the turn with our ``notice``, after what the model ``said`` (stored) if anything."""
        said = strip_base64(said).strip()
        if said:
            self._add({"role": "assistant", "content": said})
        return self._result(stop_reason, said, notice)

    def _failed(self, sentence: str) -> TurnResult:
        """A model request failed: show the sentence, keep nothing of the turn's messages."""
        self.new_messages = []
        return self._result("llm_error", "", sentence)

    def _result(self, stop_reason: StopReason, said: str, notice: str) -> TurnResult:
        text = "\n\n".join(part for part in (said, notice) if part)
        return TurnResult(
            text=text,
            new_messages=self.new_messages,
            usage=self.usage,
            stop_reason=stop_reason,
            notice=notice,
            nudged=self.nudged,
            shrunk=self.shrunk,
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


def text_tool_call(text: str) -> str:
    """The code of ``python`` tool calls written as text, joined; ``""`` when there are none.

    Counts only when the whole reply is the call: a JSON object or list (optionally in a
    ```` ```json ```` fence) or ``<tool_call>`` tags around JSON, with ``name`` python and
    ``arguments`` (or ``parameters``) holding ``code``. JSON inside prose is left alone.
    """
    stripped = text.strip()
    if tags := _TOOL_CALL_TAG.findall(stripped):
        candidates = tags
    elif fence := _JSON_FENCE.match(stripped):
        candidates = [fence.group(1)]
    elif stripped.startswith(("{", "[")):
        candidates = [stripped]
    else:
        return ""
    codes: list[str] = []
    for candidate in candidates:
        try:
            parsed = json.loads(candidate)
        except json.JSONDecodeError:
            return ""
        for item in parsed if isinstance(parsed, list) else [parsed]:
            code = _code_of_call(item)
            if code is None:
                return ""
            codes.append(code)
    return "\n\n".join(codes)


def _code_of_call(item: object) -> str | None:
    if not isinstance(item, dict):
        return None
    function = item.get("function")
    if not isinstance(function, dict):
        function = item
    arguments = function.get("arguments", function.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if function.get("name") != "python" or not isinstance(code, str) or not code.strip():
        return None
    return code


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


async def _call_tool(tool: Tool, call: ToolCall) -> str:
    try:
        return await tool.call(call.arguments or "{}")
    except Exception as exc:  # the model is told, the turn goes on; the message could hold secrets
        log.exception("tool %s failed", call.name)
        return f"Error: the {call.name} tool failed ({type(exc).__name__}); nothing was loaded."


def _runs(count: int) -> str:
    return f"{count} code run{'' if count == 1 else 's'}"


def _tool_message(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:199] + "…"
