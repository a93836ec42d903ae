"""The running cell's status: lines as a terminal shows them, step labels, once-a-second rendering."""

from __future__ import annotations

import asyncio

from bot.agent.steps import step_label
from bot.events import LINE_CHARS, CellProgress, elapsed
from bot.live import KEPT_LINE_CHARS, CellOutput, LiveCell
from bot.safetext import cut, without_terminal_control


def test_a_redrawn_bar_is_one_line_in_its_latest_state() -> None:
    output = CellOutput()
    output.record("stdout", "loading\n")
    for percent in (10, 50, 100):
        output.record("stderr", f"\r{percent:3d}%|{'#' * (percent // 10)}")
    lines, unfinished = output.latest()
    assert lines == ("loading", "100%|##########") and unfinished == 1
    output.record("stderr", "\n")
    assert output.latest() == (("loading", "100%|##########"), 0) and output.ended == 2


def test_only_the_latest_lines_are_kept_short_and_without_escapes() -> None:
    output = CellOutput(keep=3)
    for n in range(1000):
        output.record("stdout", f"\x1b[31mline {n}\x1b[0m\n")
    output.record("stdout", "x" * 10_000)
    lines, unfinished = output.latest()
    assert lines == ("line 998", "line 999", "x" * (KEPT_LINE_CHARS - 1) + "…") and unfinished == 1
    assert output.ended == 1000
    # Kept longer than shown, so the outbound rewrite sees whole paths; shown cut to the line length.
    shown = CellProgress(round=1, label="", code="", elapsed_s=0, lines=lines).shown_lines()
    assert shown[-1] == "x" * (LINE_CHARS - 1) + "…"


def test_a_cut_never_leaves_the_head_of_a_path() -> None:
    """Whatever cuts a text for showing drops a split word that could be a path, whole."""
    assert cut("see /srv/threadbook/workspaces/t1/data.csv now", 20) == "see …"
    assert cut("see /srv/threadbook/workspaces/t1/data.csv now", 43) == "see /srv/threadbook/workspaces/t1/data.csv…"
    assert cut("plain words cut anywhere", 10) == "plain wor…"
    assert cut("short", 10) == "short"
    # Labels and kept output lines cut the same way.
    said = "Reading " + "/srv/threadbook/workspaces/" * 5
    assert "/srv" not in step_label("x = 1", said) and step_label("x = 1", said).endswith("…")
    output = CellOutput()
    output.record("stdout", "y" * (KEPT_LINE_CHARS - 10) + " /srv/threadbook/workspaces/t1\n")
    assert output.latest()[0] == ("y" * (KEPT_LINE_CHARS - 10) + " …",)


def test_terminal_control_sequences_go_whole() -> None:
    text = "a\x1b]52;c;aGk=\x07b\x1b[1;31mc\x1b[0m\x1b]8;;https://x\x1b\\d\x1b]8;;\x1b\\e\x9b2Jf\x1bPq\x1b\\g\th\ni\rj\x1b]0;open"
    assert without_terminal_control(text) == "abcdefg\th\nij"


def test_the_status_shows_step_time_and_lines_in_a_fence_that_output_cannot_close() -> None:
    cell = CellProgress(round=2, label="Load the sales", code="", elapsed_s=75.4, lines=("a ``` b", "c"))
    text = cell.markdown()
    head, fence, *body = text.split("\n")
    assert head == "Running step 2 (1:15 min): Load the sales"
    assert fence == "````" and body == ["a ``` b", "c", "````"]
    assert cell.headline() == "Running step 2 (1:15 min): Load the sales · c"
    assert elapsed(7.9) == "7 s" and elapsed(3725) == "1:02:05 h"


def test_a_step_is_labelled_by_the_models_words_else_by_a_telling_line() -> None:
    code = "import pandas as pd\nimport numpy as np\n\ndf = pd.read_csv('sales.csv')\nprint(df.shape)"
    assert step_label(code) == "`df = pd.read_csv('sales.csv')`"
    assert step_label("# Load the sales data\nimport pandas as pd") == "Load the sales data"
    assert step_label(code, "**Loading the file.** Then I will plot it.") == "Loading the file."
    assert step_label("import time") == "`import time`"  # nothing else to tell
    assert step_label("%matplotlib inline\nwarnings.filterwarnings('ignore')\nplt.plot(x)") == "`plt.plot(x)`"
    assert len(step_label("x = " + "1" * 500)) <= 80


class _Shown:
    shows_drafts = False

    def __init__(self) -> None:
        self.cells: list[CellProgress] = []

    async def cell(self, cell: CellProgress) -> None:
        self.cells.append(cell)
        await asyncio.sleep(0.3)  # a slow platform: the next tick waits, nothing queues up


async def test_the_running_cell_is_shown_at_once_then_each_tick_with_its_newest_output() -> None:
    shown = _Shown()
    live = LiveCell(shown, tick_s=0.05)  # type: ignore[arg-type]
    await live.step(1, "Count", "for i in range(3): print(i)")
    assert live.claim() and not live.claim()  # the step's own code, once
    live.begin()
    for n in range(3):
        live.record("stdout", f"{n}\n")
        await asyncio.sleep(0.2)
    await live.ran()
    await asyncio.sleep(0.5)
    await live.close()
    assert shown.cells[0].lines == () and shown.cells[0].label == "Count"
    assert any(cell.lines for cell in shown.cells)
    # Rendered no faster than the platform takes them (sequential ticks), and nothing after the cell ended.
    assert len(shown.cells) <= 6
    assert shown.cells[-1].lines == ("0", "1", "2")  # its last state was shown when it ended, then nothing more


def test_terminal_control_in_the_output_is_left_out() -> None:
    output = CellOutput()
    output.record("stdout", "\x1b]0;pwned\x07title \x1b[2Jcleared\x08\x9bX\n")
    assert output.latest() == (("title cleared",), 0)  # 8-bit CSI "\\x9bX" is one sequence, X its final byte
