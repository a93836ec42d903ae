"""How an ``sql`` call looks in the thread's notebook: a ``%%sql`` markdown cell with the
query, then the code cell that loaded its rows into the kernel (with its output).

Pure functions of the call's arguments, so that ``export`` finds the recorded cell of a call.
"""

from __future__ import annotations

import json
import keyword
from typing import Any

from bot.safetext import cut
from kernels import STATE_DIR

#: The model's tool name.
SQL_TOOL = "sql"
#: The DataFrame's name when the call names none.
DEFAULT_NAME = "result"


def code_span(text: str, limit: int = 80) -> str:
    """``text`` as one Markdown code span of at most ``limit`` characters for a status line: its
    backticks (which would end the span) as ``'``, cut with ``…``. Also the python step's label
    (:func:`bot.agent.steps.step_label`), so both read alike."""
    inner = cut(text.replace("`", "'"), max(limit - 2, 1))
    return f"`{inner}`"


def valid_name(name: str) -> bool:
    """Whether ``name`` can be the DataFrame's variable (a plain Python identifier)."""
    return name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("__") and len(name) <= 64


def parquet_file(name: str) -> str:
    """The rows' file in the workspace's :data:`~kernels.workspace.STATE_DIR`."""
    return f"sql-{name}.parquet"


def loader_code(name: str) -> str:
    """The code run in the kernel: the rows into the DataFrame ``name``, its first rows shown."""
    return f'{name} = __import__("pandas").read_parquet("{STATE_DIR}/{parquet_file(name)}")\n{name}.head()'


def arguments_of(raw: str | None) -> dict[str, Any]:
    """The call's arguments as a dict (empty when they are not a JSON object)."""
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def variable_of(arguments: dict[str, Any]) -> str:
    """The DataFrame's name a call asks for (``result`` by default)."""
    name = arguments.get("name")
    return name if isinstance(name, str) and name else DEFAULT_NAME


def notebook_code(raw_arguments: str | None) -> str:
    """The code cell an ``sql`` call was recorded as (see :func:`loader_code`)."""
    return loader_code(variable_of(arguments_of(raw_arguments)))


def notebook_markdown(raw_arguments: str | None) -> str:
    """The ``%%sql`` cell shown before it: source, variable and the query."""
    arguments = arguments_of(raw_arguments)
    query = arguments.get("query")
    source = arguments.get("source")
    head = "%%sql" + (f" {source}" if isinstance(source, str) and source else "") + f" → {variable_of(arguments)}"
    text = query.strip() if isinstance(query, str) else ""
    fence = "~~~~" if "```" in text else "```"
    return f"{fence}sql\n{head}\n{text}\n{fence}"
