"""The output collector on scripted iopub contents (real kernels are in test_session.py)."""

from __future__ import annotations

import base64
import tracemalloc

from kernels.session.output import OutputCollector


def test_streams_keep_order_and_merge_neighbours() -> None:
    out = OutputCollector(1000)
    for name, text in [("stdout", "a"), ("stdout", "b"), ("stderr", "E"), ("stdout", "c")]:
        out.handle("stream", {"name": name, "text": text})
    assert [(c.name, c.text) for c in out.streams()] == [("stdout", "ab"), ("stderr", "E"), ("stdout", "c")]
    assert not out.truncated


def test_head_and_tail_kept_with_marker_and_bounded_memory() -> None:
    out = OutputCollector(1000)
    tracemalloc.start()
    for i in range(50_000):
        out.handle("stream", {"name": "stdout", "text": f"{i}\n"})
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    text = "".join(c.text for c in out.streams())
    assert out.truncated
    assert text.startswith("0\n1\n2\n") and text.endswith("49998\n49999\n")
    assert "bytes truncated]" in text and len(text) < 1100
    assert peak < 1_000_000  # the middle is dropped while receiving


def test_one_huge_chunk_is_cut_in_the_middle() -> None:
    out = OutputCollector(1000)
    out.handle("stream", {"name": "stdout", "text": "H" * 500 + "x" * 10_000_000 + "T" * 500})
    text = out.streams()[0].text
    assert text.startswith("H" * 500) and text.endswith("T" * 500)
    assert "[10000000 bytes truncated]" in text


def test_displays_decode_png_update_and_clear() -> None:
    out = OutputCollector(1000)
    png = base64.b64encode(b"\x89PNG fake").decode()
    out.handle("display_data", {"data": {"image/png": png}, "metadata": {}, "transient": {"display_id": "d1"}})
    out.handle("update_display_data", {"data": {"text/plain": "v2"}, "metadata": {}, "transient": {"display_id": "d1"}})
    assert [d.data for d in out.displays()] == [{"text/plain": "v2"}]
    out.handle("display_data", {"data": {"image/png": png}})
    assert out.displays()[-1].png() == b"\x89PNG fake"
    out.handle("clear_output", {"wait": True})
    assert len(out.displays()) == 2
    out.handle("stream", {"name": "stdout", "text": "after"})
    assert out.displays() == [] and out.streams()[0].text == "after"


def test_display_budget_keeps_first_and_last() -> None:
    out = OutputCollector(1000, max_display_bytes=10_000)
    for i in range(100):
        out.handle("display_data", {"data": {"text/html": f"<p>{i}</p>" + " " * 900}})
    shown = [d.data["text/html"].split("</p>")[0] for d in out.displays()]
    assert shown[0] == "<p>0" and shown[-1] == "<p>99"
    assert out.dropped_displays == 100 - len(shown) and out.truncated


def test_error_ansi_stripped() -> None:
    out = OutputCollector(1000)
    out.handle(
        "error", {"ename": "ValueError", "evalue": "\x1b[31mbad\x1b[0m", "traceback": ["\x1b[0;31mLine\x1b[0m", "x"]}
    )
    assert out.error is not None
    assert out.error.evalue == "bad" and out.error.traceback == "Line\nx"
