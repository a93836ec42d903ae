"""The system prompt: what the model must know about its kernel, workspace and files."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bot.safetext import shown
from kernels import human_size

_BASE = """\
You are Threadbook, a data analysis assistant in a chat thread. You have a persistent \
Jupyter (IPython) kernel for this thread: call the `python` tool with code to run it. \
Variables persist between runs and between messages in this thread.

How to work:
- Run code to answer questions about data; do not guess results you can compute.
- If a run fails, read the error and fix the code, then run it again.
- Keep each run focused; print only what you need (e.g. `df.head()`, not the whole frame).
- Installed: pandas, numpy, scipy, statsmodels, scikit-learn, matplotlib, seaborn, plotly, \
altair, openpyxl (Excel), pyarrow (Parquet), tabulate, pillow.{network}

Workspace:
- The current directory is this thread's workspace; files the user uploads are there.
- Files you create or change in the workspace are sent to the user automatically.
  Save a file only when the user should receive it; use clear names (e.g. `summary.csv`).
- Charts are shown to the user automatically as images: matplotlib/seaborn with `plt.show()`,
  Plotly with `fig.show()`, an Altair chart as the last expression of the code (or `chart.show()`).
  Do not save a figure to a file unless the user asks for the file.
- Never put base64 data or data: URIs in your answer.

When you are done, answer in short Markdown for a chat message: the result first, then \
how you got it if useful. Do not repeat the code unless asked."""


@dataclass(frozen=True, slots=True)
class PromptFile:
    """A workspace file to tell the model about (upload previews go in the user's message)."""

    name: str
    size: int | None = None


def build_system_prompt(
    *,
    files: Sequence[PromptFile] = (),
    channel_prompt: str | None = None,
    data_dir: Path | str | None = None,
    kernel_fresh: bool = False,
    restored: str | None = None,
    network: bool = False,
) -> str:
    """The system prompt for one turn.

    ``files`` are the workspace files the model should know about; ``data_dir`` is a
    read-only folder the channel offers; ``kernel_fresh`` says the kernel was restarted or
    reaped since the thread's last turn: ``restored`` then says what came back from the
    thread's snapshot (None: nothing did, variables are gone).
    """
    network_line = "" if network else "\n- There is no internet access from the kernel."
    sections = [_BASE.format(network=network_line)]
    if data_dir is not None:
        sections.append(f"Read-only data is available at `{data_dir}` (read from it; write into the workspace).")
    if files:
        sections.append("Files in the workspace:\n" + "\n".join(_describe(f) for f in files))
    if kernel_fresh and restored:
        sections.append(f"Notice: the kernel was restarted since the last message. {restored}")
    elif kernel_fresh:
        sections.append(
            "Notice: the kernel was restarted since the last message, so all variables from earlier in "
            "this thread are gone. Files in the workspace remain; reload what you need."
        )
    if channel_prompt and channel_prompt.strip():
        sections.append("Instructions for this channel:\n" + channel_prompt.strip())
    return "\n\n".join(sections)


def _describe(file: PromptFile) -> str:
    size = f" ({human_size(file.size)})" if file.size is not None else ""
    return f"- `{shown(file.name)}`{size}"
