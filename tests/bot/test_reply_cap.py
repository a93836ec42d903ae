"""A long answer stays a few chat messages; the whole text comes along as a file."""

from __future__ import annotations

from bot.turn import FULL_ANSWER_NAME, MAX_REPLY_CHARS, cap_answer


def test_short_answers_are_untouched() -> None:
    assert cap_answer("42") == ("42", None)


def test_a_20_mb_answer_becomes_a_short_text_and_a_file() -> None:
    answer = "\n".join(f"line {i}: " + "x" * 60 for i in range(300_000))
    text, full = cap_answer(answer)
    assert len(text) <= MAX_REPLY_CHARS + 200
    assert FULL_ANSWER_NAME in text and f"{len(answer):,} characters" in text
    assert full is not None and full.name == FULL_ANSWER_NAME and full.size == len(answer.encode())
    with full.open_reader() as reader:
        assert reader.read().decode() == answer
    with full.open_reader() as again:  # every upload attempt gets a fresh reader
        assert again.read(4) == b"line"
    assert text.split("\n\n_…")[0].endswith("x")  # cut at the end of a whole line
