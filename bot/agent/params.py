"""Request parameters that servers and models differ on, and what each model is known to refuse.

Reasoning models (OpenAI's o-series and GPT-5 family) take ``max_completion_tokens`` instead of
``max_tokens`` and no ``temperature``: known by name, they are asked that way from the start.
Any other model that answers HTTP 400 naming one of the optional parameters we send is asked
again once without it (or with the parameter the server names instead, "use
'max_completion_tokens' instead"), and :class:`ParamMemory` keeps that for the model for the
rest of the process.
"""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger(__name__)

#: o1, o3-mini, o4-mini-2025-04-16, gpt-5, gpt-5.1-mini, and behind a provider prefix (openai/o3).
_REASONING_MODEL = re.compile(r"(?:^|/)(?:o[1-9]|gpt-5)(?:$|[-.:_])", re.IGNORECASE)

#: The optional parameters a refusal may name: what we send besides the model and the messages.
#: ``stream``/``stream_options`` are not here: a server that will not stream is asked plainly.
ADJUSTABLE = (
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "temperature",
    "tool_choice",
    "parallel_tool_calls",
    "store",
    "include",
)
#: Names plain enough to be found unquoted in a refusal's words (vLLM's and Azure's validation
#: messages name the field bare); ``store`` and ``include`` are everyday words, so they count only
#: when the error's ``param`` names them, or quoted.
_UNQUOTED = {
    param: re.compile(rf"(?<![\w.]){param}(?!\w)")
    for param in ("max_tokens", "max_completion_tokens", "max_output_tokens", "temperature", "tool_choice")
}
_INSTEAD = re.compile(r"\buse\s+['\"`]?(\w+)['\"`]?\s+instead", re.IGNORECASE)
#: OpenAI, when a model without reasoning is asked for ``include: ["reasoning.encrypted_content"]``.
_ENCRYPTED = re.compile(r"encrypted[ _]content", re.IGNORECASE)


def is_reasoning_model(model: str) -> bool:
    """True for models known by name to reason (o-series, GPT-5 family)."""
    return _REASONING_MODEL.search(model) is not None


def refused_param(message: str, error_param: object, body: dict[str, Any]) -> tuple[str, str | None] | None:
    """``(parameter, replacement or None)`` when a 400's ``message`` (or its ``param`` field)
    names an optional parameter that ``body`` carries; None when it names none of them."""
    named = [error_param] if isinstance(error_param, str) and error_param in ADJUSTABLE else []
    for param in ADJUSTABLE:
        if param not in body:
            continue
        pattern = _UNQUOTED.get(param)
        if (pattern is not None and pattern.search(message)) or any(
            f"{quote}{param}{quote}" in message for quote in "'\"`"
        ):
            named.append(param)
    if "include" in body and _ENCRYPTED.search(message):
        named.append("include")
    refused = next((p for p in named if p in body), None)
    if refused is None:
        return None
    instead = _INSTEAD.search(message)
    replacement = instead.group(1) if instead is not None else None
    return refused, replacement if replacement in ADJUSTABLE and replacement != refused else None


class ParamMemory:
    """The parameters each model's server refused, for the process: model → parameter →
    the parameter to send instead (None: leave it out)."""

    def __init__(self) -> None:
        self._by_model: dict[str, dict[str, str | None]] = {}

    def apply(self, model: str, body: dict[str, Any]) -> None:
        """Rename or drop in ``body`` what ``model`` is known to refuse."""
        for param, replacement in self._by_model.get(model, {}).items():
            if param in body:
                value = body.pop(param)
                if replacement is not None and replacement not in body:
                    body[replacement] = value

    def learn(self, model: str, param: str, replacement: str | None, why: str) -> None:
        """Remember that ``model`` refused ``param``; ``why`` is the server's words, for the log."""
        self._by_model.setdefault(model, {})[param] = replacement
        instead = f"'{replacement}' instead" if replacement else "without it"
        log.warning("the LLM server refused '%s' for model %s (%s); asking %s from now on", param, model, why, instead)
