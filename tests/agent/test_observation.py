"""What the model reads about one execution."""

from __future__ import annotations

from bot.agent.observation import STDOUT_CHARS, format_observation, short_traceback, truncate_middle
from kernels.seam.result import DisplayOutput, ErrorInfo, ExecutionResult, Outcome, StreamChunk

PNG = b"\x89PNG\r\n\x1a\n" + b"0" * 200

IPYTHON_TRACEBACK = """\
---------------------------------------------------------------------------
KeyError                                  Traceback (most recent call last)
Cell In[4], line 2
      1 import helper
----> 2 helper.lookup(table, "b")

File /work/helper.py:10, in lookup(table, key)
      9 def lookup(table, key):
---> 10     return middle(table, key)

File /work/helper.py:14, in middle(table, key)
     13 def middle(table, key):
---> 14     return table[key]

KeyError: 'b'"""


def test_long_stdout_is_cut_in_the_middle() -> None:
    text = "".join(f"line {i}\n" for i in range(5000))
    observation = format_observation(ExecutionResult(streams=[StreamChunk("stdout", text)]))
    assert observation.startswith("stdout:\nline 0\n")
    assert observation.rstrip().endswith("line 4999")
    assert "characters omitted" in observation
    assert len(observation) < STDOUT_CHARS + 200


def test_error_has_name_value_and_only_the_last_frames() -> None:
    result = ExecutionResult(
        outcome=Outcome.ERROR,
        streams=[StreamChunk("stdout", "before\n")],
        error=ErrorInfo("KeyError", "'b'", IPYTHON_TRACEBACK),
    )
    observation = format_observation(result)
    assert observation.startswith("stdout:\nbefore\n")
    assert "Error: KeyError: 'b'" in observation
    assert "---> 14     return table[key]" in observation and "---> 10" in observation
    assert "Cell In[4]" not in observation  # only the last two frames
    assert "-----" not in observation.replace("----> ", "")
    assert observation.count("KeyError") == 1  # the final line is not repeated


def test_short_traceback_of_a_one_frame_error() -> None:
    tb = "Cell In[1], line 1\n----> 1 x\n\nNameError: name 'x' is not defined"
    assert short_traceback(tb, "NameError") == "Cell In[1], line 1\n----> 1 x"


def test_result_displays_images_and_files() -> None:
    result = ExecutionResult(
        result="   a  b\n0  1  2",
        execution_count=7,
        displays=[
            DisplayOutput({"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"}),
            DisplayOutput({"text/html": "<table/>", "text/plain": "shown frame"}),
            DisplayOutput({"image/png": PNG}),
        ],
        changed_files=["out/summary.csv", "plot.png"],
    )
    observation = format_observation(result)
    assert "Out[7]:\n   a  b\n0  1  2" in observation
    assert "displayed:\nshown frame" in observation and "<Figure" not in observation
    assert "2 images displayed; shown to the user automatically." in observation
    assert "Files created or changed (sent to the user): out/summary.csv, plot.png" in observation
    assert "PNG" not in observation and "<table/>" not in observation


def test_fresh_kernel_and_silence() -> None:
    assert format_observation(ExecutionResult()) == "(ran without output)"
    fresh = format_observation(ExecutionResult(kernel_restarted=True))
    assert fresh.startswith("Note: this ran in a fresh kernel")
    restarted = format_observation(ExecutionResult(outcome=Outcome.TIMEOUT_RESTARTED))
    assert "kernel was restarted" in restarted and "variables are lost" in restarted


def test_truncate_middle_keeps_short_text() -> None:
    assert truncate_middle("short", 10) == "short"
    cut = truncate_middle("x" * 50 + "y" * 50, 30)
    assert cut.startswith("x" * 20) and cut.endswith("y" * 10) and "[70 characters omitted]" in cut
