"""History trimming keeps whole exchanges and a valid tool-call pairing."""

from __future__ import annotations

from typing import Any

from bot.agent.history import FENCED_OUTPUT_HEADER, repair, trim_history
from tests.agent.conftest import assert_valid_transcript


def call(call_id: str, code: str = "x") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "python", "arguments": f'{{"code": "{code}"}}'}}


def exchange(n: int, size: int = 100) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"q{n} " + "u" * size},
        {"role": "assistant", "content": None, "tool_calls": [call(f"c{n}")]},
        {"role": "tool", "tool_call_id": f"c{n}", "content": "o" * size},
        {"role": "assistant", "content": f"a{n}"},
    ]


def test_oldest_exchanges_go_first_and_whole() -> None:
    history = exchange(1) + exchange(2) + exchange(3)
    trimmed = trim_history(history, budget_chars=600)  # about 260 per exchange
    assert trimmed == exchange(2) + exchange(3)
    assert trim_history(history, budget_chars=10**6) == history
    assert trim_history(history, budget_chars=10) == []


def test_fenced_output_does_not_split_an_exchange() -> None:
    history = [
        {"role": "user", "content": "old"},
        {"role": "assistant", "content": "```python\n1\n```"},
        {"role": "user", "content": f"{FENCED_OUTPUT_HEADER}\n\n" + "z" * 300},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "new"},
    ]
    assert trim_history(history, budget_chars=200) == history[-1:]


def test_repair_drops_orphans_and_fills_missing_results() -> None:
    broken = [
        {"role": "tool", "tool_call_id": "ghost", "content": "orphan"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        {"role": "tool", "tool_call_id": "a", "content": "ok"},
        {"role": "user", "content": "next"},
        {"role": "tool", "tool_call_id": "a", "content": "duplicate"},
    ]
    repaired = repair(broken)
    assert_valid_transcript(repaired)
    assert [m.get("tool_call_id") for m in repaired if m["role"] == "tool"] == ["a", "b"]
    assert repaired[0] == {"role": "user", "content": "q"}


def test_system_and_leading_messages_are_not_replayed() -> None:
    history = [{"role": "system", "content": "old prompt"}, {"role": "assistant", "content": "hi"}, *exchange(1)]
    assert trim_history(history, 10**6) == exchange(1)
