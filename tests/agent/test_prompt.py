"""The system prompt."""

from __future__ import annotations

from pathlib import Path

from bot.agent.prompt import PromptFile, build_system_prompt


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
