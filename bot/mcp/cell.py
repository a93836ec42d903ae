"""How an MCP tool call looks in the thread's notebook: a markdown cell naming the server and
the tool with the call's arguments, then the answer the model got, quoted.

Pure functions of what the store kept (the assistant's tool call and its tool message), so
``export`` needs nothing else; nothing in them comes from the server's settings, so no
credential can be in them.
"""

from __future__ import annotations

import json
import re

from bot.mcp.names import is_mcp_function, split

__all__ = ["is_mcp_function", "notebook_markdown"]

#: The answer quoted under the call is cut here (it is at most the bounded tool message).
MAX_QUOTED_CHARS = 10_000


def fence_for(text: str) -> str:
    """A backtick fence no line of ``text`` can close: longer than its longest run of backticks
    (a closing fence must be at least as long as the opening one, CommonMark 4.5)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def notebook_markdown(function: str, raw_arguments: str | None, answer: str | None) -> str:
    """The cell of one call of ``function`` (``<server>__<tool>``) with its arguments (JSON as
    the model wrote them, indented when they parse) and the ``answer`` it got."""
    server, tool = split(function)
    try:
        arguments = json.dumps(json.loads(raw_arguments or "{}"), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        arguments = str(raw_arguments)
    fence = fence_for(arguments)
    lines = [f"🔌 **MCP** `{server}` → `{tool}`", "", f"{fence}json", arguments, fence]
    said = (answer or "").strip()
    if said:
        if len(said) > MAX_QUOTED_CHARS:
            said = said[:MAX_QUOTED_CHARS] + "…"
        lines += ["", *(f"> {line}" if line else ">" for line in said.splitlines())]
    return "\n".join(lines)
