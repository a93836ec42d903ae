"""A scripted "oracle model" for the quality bench's self-test (``python -m bench.quality --scripted``).

It plays a perfect model on :class:`tests.fakes.openai_server.ScriptedOpenAI`: for each new
question it calls the ``python`` tool with the question's oracle code, then answers with the
tool's output (which holds the ``ANSWER:`` line the real kernel printed). Questions listed
as ``wrong`` get a confident wrong answer and no code, so the bench must report them failed.
The bench's grading, the real agent loop and real kernels all run as with a real model.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from bench.quality_questions import Question
from tests.fakes.openai_server import Step, answer, tool_call

WRONG_ANSWER = "I did not need to run any code for this.\n\nANSWER: -1"


def oracle(questions: Sequence[Question], wrong: Collection[str] = ()) -> Callable[[dict[str, Any]], Step]:
    """A script step (request → reply) answering every question in ``questions``; reusable for any number of requests."""

    def step(request: dict[str, Any]) -> Step:
        messages = request["messages"]
        if messages[-1]["role"] == "tool":
            return answer(f"Here is the result.\n\n{messages[-1]['content']}")
        # The first user message of the question's thread (a later one may be the loop's nudge).
        asked = [str(m["content"]) for m in messages if m["role"] == "user"]
        question = next((q for text in reversed(asked) for q in questions if text.startswith(q.message)), None)
        if question is None:
            return answer("I do not know this question.")
        if question.id in wrong:
            return answer(WRONG_ANSWER)
        return tool_call(question.oracle)

    return step
