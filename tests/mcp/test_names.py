"""The function names the model calls MCP tools by."""

from __future__ import annotations

import re

from bot.mcp.names import MAX_NAME, function_names, is_mcp_function, split

VALID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def test_plain_names_are_server_and_tool() -> None:
    assert function_names("tracker", ["search", "get-issue"]) == {
        "search": "tracker__search",
        "get-issue": "tracker__get-issue",
    }


def test_other_names_are_made_valid_deterministically_and_never_shared() -> None:
    tools = ["issues.search", "issues/search", "issues search", "issues_search", "é" * 80, "x" * 70]
    names = function_names("a-rather-long-server-name-here", tools)
    assert len(set(names.values())) == len(tools)
    assert all(VALID.match(name) and len(name) <= MAX_NAME for name in names.values())
    assert names["issues_search"] == "a-rather-long-server-name-here__issues_search"  # valid as it is: kept
    assert names["issues.search"].startswith("a-rather-long-server-name-here__issues_search_")
    assert function_names("a-rather-long-server-name-here", reversed(tools)) == names  # order does not matter


def test_a_made_name_that_equals_a_kept_one_gets_more_digits() -> None:
    odd = "a.b"
    first = function_names("s", [odd])[odd]
    kept = first.removeprefix("s__")  # a tool whose own name is the made name of another
    names = function_names("s", [odd, kept])
    assert names[kept] == f"s__{kept}" and names[odd] != names[kept] and len(set(names.values())) == 2


def test_split_and_shape() -> None:
    assert split("tracker__get__issue") == ("tracker", "get__issue")
    assert is_mcp_function("tracker__search") and not is_mcp_function("python") and not is_mcp_function("sql")
