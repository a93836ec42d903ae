"""Markdown tables → aligned code blocks (adapters/tables.py), as Discord and Slack show them."""

from __future__ import annotations

from adapters.tables import align_tables, display_width, split_row


def block(*lines: str) -> str:
    return "\n".join(["```", *lines, "```"])


def test_columns_are_padded_and_aligned_as_the_delimiter_row_says() -> None:
    text = "| name | n | mark |\n|:-----|--:|:----:|\n| alpha | 1 | x |\n| b | 12345 | yes |"
    assert align_tables(text) == block(
        "name  |     n | mark",
        "------+-------+-----",
        "alpha |     1 |  x",
        "b     | 12345 | yes",
    )


def test_tables_next_to_text_keep_the_text_around_them() -> None:
    text = "Here you go:\n| a | b |\n|---|---|\n| 1 | 2 |\nThat is all.\n\nBye."
    assert align_tables(text) == "Here you go:\n" + block("a | b", "--+--", "1 | 2") + "\nThat is all.\n\nBye."


def test_pipes_in_code_spans_and_escaped_pipes_stay_in_their_cell() -> None:
    assert split_row("| `a|b` | x \\| y | ``c | d`` |") == ["`a|b`", "x | y", "``c | d``"]
    text = "| expr | means |\n|---|---|\n| `x|y` | x or y |\n| a \\| b | pipe |"
    assert align_tables(text) == block(
        "expr  | means",
        "------+-------",
        "`x|y` | x or y",
        "a | b | pipe",
    )


def test_tables_inside_fences_are_left_alone() -> None:
    text = "```\n| a | b |\n|---|---|\n| 1 | 2 |\n```\n~~~~md\n| c | d |\n|---|---|\n~~~\n~~~~\nafter"
    assert align_tables(text) == text


def test_ragged_rows_are_padded_and_extra_cells_kept() -> None:
    text = "| a | b | c |\n|---|---|---|\n| 1 |\n| 1 | 2 | 3 | 4 |"
    assert align_tables(text) == block(
        "a | b | c",
        "--+---+---+--",
        "1",
        "1 | 2 | 3 | 4",
    )


def test_rows_without_outer_pipes_and_inline_markdown_kept_as_text() -> None:
    text = "a | **b**\n--|:-:\n[link](https://x.org) | *it*"
    assert align_tables(text) == block(
        "a                     | **b**",
        "----------------------+------",
        "[link](https://x.org) | *it*",
    )


def test_wide_characters_count_twice_and_combining_marks_not_at_all() -> None:
    assert display_width("日本") == 4 and display_width("e\u0301") == 1 and display_width("📊") == 2
    text = "| city | n |\n|---|---:|\n| 東京 | 1 |\n| Zu\u0308rich | 22 |"
    assert align_tables(text) == block(
        "city   |  n",
        "-------+---",
        "東京   |  1",
        "Zu\u0308rich | 22",
    )


def test_what_is_not_a_table_is_left_alone() -> None:
    for text in [
        "a | b\nno rule here",
        "| a | b |\n|---|",
        "---\n| x |",
        "just text | with a pipe",
        "| a |\n| - | - |",
        "a\n---\nb",
    ]:
        assert align_tables(text) == text, text


def test_triple_backticks_in_a_cell_cannot_close_the_block() -> None:
    result = align_tables("| code |\n|---|\n| ``` |")
    assert result.count("```") == 2 and result.startswith("```\n") and result.endswith("\n```")
