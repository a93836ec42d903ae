"""The nudge heuristics: small, explicit, and never for chit-chat."""

from __future__ import annotations

import pytest

from bot.agent.nudge import is_bare_number, is_data_question, is_refusal, should_nudge


@pytest.mark.parametrize(
    "text",
    [
        "what is the total of sales.csv?",
        "Average amount per month",
        "how many rows are there",
        "plot it",
        "sum the amount column",
        "which file has more data?",
        "open the Excel sheet",
    ],
)
def test_data_questions(text: str) -> None:
    assert is_data_question(text)


@pytest.mark.parametrize("text", ["hi", "Hello!", "thanks", "thank you :)", "ok", "good morning", "who are you?"])
def test_chit_chat_is_not_a_data_question(text: str) -> None:
    assert not is_data_question(text)


def test_attachments_make_a_data_question() -> None:
    assert is_data_question("look at this", has_files=True)
    assert not is_data_question("thanks", has_files=True)  # a thank-you with a file is still chit-chat


@pytest.mark.parametrize(
    "answer",
    [
        "I can't access files.",
        "I’m unable to open attachments.",
        "As an AI, I do not have access to your data.",
        "You can use the following code:\n```python\nprint(1)\n```",
    ],
)
def test_refusals(answer: str) -> None:
    assert is_refusal(answer)


def test_bare_numbers() -> None:
    assert is_bare_number("The total is 600.")
    assert is_bare_number("42")
    assert not is_bare_number("The file has a column per month.")
    assert not is_bare_number("Run:\n```python\nprint(1)\n```")
    assert not is_bare_number("x" * 400 + " 7")


def test_should_nudge_once_and_only_without_code() -> None:
    question = "what is the total amount?"
    assert should_nudge(question, "It is 600.", ran_code=False, nudged=False)
    assert not should_nudge(question, "It is 600.", ran_code=False, nudged=True)
    assert not should_nudge(question, "It is 600.", ran_code=True, nudged=False)
    assert not should_nudge(question, "The amounts are in the amount column.", ran_code=False, nudged=False)
    assert not should_nudge("hi", "Hi! 1 question at a time, please.", ran_code=False, nudged=False)
