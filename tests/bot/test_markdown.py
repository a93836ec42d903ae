"""The one Markdown reader (bot/markdown.py) and the outbound steps that build on it agree on
what is code: splitting, tables, links and Slack's mrkdwn."""

from __future__ import annotations

import re

import pytest

from adapters.discord import render as discord_render
from adapters.slack.format import to_mrkdwn
from adapters.slack.render import markdown_text
from adapters.tables import align_tables
from adapters.textsplit import split_markdown
from bot.markdown import Code, Prose, blocks, fence, lines
from bot.tables import answer_parts

DISGUISED = "[paypal.com](https://evil.example)"


def test_blocks_give_the_text_back_and_know_the_fence() -> None:
    text = "Intro\n\n```python  \nx = 1\n````\nafter\n~~~\nopen to the end"
    read = blocks(text)
    assert [type(b).__name__ for b in read] == ["Prose", "Code", "Prose", "Code"]
    assert "\n".join(line for b in read for line in b.lines) == text
    code = read[1]
    assert isinstance(code, Code)
    assert (code.fence.marker, code.fence.info, code.body, code.closing) == ("```", "python", ("x = 1",), "````")
    last = read[3]
    assert isinstance(last, Code) and last.closing is None and last.body == ("open to the end",)
    assert read[2] == Prose(("after",))


@pytest.mark.parametrize(
    ("line", "opens"),
    [
        ("```", True),
        ("   ~~~~ py", True),
        ("```python title=x.py", True),
        ("    ```", False),  # indented code, not a fence
        ("``", False),
        ("```x```", False),  # inline code on a line of its own
        ("~~~ a`b", True),  # only a backtick fence forbids backticks after it
    ],
)
def test_what_opens_a_fence(line: str, opens: bool) -> None:
    assert (fence(line) is not None) == opens


@pytest.mark.parametrize(
    ("opening", "line", "closes"),
    [
        ("```", "```", True),
        ("```", "`````", True),  # at least as long
        ("````", "```", False),
        ("```", "~~~", False),  # the same character
        ("```", "```python", False),  # nothing after it
        ("```", "   ```  ", True),
        ("```", "    ```", False),  # four spaces: a line of code
    ],
)
def test_what_closes_a_fence(opening: str, line: str, closes: bool) -> None:
    opened = fence(opening)
    assert opened is not None and opened.closes(line) == closes


def test_lines_say_where_each_line_stands() -> None:
    kinds = [(line.kind, line.in_code) for line in lines("a\n~~~\nb\n~~~\nc")]
    assert kinds == [("prose", False), ("open", True), ("code", True), ("close", True), ("prose", False)]


def test_every_step_reads_a_one_line_code_span_as_prose() -> None:
    """```` ```x``` ```` opens no block: what follows it is prose for every step."""
    text = f"```x```\n{DISGUISED}\n| a | b |\n|---|---|\n| 1 | 2 |"
    assert "https://evil.example" in markdown_text(text).text and "](https://evil" not in markdown_text(text).text
    assert "paypal.com <https://evil.example>" in discord_render.text(text)
    assert [type(p).__name__ for p in answer_parts(text)] == ["str", "Table"]
    assert "a | b" in align_tables(text) and "a | b" in to_mrkdwn(text)


def test_a_longer_closing_fence_ends_the_block_for_every_step() -> None:
    text = f"```\ncode\n`````\n{DISGUISED}\n| a | b |\n|---|---|"
    assert "](https://evil" not in discord_render.text(text)
    assert [type(p).__name__ for p in answer_parts(text)] == ["str", "Table"]
    assert to_mrkdwn(text).startswith("```\ncode\n```\n")
    chunks = split_markdown("```\n" + "code line\n" * 30 + "`````\n" + "prose line\n" * 30, 120)
    assert not any(chunk.endswith("prose line\n```") or chunk.startswith("```\nprose") for chunk in chunks)


def test_a_fence_with_words_after_it_is_code_in_slack_mrkdwn() -> None:
    assert to_mrkdwn("```python title=a.py\nx = **1**\n```") == "```\nx = **1**\n```"


def test_the_discord_answer_is_tables_and_links_in_one_reading() -> None:
    text = f"Totals:\n| a | b |\n|---|---|\n| 1 | 2 |\n\n{DISGUISED}\n```\n{DISGUISED}\n```"
    assert discord_render.answer(text) == discord_render.text(align_tables(text))
    assert discord_render.answer(text).endswith(f"paypal.com <https://evil.example>\n```\n{DISGUISED}\n```")


def _balanced(chunk: str) -> bool:
    return len(re.findall(r"^```", chunk, flags=re.M)) % 2 == 0


@pytest.mark.parametrize("size", [50, 300, 700, 2000])
def test_the_last_chunk_has_a_limit_of_its_own(size: int) -> None:
    code = "\n".join(f"row_{i} = {i}" for i in range(size // 10))
    text = "Intro words here.\n\n```python\n" + code + "\n```\n\n" + "Closing words. " * (size // 15)
    chunks = split_markdown(text, 300, last=120)
    assert chunks and all(len(c) <= 300 and _balanced(c) for c in chunks)
    assert len(chunks[-1]) <= 120
    assert all(f"row_{i} = {i}" in "\n".join(chunks) for i in range(size // 10))
    assert split_markdown(text, 300)[:-1] == chunks[: len(split_markdown(text, 300)) - 1]


@pytest.mark.parametrize(("limit", "last"), [(2000, None), (3800, 2900)])
def test_no_chunk_is_over_the_limit_when_a_paragraph_break_leaves_too_much(limit: int, last: int | None) -> None:
    """A long item after a short one in the paragraph after the break: the item starts a chunk
    (it was added to the short one whatever their size)."""

    def words(n: int) -> str:
        return " ".join(["word"] * (n // 5))

    text = words(limit * 6 // 10) + "\n\n- " + words(limit * 3 // 10) + "\n- " + words(limit * 3 // 4)
    text += "\n\n" + words(limit * 3 // 10)
    chunks = split_markdown(text, limit, last=last)
    assert all(len(chunk) <= limit for chunk in chunks) and len(chunks[-1]) <= (last or limit)
    assert "".join(chunks).replace("\n", "").replace(" ", "") == text.replace("\n", "").replace(" ", "")
