"""The LLM tool loop: the model writes Python, the thread's kernel runs it, repeat.

``Agent.run_turn`` answers one user message; ``build_system_prompt`` says what the model
must know about its workspace; ``format_observation`` is what the model sees of a run.
"""

from bot.agent.history import trim_history
from bot.agent.llm import ContextLengthError, LLMClient, LLMError, Usage
from bot.agent.loop import CUT_OFF_NOTE, PYTHON_TOOL, Agent, CodeRunner, StopReason, TurnResult
from bot.agent.observation import format_observation
from bot.agent.prompt import PromptFile, build_system_prompt

__all__ = [
    "CUT_OFF_NOTE",
    "PYTHON_TOOL",
    "Agent",
    "CodeRunner",
    "ContextLengthError",
    "LLMClient",
    "LLMError",
    "PromptFile",
    "StopReason",
    "TurnResult",
    "Usage",
    "build_system_prompt",
    "format_observation",
    "trim_history",
]
