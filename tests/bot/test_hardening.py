"""What the bot drops from its own environment once the config is read (``bot/hardening.py``)."""

from __future__ import annotations

import ctypes
import multiprocessing
import subprocess
import sys
from pathlib import Path

from bot.config import load_settings
from bot.hardening import PR_GET_DUMPABLE, drop_secrets, make_undumpable
from tests.bot.test_console import write_config

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
llm: {api_key: "${OPENAI_API_KEY}", model: "${THREADBOOK_MODEL:-gpt-4o-mini}", base_url: "http://127.0.0.1:9/v1"}
slack: {bot_token: "${MY_SLACK:-}", app_token: "xapp-literal-in-the-file"}
storage: {url: "postgresql://bot:${PGPASSWORD}@db/threadbook"}
kernels: {workspace_root: "${HOME}/ws"}
"""


def test_secrets_and_every_interpolated_variable_leave_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    environ = {
        "OPENAI_API_KEY": "sk-one",
        "THREADBOOK_MODEL": "local",
        "MY_SLACK": "xoxb-two",
        "PGPASSWORD": "hunter2",
        "HOME": "/home/bot",
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "SLACK_SIGNING_SECRET": "documented-name-unused-here",  # a known secret's name
        "COPY_OF_APP_TOKEN": "xapp-literal-in-the-file",  # a secret's value under another name
        "DB_PASS": "hunter2",  # the storage URL's password under another name
        "UNRELATED": "keep me",
    }
    referenced: set[str] = set()
    settings = load_settings(path, env=environ, referenced=referenced)
    assert referenced == {"OPENAI_API_KEY", "THREADBOOK_MODEL", "MY_SLACK", "PGPASSWORD", "HOME"}

    dropped = drop_secrets(settings, referenced, environ)

    assert dropped == sorted(
        [
            "OPENAI_API_KEY",
            "THREADBOOK_MODEL",
            "MY_SLACK",
            "PGPASSWORD",
            "SLACK_SIGNING_SECRET",
            "COPY_OF_APP_TOKEN",
            "DB_PASS",
        ]
    )
    # What the process needs stays, even though the config interpolated HOME.
    assert environ == {"HOME": "/home/bot", "PATH": "/usr/bin", "LANG": "C.UTF-8", "UNRELATED": "keep me"}
    assert settings.llm.api_key.get_secret_value() == "sk-one"  # the settings keep what they read


def _undumpable_in_child(result: multiprocessing.Queue[tuple[bool, int]]) -> None:
    made = make_undumpable()
    result.put((made, ctypes.CDLL(None).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)))


def test_the_process_becomes_non_dumpable() -> None:
    # In a child process: pytest itself stays dumpable.
    context = multiprocessing.get_context("fork")
    result: multiprocessing.Queue[tuple[bool, int]] = context.Queue()
    child = context.Process(target=_undumpable_in_child, args=(result,))
    child.start()
    child.join(30)
    assert result.get(timeout=5) == (True, 0)


def test_a_bot_that_cannot_protect_its_memory_does_not_start(tmp_path: Path) -> None:
    # prctl cannot be made to fail here: its result is what the check reads, in a bot process of its own.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    out = tmp_path / "out"
    program = (
        "import sys, bot.hardening as h\n"
        "h.make_undumpable = lambda: False\n"
        "from bot.__main__ import main\n"
        f"sys.exit(main(['console', '--config', {str(config)!r}, '--out', {str(out)!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60, input=""
    )
    assert done.returncode == 2, done.stderr
    said = done.stderr.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("threadbook: cannot make the bot non-dumpable"), said
    assert not out.exists()  # nothing started
