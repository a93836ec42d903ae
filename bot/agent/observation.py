"""Turn an :class:`~kernels.result.ExecutionResult` into the tool message the model reads.

The observation is compact on purpose: long output is cut in the middle, a traceback keeps
only its last frames, images are counted (never inlined), and kernel events (timeout,
death, restart) are spelled out so the model knows which variables it still has.
"""

from __future__ import annotations

from bot.safetext import shown
from kernels import ExecutionResult, Outcome

STDOUT_CHARS = 2500
STDERR_CHARS = 1200
RESULT_CHARS = 1500
DISPLAY_CHARS = 1000
TRACEBACK_CHARS = 1500
TRACEBACK_FRAMES = 2

_OUTCOME_LINES = {
    Outcome.TIMEOUT_INTERRUPTED: (
        "The code ran past the time limit and was interrupted; variables defined before are kept."
    ),
    Outcome.TIMEOUT_RESTARTED: (
        "The code ran past the time limit and could not be interrupted, so the kernel was restarted: "
        "all variables are lost (files in the workspace remain)."
    ),
    Outcome.INTERRUPTED: "The user stopped the execution.",
    Outcome.DIED: (
        "The kernel died during the execution (often: out of memory) and was restarted: "
        "all variables are lost (files in the workspace remain)."
    ),
}


def format_observation(result: ExecutionResult) -> str:
    """The text of the ``tool`` message for one execution."""
    parts: list[str] = []
    # The kernel layer's notice is the most precise account (exit code, seconds); the stock
    # lines cover results that come without one.
    if result.notice:
        parts.append(f"Notice: {result.notice}")
    elif result.outcome in _OUTCOME_LINES:
        parts.append(_OUTCOME_LINES[result.outcome])
    elif result.kernel_restarted:
        parts.append("Note: this ran in a fresh kernel; variables from earlier runs are gone, files remain.")
    if result.stdout:
        parts.append("stdout:\n" + truncate_middle(result.stdout, STDOUT_CHARS))
    if result.stderr:
        parts.append("stderr:\n" + truncate_middle(result.stderr, STDERR_CHARS))
    if result.result is not None:
        label = f"Out[{result.execution_count}]" if result.execution_count else "result"
        parts.append(f"{label}:\n" + truncate_middle(result.result, RESULT_CHARS))
    # A display sent as an image is counted below; any other is read as its text, which the
    # kernel makes readable for HTML and LaTeX and where a chart could not be rendered.
    texts = [
        d.data["text/plain"] for d in result.displays if isinstance(d.data.get("text/plain"), str) and d.image() is None
    ]
    if texts:
        parts.append("displayed:\n" + truncate_middle("\n".join(texts), DISPLAY_CHARS))
    if result.error is not None:
        parts.append(f"Error: {result.error.ename}: {truncate_middle(result.error.evalue, 500)}")
        if tb := short_traceback(result.error.traceback, result.error.ename):
            parts.append("Traceback (last frames):\n" + tb)
    if images := len(result.images):
        parts.append(f"{images} image{'s' if images > 1 else ''} displayed; shown to the user automatically.")
    if result.changed_files:
        parts.append(
            "Files created or changed (sent to the user): " + ", ".join(shown(n) for n in result.changed_files)
        )
    if result.truncated:
        parts.append("(The kernel truncated the output because it was too long.)")
    if not parts:
        parts.append("(ran without output)")
    return "\n\n".join(parts)


def short_traceback(
    traceback: str, ename: str = "", *, frames: int = TRACEBACK_FRAMES, limit: int = TRACEBACK_CHARS
) -> str:
    """The last ``frames`` frames of an IPython traceback, without the banner and final line.

    IPython separates frames with blank lines; the final block is ``Name: value``, which the
    observation already states.
    """
    blocks = [_drop_banner(b) for b in traceback.split("\n\n")]
    blocks = [b for b in blocks if b]
    if len(blocks) > 1 and ename and blocks[-1].startswith(ename):
        blocks = blocks[:-1]
    blocks = blocks[-frames:]
    text = "\n\n".join(b for b in blocks if b)
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


def truncate_middle(text: str, limit: int) -> str:
    """``text`` cut in the middle to at most about ``limit`` characters, saying how much went."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n… [{omitted} characters omitted] …\n{text[-tail:]}"


def _drop_banner(block: str) -> str:
    """Remove IPython's ``-----`` rule and ``Traceback (most recent call last)`` lines."""
    lines = [
        line
        for line in block.splitlines()
        if not set(line.strip()) <= {"-"} and "Traceback (most recent call last)" not in line
    ]
    return "\n".join(lines).strip("\n")
