"""``export html``: the thread as one self-contained web page, rendered by the thread's kernel.

Real kernels, a real store and the scripted model server; the page is checked with the
standard library's ``html.parser`` (what a browser would load or run), never by string search
alone.
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from bot import commands
from bot.app import Core
from bot.commands import HELP_TEXT, HTML_FAILED_NOTICE, HTML_WORKSPACE_NOTICE
from kernels.result import UnsafePathError
from kernels.workspace import STATE_DIR
from tests.fakes.memory import MemoryChat
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

#: Attributes through which a browser loads something (an ``<a href>`` is only followed on a click).
_LOADING = {"src", "srcset", "href", "xlink:href", "poster", "background", "action", "formaction", "data", "srcdoc"}


class _Page(HTMLParser):
    """Every start tag of a page with its attributes, and the text of its ``<style>`` elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.styles: list[str] = []
        self.text: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {name: value or "" for name, value in attrs}))
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        (self.styles if self._in_style else self.text).append(data)

    def named(self, tag: str) -> list[dict[str, str]]:
        return [attrs for name, attrs in self.tags if name == tag]


def parse(page: bytes) -> _Page:
    parser = _Page()
    parser.feed(page.decode("utf-8"))
    parser.close()
    return parser


def assert_self_contained(page: _Page) -> None:
    """Nothing runs and nothing is fetched: no script, no frame or object, no stylesheet link,
    no event handler, no URL a browser would load that is not a ``data:`` URI of the page."""
    names = {tag for tag, _ in page.tags}
    assert not names & {"script", "iframe", "frame", "object", "embed", "link", "base", "form", "svg"}, names
    for tag, attrs in page.tags:
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name, value)
            if name in _LOADING and not (tag == "a" and name == "href"):
                assert value.startswith("data:") or value.startswith("#"), (tag, name, value[:100])
            if name == "style":
                assert "url(" not in value.lower(), (tag, value)
        if tag == "meta" and "http-equiv" in attrs:
            assert attrs["http-equiv"] == "Content-Security-Policy"
            assert "default-src 'none'" in attrs["content"] and "img-src data:" in attrs["content"]
    assert any(attrs.get("http-equiv") == "Content-Security-Policy" for attrs in page.named("meta"))
    css = "\n".join(page.styles).lower()
    assert "@import" not in css
    for start in range(len(css)):
        if css.startswith("url(", start):
            assert css[start + 4 :].lstrip(" '\"").startswith("data:"), css[start : start + 80]


def export_files(workspace_path: Path) -> list[str]:
    state = workspace_path / STATE_DIR
    return sorted(name for name in os.listdir(state) if name.startswith("export-")) if state.is_dir() else []


@pytest.fixture
def chat(core: Core) -> MemoryChat:
    return MemoryChat(core.dispatcher)


async def test_export_html_is_one_page_with_the_chart_inline(chat: MemoryChat, llm: ScriptedOpenAI, core: Core) -> None:
    llm.script(
        tool_call("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.title('Sales')\nplt.show()"),
        answer("Here is **the chart**."),
    )
    await chat.say("bar chart please")
    started = time.monotonic()
    out = await chat.say("export html", mentioned=False)
    took = time.monotonic() - started
    reply = out.reply
    assert reply.ok, reply.text
    [file] = reply.files
    assert file.name == "threadbook-t1.html"
    with file.open_reader() as reader:
        data = reader.read()
    assert len(data) == file.size
    print(f"\nexport html of a thread with one chart: {len(data):,} bytes in {took:.2f} s")
    page = parse(data)
    assert_self_contained(page)
    # The chart is in the page itself, as a PNG.
    charts = [a["src"] for a in page.named("img") if a.get("src", "").startswith("data:image/png;base64,")]
    assert len(charts) == 1
    png = base64.b64decode(charts[0].split(",", 1)[1], validate=True)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(png)) as image:
        assert image.format == "PNG" and image.width > 100
    # The conversation and the code are there, rendered (Markdown bold, highlighted code).
    text = "".join(page.text)
    assert "bar chart please" in text and "the chart" in text and "plt.bar" in text.replace("\n", "")
    assert page.named("strong")
    # Both temporary files are gone, and the workspace lists nothing new.
    workspace = core.pool.workspaces.for_key(str(chat.key()))
    assert export_files(workspace.path) == []
    assert await workspace.list_files() == []
    # nbconvert ran in a child process: the kernel itself never imported it.
    session = core.pool.get(str(chat.key()))
    assert session is not None
    assert await session.evaluate("'nbconvert' in __import__('sys').modules", 5) == "False"

    # Any case; the .ipynb export is unchanged.
    again = (await chat.say("export HTML", mentioned=False)).reply
    assert again.ok and again.files[0].name == "threadbook-t1.html"
    notebook = (await chat.say("export", mentioned=False)).reply
    assert notebook.files[0].name == "threadbook-t1.ipynb"


async def test_hostile_html_output_and_message_come_out_neutralised(chat: MemoryChat, llm: ScriptedOpenAI) -> None:
    hostile = (
        "<script>alert(1)</script><img src=x onerror=\"alert(2)\">"
        "<iframe src='https://evil.example/'></iframe><link rel=stylesheet href='https://evil.example/x.css'>"
        "<a href='javascript:alert(4)'>click</a><b style='background:url(https://evil.example/t.png)'>bold</b>"
        "<table><thead><tr><th>col</th></tr></thead><tbody><tr><td>cell</td></tr></tbody></table>"
    )
    llm.script(
        tool_call(f"from IPython.display import HTML, display\ndisplay(HTML({hostile!r}))"),
        answer("Shown. ![tracker](https://evil.example/pixel.png) <img src=y onerror=alert(5)>"),
    )
    await chat.say("show this <script>alert(6)</script> <img src=z onerror=alert(7)>")
    reply = (await chat.say("export html", mentioned=False)).reply
    assert reply.ok, reply.text
    data = reply.files[0].open_reader().read()
    page = parse(data)
    assert_self_contained(page)
    assert "evil.example" not in " ".join(value for _, attrs in page.tags for value in attrs.values())
    # What is harmless stays: the table (DataFrames are tables) and the bold text.
    assert page.named("th") and page.named("td") and page.named("b")
    # The scripts are at most text on the page.
    assert "alert(1)" in "".join(page.text)


async def test_links_planted_at_the_temporary_names_are_never_followed(
    chat: MemoryChat, llm: ScriptedOpenAI, core: Core, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.html").write_text("TOP SECRET")
    monkeypatch.setattr(commands, "_export_token", lambda: "feedfacefeedface")
    plant = (
        "import os\nos.makedirs('.threadbook', exist_ok=True)\n"
        f"os.symlink({str(outside / 'victim.ipynb')!r}, '.threadbook/export-feedfacefeedface.ipynb')\n"
        f"os.symlink({str(outside / 'secret.html')!r}, '.threadbook/export-feedfacefeedface.html')\n"
        "print('planted')"
    )
    llm.script(tool_call(plant), answer("Planted."))
    await chat.say("plant the links")
    workspace = core.pool.workspaces.for_key(str(chat.key()))
    assert (workspace.path / STATE_DIR / "export-feedfacefeedface.ipynb").is_symlink()

    # A link at the notebook's name: the bot writes nothing (and nothing outside).
    reply = (await chat.say("export html", mentioned=False)).reply
    assert (reply.text, reply.files, reply.ok) == (HTML_WORKSPACE_NOTICE, (), False)
    assert not (outside / "victim.ipynb").exists()

    # A link at the page's name only: the kernel will not write through it, the bot reads nothing.
    llm.script(tool_call("os.unlink('.threadbook/export-feedfacefeedface.ipynb')"), answer("Removed."))
    await chat.say("remove one")
    reply = (await chat.say("export html", mentioned=False)).reply
    assert (reply.text, reply.files, reply.ok) == (HTML_FAILED_NOTICE, (), False)
    assert (outside / "secret.html").read_text() == "TOP SECRET"
    assert sorted(os.listdir(outside)) == ["secret.html"]
    assert export_files(workspace.path) == []  # its own notebook, and the planted link, cleaned up

    # Threadbook's folder itself a link out of the workspace: refused, nothing written there.
    llm.script(
        tool_call(f"import shutil\nshutil.rmtree('.threadbook')\nos.symlink({str(outside)!r}, '.threadbook')"),
        answer("Swapped."),
    )
    await chat.say("swap the folder")
    reply = (await chat.say("export html", mentioned=False)).reply
    assert (reply.text, reply.files, reply.ok) == (HTML_WORKSPACE_NOTICE, (), False)
    assert sorted(os.listdir(outside)) == ["secret.html"]

    # And had the kernel swapped the finished page for a link, the bot would refuse to read it.
    os.unlink(workspace.path / STATE_DIR)
    (workspace.path / STATE_DIR).mkdir()
    (workspace.path / STATE_DIR / "export-0123456789abcdef.html").symlink_to(outside / "secret.html")
    with pytest.raises(UnsafePathError):
        commands._read_page(workspace, "export-0123456789abcdef.html", commands.HTML_MAX_BYTES)


async def test_a_page_over_the_limit_is_refused_in_one_sentence(
    chat: MemoryChat, llm: ScriptedOpenAI, core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm.script(tool_call("print('hello')"), answer("Hello."))
    await chat.say("say hello")
    monkeypatch.setattr(commands, "HTML_MAX_BYTES", 10_000)  # the kernel refuses to write it
    reply = (await chat.say("export html", mentioned=False)).reply
    assert not reply.ok and not reply.files
    assert "over the 9.8 KB limit" in reply.text and "\n" not in reply.text
    workspace = core.pool.workspaces.for_key(str(chat.key()))
    assert export_files(workspace.path) == []
    # The bot's own bound holds whatever the kernel says.
    big = workspace.path / STATE_DIR / "export-00000000000000aa.html"
    big.write_bytes(b"x" * 20_000)
    with pytest.raises(commands._TooBig):
        commands._read_page(workspace, big.name, 10_000)


async def test_empty_thread_has_nothing_to_export(chat: MemoryChat, llm: ScriptedOpenAI) -> None:
    reply = (await chat.say("export html")).reply
    assert reply.text == "Nothing to export yet." and reply.files == ()
    assert llm.requests == []
    assert "`export html`" in HELP_TEXT


async def test_a_render_that_takes_too_long_is_stopped_and_loses_nothing(
    chat: MemoryChat, llm: ScriptedOpenAI, core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm.script(tool_call("x = 42"), answer("Kept."))
    await chat.say("keep 42")
    key = str(chat.key())
    session = core.pool.get(key)
    assert session is not None
    monkeypatch.setattr(commands, "HTML_RENDER_TIMEOUT_S", 10.05)  # the kernel gives its render 0.05 s
    reply = (await chat.say("export html", mentioned=False)).reply
    assert (reply.text, reply.files, reply.ok) == (commands.HTML_TIMEOUT_NOTICE, (), False)
    monkeypatch.undo()
    # The same kernel, variables intact; nothing left behind; the next export works.
    assert core.pool.get(key) is session
    assert await session.evaluate("x", 5) == "42"
    assert export_files(core.pool.workspaces.for_key(key).path) == []
    assert (await chat.say("export html", mentioned=False)).reply.ok


async def test_exports_read_well_styled_tables_trimmed_tracebacks_no_server_paths(
    chat: MemoryChat, llm: ScriptedOpenAI, core: Core
) -> None:
    """Issue 31: a DataFrame is a table, never preceded by its CSS as text; a traceback is trimmed
    as in the thread; no folder of the server (kernel environment, workspace) is in either export."""
    kernels = core.settings.kernels
    venv = os.path.dirname(os.path.dirname(os.path.abspath(kernels.python)))
    root = os.path.abspath(kernels.workspace_root)
    llm.script(
        tool_call("import os, pandas as pd\nprint(os.getcwd())\npd.DataFrame({'region': ['north'], 'sales': [5]})"),
        tool_call("pd.read_csv('missing.csv')"),
        answer("The table is above; the file is missing."),
    )
    await chat.say("show the table, then read missing.csv")
    html = (await chat.say("export html", mentioned=False)).reply
    assert html.ok, html.text
    page = parse(html.files[0].open_reader().read())
    text = "".join(page.text)
    assert "north" in text and page.named("th") and page.named("td")
    assert "vertical-align" not in text and ".dataframe" not in text and "<style" not in text
    assert "FileNotFoundError" in text and "Traceback (last frames)" in text
    assert text.count("site-packages/pandas") <= 2  # the last frames only, as the thread shows them
    assert "/workspace" in text
    ipynb = (await chat.say("export", mentioned=False)).reply.files[0].open_reader().read().decode()
    [error] = [o for c in json.loads(ipynb)["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert error["traceback"][0] == "Traceback (last frames):" and error["traceback"][-1].startswith("FileNotFoundError:")
    for export in (text, ipynb):
        assert venv not in export and root not in export
