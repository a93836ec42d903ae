"""The function names the model calls an MCP server's tools by: ``<server>__<tool>``.

OpenAI (and the other APIs the bot speaks) accept function names of at most 64 characters
of ``[a-zA-Z0-9_-]``. A tool whose ``<server>__<tool>`` already is one keeps it; any other is
made one deterministically: characters outside the set become ``_``, and the name is cut and
ends in ``_`` plus the first hex digits of the SHA-256 of the tool's own name, so that two
tools never share a function name (the digits grow where they still would). The server's
name holds no ``__`` (:data:`bot.mcp.settings.NAME_PATTERN`), so the first ``__`` of a function
name always ends the server's part.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

#: The longest function name the model APIs take.
MAX_NAME = 64
SEPARATOR = "__"
_ALLOWED = re.compile(r"^[A-Za-z0-9_-]+$")
_OUTSIDE = re.compile(r"[^A-Za-z0-9_-]")


def function_names(server: str, tools: Iterable[str]) -> dict[str, str]:
    """For each of ``server``'s ``tools`` (its own names), the function name the model sees;
    the same set of tools always gives the same names, none twice."""
    wanted = sorted(set(tools))
    names = {tool: f"{server}{SEPARATOR}{tool}" for tool in wanted if _plain(server, tool)}
    taken = set(names.values())  # distinct tools kept as they are never share a name
    for tool in wanted:
        if tool in names:
            continue
        for digits in (6, 12, 24, MAX_NAME):
            name = _made(server, tool, digits)
            if name not in taken:
                break
        names[tool] = name
        taken.add(name)
    return names


def split(function: str) -> tuple[str, str]:
    """``(server, tool part)`` of a function name (the tool part as the model saw it)."""
    server, _, tool = function.partition(SEPARATOR)
    return server, tool


def is_mcp_function(name: str) -> bool:
    """Whether ``name`` has the shape of an MCP tool's function name (the built-in tools'
    names, ``python`` and ``sql``, do not)."""
    return SEPARATOR in name


def _plain(server: str, tool: str) -> bool:
    name = f"{server}{SEPARATOR}{tool}"
    return len(name) <= MAX_NAME and _ALLOWED.match(tool) is not None


def _made(server: str, tool: str, digits: int) -> str:
    digest = hashlib.sha256(tool.encode("utf-8", "surrogatepass")).hexdigest()
    digits = min(digits, MAX_NAME - len(server) - len(SEPARATOR) - 1, len(digest))
    head = _OUTSIDE.sub("_", tool)[: MAX_NAME - len(server) - len(SEPARATOR) - 1 - digits]
    return f"{server}{SEPARATOR}{head}_{digest[:digits]}"
