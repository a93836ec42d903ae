"""When to ask the model, once, to use the ``python`` tool instead of answering from thin air.

The loop nudges when all of these hold (see :func:`should_nudge`): no code ran in this turn,
the user's message asked about data (attachments came with it, or it uses words such as
*sum*, *average*, *plot*, *how many*, *csv*, *column*), and the model's answer is a refusal
("I can't access files…") or a bare claim of a number ("The total is 600."). Chit-chat
(``hi``, ``thanks``) never matches. The heuristics are small on purpose: a missed nudge
costs one weak answer, a wrong one costs one extra request.
"""

from __future__ import annotations

import re

NUDGE = (
    "You answered without running any code. Use the `python` tool now: read the data (files "
    "attached to the thread are in the kernel's working directory) and compute the answer, "
    "then reply with the result. Do not guess numbers and do not say you cannot access the files."
)

_CHIT_CHAT = re.compile(
    r"^\s*(hi|hello|hey|hiya|yo|thanks|thank you|thx|ty|ok|okay|cool|great|nice|bye|good (morning|night|evening))"
    r"\b[\s!.,:)]*\w{0,10}[\s!.]*$",
    re.IGNORECASE,
)
_DATA_WORDS = re.compile(
    r"\b(sum|sums|summed|average|averages|avg|mean|median|count|counts|plot|plots|chart|charts|graph|"
    r"histogram|how many|how much|total|totals|csv|tsv|excel|xlsx|xls|spreadsheet|columns?|rows?|"
    r"data|dataset|dataframe|table|file|files|maximum|minimum|max|min|percent|percentage|ratio|"
    r"std|variance|correlation|group ?by|trend)\b",
    re.IGNORECASE,
)
_REFUSALS = (
    "i can't",
    "i cannot",
    "i can not",
    "i'm unable",
    "i am unable",
    "i'm not able",
    "i am not able",
    "unable to access",
    "not able to access",
    "don't have access",
    "do not have access",
    "can't access",
    "cannot access",
    "no access to",
    "as an ai",
    "don't have the ability",
    "do not have the ability",
    "can't run code",
    "cannot run code",
    "can't execute",
    "cannot execute",
    "you can use the following",
    "you could use the following",
    "here is how you can",
    "here's how you can",
)
_NUMBER = re.compile(r"\d")
#: An answer at most this long that states a number is a "bare claim" when no code ran.
_BARE_ANSWER_CHARS = 300


def is_data_question(text: str, *, has_files: bool = False) -> bool:
    """True when the user's message is about data: files came with it, or its words say so."""
    if _CHIT_CHAT.match(text):
        return False
    return has_files or bool(_DATA_WORDS.search(text))


def is_refusal(answer: str) -> bool:
    """True when the answer says the model cannot do it (or tells the user how to do it)."""
    normal = answer.lower().replace("\u2019", "'")
    return any(phrase in normal for phrase in _REFUSALS)


def is_bare_number(answer: str) -> bool:
    """True for a short answer that states a number (and shows no code)."""
    stripped = answer.strip()
    return 0 < len(stripped) <= _BARE_ANSWER_CHARS and "```" not in stripped and bool(_NUMBER.search(stripped))


def should_nudge(question: str, answer: str, *, has_files: bool = False, ran_code: bool, nudged: bool) -> bool:
    """True when the loop should ask the model, this once, to run code instead of answering."""
    if nudged or ran_code or not is_data_question(question, has_files=has_files):
        return False
    return is_refusal(answer) or is_bare_number(answer)
