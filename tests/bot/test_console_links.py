"""The terminal console's rendering and history (issue: links and history off the event loop)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from prompt_toolkit.history import FileHistory, InMemoryHistory, ThreadedHistory

from adapters.console_terminal import Terminal


def test_a_link_shows_its_target_not_a_terminal_hyperlink(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    Terminal(io.StringIO(), out, history=None, show_code=False).markdown("see [paypal.com](https://evil.example/login)")
    printed = out.getvalue()
    assert "\x1b]8;" not in printed  # OSC 8: a label that opens another address
    assert "https://evil.example/login" in printed


def test_the_history_file_is_read_and_written_off_the_event_loop(tmp_path: Path) -> None:
    terminal = Terminal(io.StringIO(), io.StringIO(), history=tmp_path / "out" / "history", show_code=False)
    opened = terminal._open_history()
    assert isinstance(opened, ThreadedHistory) and isinstance(opened.history, FileHistory)
    assert (tmp_path / "out" / "history").exists()
    memory = Terminal(io.StringIO(), io.StringIO(), history=None, show_code=False)._open_history()
    assert isinstance(memory, InMemoryHistory)
