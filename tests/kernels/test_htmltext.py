"""HTML to text for the model (``threadbook_kernel.htmltext``, kernel-side code, pure)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels" / "runtime"))

from threadbook_kernel.htmltext import html_to_text


def test_tables_become_rows() -> None:
    html = "<table><tr><th>region</th><th>sales</th></tr><tr><td>north</td><td>10</td></tr></table><p>done</p>"
    assert html_to_text(html) == "region | sales\nnorth | 10\ndone"


def test_optional_end_tags_lose_nothing() -> None:
    page = "<html><head><meta charset=utf-8><title>T</title><style>p{}</style><body><p>Hello</p><p>world"
    assert html_to_text(page) == "Hello\nworld"
    table = "<table><tr><td>a<td>b<tr><td>c<td>d</table><p>z"
    assert html_to_text(table) == "a | b\nc | d\nz"


def test_nested_tables_stay_inside_their_cell() -> None:
    html = "<table><tr><td>outer<table><tr><td>x<td>y</table></td><td>2</td></tr></table>"
    assert html_to_text(html) == "outer x | y | 2"
