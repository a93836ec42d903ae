"""A newcomer's first run: the README's first screen, the sample data its quick start uses, a
``make run`` that installs only the bot, and a shipped ``config.yaml`` safe for a team."""

from __future__ import annotations

import csv
import re
import subprocess
from pathlib import Path

from bot.config import load_settings

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
#: What a terminal shows before scrolling.
FIRST_SCREEN = "\n".join(README.splitlines()[:25])
GiB = 1024


def quick_start() -> str:
    return README.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def test_the_first_screen_says_what_threadbook_is_and_how_to_run_and_test_it() -> None:
    assert re.search(r"^Threadbook is a code interpreter", FIRST_SCREEN, re.MULTILINE)
    assert re.search(r"^make run\b", FIRST_SCREEN, re.MULTILINE) and re.search(
        r"^make test\b", FIRST_SCREEN, re.MULTILINE
    )


def test_the_quick_start_uses_the_shipped_sample_and_names_the_model_setting() -> None:
    text = quick_start()
    sample = REPO / "docs" / "examples" / "sales.csv"
    assert "/attach docs/examples/sales.csv" in text
    with sample.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["month", "region", "product", "units", "amount"] and len(rows) >= 100
    assert len({row["month"] for row in rows}) == 12
    # A server other than OpenAI's needs a model it has: the setting and its variable are named,
    # and the variable is the one config.yaml really reads.
    assert "llm.model" in text and "THREADBOOK_MODEL" in text and "OPENAI_BASE_URL" in text
    shipped = load_settings(
        REPO / "config.yaml", env={"THREADBOOK_MODEL": "qwen2.5-coder", "OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"}
    )
    assert shipped.llm.model == "qwen2.5-coder"


def _planned(target: str, tmp_path: Path) -> str:
    """What ``make -n target`` would run in a fresh checkout (no environments yet)."""
    done = subprocess.run(
        [
            "make",
            "-n",
            "-C",
            str(REPO),
            f"VENV={tmp_path / 'venv'}",
            f"KERNEL_VENV={tmp_path / 'kvenv'}",
            f"GATEWAY_VENV={tmp_path / 'gvenv'}",
            target,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_run_installs_only_the_bot_and_test_and_check_add_the_extras(tmp_path: Path) -> None:
    for target in ("run", "console"):
        plan = _planned(target, tmp_path)
        assert "pip install --quiet -e ." in plan and ".[test]" not in plan, plan
    for target in ("test", "check"):
        assert "pip install --quiet -e '.[test]'" in _planned(target, tmp_path)


def test_the_shipped_config_fits_a_small_machine_and_has_budgets_on() -> None:
    shipped = load_settings(REPO / "config.yaml", env={"OPENAI_API_KEY": "k"})
    kernels = shipped.kernels
    assert kernels.max_kernels * kernels.memory_mb <= 6 * GiB, "kernels alone could take more than 6 of 8 GiB"
    assert kernels.memory_mb >= GiB, "too little for pandas work"
    assert kernels.sandbox == "auto"
    limits = shipped.limits
    assert limits.tokens_per_user_day >= 1_000_000 and limits.tokens_per_channel_day >= limits.tokens_per_user_day
    assert limits.turns_per_user_minute >= 5 and limits.kernel_seconds_per_user_day >= 3600
