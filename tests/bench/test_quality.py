"""The quality bench's harness: grading rules, and a smoke run against the scripted oracle model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.quality_checks import Number, ReplyFiles, Word, Words, answer_text, numbers_in
from bench.quality_data import file_bytes, generate
from bench.quality_questions import check_unique_ids, questions

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ("total_revenue", "top_region", "chart_and_count", "file_top_customers_xlsx")
WRONG = "top_region"


def reply(text: str) -> ReplyFiles:
    return ReplyFiles(text=text, images=(), files={})


def test_numbers_and_the_answer_line_are_read_as_documented() -> None:
    assert numbers_in("Total: $1,234.50 over 3 regions, -2 and 12%") == [1234.5, 3, -2, 12]
    assert answer_text("The total is 5.\n\n**ANSWER:** `1,234.50`") == ("1,234.50", True)
    assert answer_text("no line here") == ("no line here", False)
    # With an ANSWER line only its first number counts; without one, any number may match.
    assert not Number(3).grade(reply("3 regions\nANSWER: 1234.5")).passed
    verdict = Number(1234.5, 0.01).grade(reply("over 3 regions the total is 1,234.51"))
    assert verdict.passed and verdict.answer_line is False
    assert Number(25.4, 0.05).grade(reply("ANSWER: 25.43 %")).passed
    assert not Number(25.4, 0.05).grade(reply("ANSWER: 25.5")).passed


def test_words_match_whole_words_in_order() -> None:
    assert Word(("North",)).grade(reply("ANSWER: **north**")).passed
    assert not Word(("North",)).grade(reply("ANSWER: Northwest")).passed
    assert Word(("December", "Dec", "2025-12")).grade(reply("ANSWER: 2025-12")).passed
    assert Words(("P04", "P07", "P06")).grade(reply("ANSWER: P04, P07 and P06")).passed
    assert not Words(("P04", "P07", "P06")).grade(reply("ANSWER: P07, P04, P06")).passed


def test_the_data_is_deterministic_and_there_are_at_least_30_questions() -> None:
    assert file_bytes(generate()) == file_bytes(generate())
    items = questions(generate())
    check_unique_ids(items)
    assert len(items) >= 30
    assert {q.id for q in items} >= set(SMOKE)


@pytest.mark.timeout(90)
def test_scripted_oracle_passes_and_a_wrong_answer_fails(tmp_path: Path) -> None:
    output = tmp_path / "quality.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.quality",
            "--scripted",
            "--sandbox",
            "none",
            "--only",
            *SMOKE,
            "--wrong",
            WRONG,
            "--output",
            str(output),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=80,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(output.read_text())
    results = {r["id"]: r for r in document["results"]}
    assert list(results) == list(SMOKE)
    for qid, result in results.items():
        assert result["passed"] is (qid != WRONG), result
    assert results[WRONG]["rounds"] == 0 and "-1" in results[WRONG]["detail"]
    assert results["total_revenue"]["rounds"] == 1 and results["total_revenue"]["prompt_tokens"] > 0
    assert results["chart_and_count"]["images"] == 1
    assert results["file_top_customers_xlsx"]["files"] == ["top_customers.xlsx"]
    assert document["passed"] == 3 and document["questions"] == 4
    assert f"| {WRONG} | **FAIL** |" in done.stdout and "| total_revenue | pass | 1 |" in done.stdout
    assert "accuracy: 3/4 = 75.0 %" in done.stdout
