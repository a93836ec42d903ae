"""The system prompt."""

from __future__ import annotations

from pathlib import Path

from bot.agent.prompt import PromptFile, build_system_prompt
from kernels.session.snapshots import RestoreReport


def test_default_prompt_states_the_workspace_rules() -> None:
    prompt = build_system_prompt()
    assert "current directory is this thread's workspace" in prompt
    assert "sent to the user automatically" in prompt
    assert "plt.show()" in prompt
    assert "no internet access" in prompt
    assert "Files in the workspace" not in prompt and "restarted" not in prompt


def test_files_data_dir_fresh_kernel_and_channel_prompt() -> None:
    prompt = build_system_prompt(
        files=[
            PromptFile("sales.csv", 2048),
            PromptFile("notes.txt", 12),
            PromptFile("big.parquet", 5 * 2**20),
        ],
        channel_prompt="  Answer in French.  ",
        data_dir=Path("/srv/data"),
        kernel_fresh=True,
        network=True,
    )
    assert "- `sales.csv` (2.0 KB)\n" in prompt
    assert "- `notes.txt` (12 B)" in prompt and "- `big.parquet` (5.0 MB)" in prompt
    assert "`/srv/data`" in prompt and "read-only" in prompt.lower()
    assert "variables from earlier in this thread are gone" in prompt
    assert prompt.endswith("Instructions for this channel:\nAnswer in French.")
    assert "no internet access" not in prompt


def test_a_restored_kernel_names_what_came_back_and_what_did_not() -> None:
    report = RestoreReport(
        restored=(("df", "DataFrame 1,000×3"), ("f", "function")),
        lost=(("fh", "it is an open file handle (log.txt); open the file again"),),
        saved_at=1_000.0,
    )
    notice = report.notice(now=1_000.0 + 3 * 3600 + 5)
    prompt = build_system_prompt(kernel_fresh=True, restored=notice)
    assert "kernel was restarted since the last message" in prompt
    assert "snapshot saved 3 hours ago" in prompt and "`df` (DataFrame 1,000×3), `f` (function)" in prompt
    assert "Not restored: `fh` (it is an open file handle (log.txt); open the file again)." in prompt
    assert "are gone" not in prompt
    assert build_system_prompt(kernel_fresh=False, restored=notice).count("restored") == 0

    failed = RestoreReport(failure="it is damaged: Expecting value").notice()
    assert "could not be restored (it is damaged: Expecting value)" in failed and "reload what you need" in failed
