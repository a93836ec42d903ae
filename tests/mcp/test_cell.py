"""An MCP call's cell in the notebook export (bot/mcp/cell.py)."""

from __future__ import annotations

import json

from bot.mcp.cell import fence_for, notebook_markdown


def fenced_body(cell: str) -> tuple[str, list[str]]:
    """The opening fence and the lines up to the first line that closes it (CommonMark: the
    same character, at least as long, nothing else on the line but up to 3 spaces before)."""
    lines = cell.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(("```", "~~~")))
    fence = lines[start].rstrip("json")
    body: list[str] = []
    for line in lines[start + 1 :]:
        stripped = line.strip()
        if len(line) - len(line.lstrip(" ")) <= 3 and stripped and set(stripped) == {fence[0]}:
            if len(stripped) >= len(fence):
                return fence, body
        body.append(line)
    raise AssertionError("the fence is never closed")


def test_arguments_holding_backtick_runs_stay_inside_the_fence() -> None:
    raw = "not json\n```\n````\n~~~~\nend"  # arguments that do not parse are shown as written
    fence, body = fenced_body(notebook_markdown("tracker__search", raw, "found"))
    assert body == raw.splitlines()
    assert fence == "`````"


def test_json_arguments_keep_a_plain_fence_and_are_indented() -> None:
    cell = notebook_markdown("tracker__search", json.dumps({"q": "a ``` b"}), None)
    fence, body = fenced_body(cell)
    assert fence == "````" and body == ["{", '  "q": "a ``` b"', "}"]
    assert fenced_body(notebook_markdown("tracker__echo", '{"text": "hi"}', None))[0] == "```"


def test_the_fence_is_longer_than_the_longest_backtick_run() -> None:
    assert fence_for("") == "```"
    assert fence_for("a ` b `` c") == "```"
    assert fence_for("```") == "````"
    assert fence_for("x" + "`" * 9 + "y") == "`" * 10
