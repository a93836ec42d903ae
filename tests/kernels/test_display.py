"""Every output reaches the chat in its best form, rendered inside the (sandboxed) kernel.

Real kernels from the kernel environment, unsandboxed and in the bubblewrap sandbox: an SVG,
a Plotly ``fig.show()`` and an Altair chart come back as PNGs that Pillow decodes, without
writing into the workspace or leaving a process behind; HTML- and LaTeX-only outputs read as
text; a JPEG display is sent as a JPEG; the notebook export keeps the original bundles.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import nbformat
import pytest
import pytest_asyncio
from PIL import Image

from bot.agent.observation import format_observation
from bot.agent.prompt import build_system_prompt
from bot.displays import CHART_MIME
from bot.notebook import export_notebook
from bot.transcript import CellEntry, result_to_outputs
from bot.turn import Outputs, collect_outputs
from kernels import KernelPool, KernelSession, build_pool
from kernels.forking.launcher import ForkingLauncher
from kernels.seam.result import DisplayOutput, ExecutionResult
from kernels.session.output import OutputCollector
from tests.kernels.conftest import kernel_settings
from tests.security import conftest as security

in_module_loop = pytest.mark.asyncio(loop_scope="module")  # the pool lives in the module's loop

PLOTLY = "application/vnd.plotly.v1+json"
SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="100" height="50"><circle cx="25" cy="25" r="20" fill="red"/></svg>'
)
REQUIREMENTS = Path(__file__).resolve().parents[2] / "kernels" / "requirements.txt"


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["none", "bwrap", "bwrap-fork"])
async def display_pool(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[KernelPool]:
    """Kernels unsandboxed, spawned in bubblewrap and forked by the sandboxed fork server
    (the sandboxed ones skipped, with the reason, where bubblewrap cannot run)."""
    sandbox, _, fork = request.param.partition("-")
    if sandbox == "bwrap" and security.SKIP_REASON:
        pytest.skip(security.SKIP_REASON)
    root = tmp_path_factory.mktemp(f"display-{request.param}")
    # The first Plotly figure imports plotly and starts Chromium: seconds on a loaded 2-core machine.
    pool = build_pool(kernel_settings(root, sandbox=sandbox, fork_server=bool(fork), exec_timeout_s=120))
    await pool.start()
    if fork:
        assert isinstance(pool.launcher, ForkingLauncher) and pool.launcher.available, "the fork server did not start"
    yield pool
    await pool.shutdown_all()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session(display_pool: KernelPool) -> KernelSession:
    started = await display_pool.get_or_start("slack:C1:charts")
    if isinstance(display_pool.launcher, ForkingLauncher):
        assert security.kernel_source(display_pool, started) == "fork", "the fork server did not fork this kernel"
    return started


def only_image(result: ExecutionResult) -> tuple[DisplayOutput, Image.Image]:
    """The one output that carries an image, and that image decoded by Pillow."""
    assert result.ok, result.error
    outputs = [out for out in [*result.displays, result.result_data] if out is not None and out.png() is not None]
    assert len(outputs) == 1, [sorted(out.data) for out in [*result.displays, result.result_data] if out]
    png = outputs[0].png()
    assert png is not None
    image = Image.open(io.BytesIO(png))
    image.load()
    assert image.format == "PNG"
    return outputs[0], image


def assert_clean(result: ExecutionResult) -> None:
    """Rendering wrote nothing into the workspace and left no process behind."""
    assert result.changed_files == []
    assert result.notice is None  # a leftover Chromium would have been killed, with a notice


@in_module_loop
async def test_kernel_start_imports_no_chart_library(display_pool: KernelPool) -> None:
    fresh = await display_pool.get_or_start("slack:C1:fresh")
    result = await fresh.execute(
        "import sys\nsorted(m for m in ('plotly', 'altair', 'vl_convert', 'kaleido') if m in sys.modules)"
    )
    assert result.result == "[]"
    await display_pool.shutdown("slack:C1:fresh")


@in_module_loop
async def test_svg_comes_back_as_png(session: KernelSession) -> None:
    result = await session.execute(f"from IPython.display import SVG, display\ndisplay(SVG({SVG!r}))")
    output, image = only_image(result)
    assert image.size == (200, 100)  # twice the declared size, for high-density screens
    assert image.convert("RGB").getpixel((50, 50)) == (255, 0, 0)  # the circle's centre
    assert output.data["image/svg+xml"].startswith("<svg")  # the original stays in the bundle
    assert_clean(result)
    assert "1 image displayed" in format_observation(result)


@in_module_loop
async def test_svg_without_namespace_is_drawn_as_a_notebook_would(session: KernelSession) -> None:
    bare = '<svg height="40" width="60"><rect width="60" height="40" fill="blue"/></svg>'  # no xmlns
    result = await session.execute(f"from IPython.display import SVG\nSVG({bare!r})")
    output, image = only_image(result)
    assert image.size == (120, 80) and image.convert("RGB").getpixel((60, 40)) == (0, 0, 255)
    assert output.data["image/svg+xml"] == bare  # the original is kept as it was


@in_module_loop
async def test_plotly_show_comes_back_as_png(session: KernelSession) -> None:
    result = await session.execute(
        "import plotly.express as px\nfig = px.bar(x=['a', 'b', 'c'], y=[3, 1, 2], title='Sales')\nfig.show()"
    )
    output, image = only_image(result)
    assert image.size == (1400, 1000)  # plotly's 700 × 500 at scale 2
    assert isinstance(output.data[PLOTLY], dict) and output.data[PLOTLY]["layout"]["title"]["text"] == "Sales"
    assert_clean(result)
    again = await session.execute("fig")  # a figure as the last expression shows itself too
    assert only_image(again)[1].size == (1400, 1000)
    assert_clean(again)
    assert list(session.workspace.path.iterdir()) == []  # not even a hidden Chromium profile


@in_module_loop
async def test_altair_chart_as_last_expression_comes_back_as_png(session: KernelSession) -> None:
    result = await session.execute(
        "import altair as alt, pandas as pd\n"
        "alt.Chart(pd.DataFrame({'x': [1, 2, 3], 'y': [3, 1, 2]})).mark_line().encode(x='x', y='y')"
    )
    output, image = only_image(result)
    assert output is result.result_data
    assert image.width > 200 and image.height > 200
    specs = [mime for mime in output.data if re.fullmatch(r"application/vnd\.vegalite\.v\d+\+json", mime)]
    assert len(specs) == 1 and output.data[specs[0]]["mark"]["type"] == "line"
    assert_clean(result)
    assert "If you see this message" not in format_observation(result)  # Altair's advice for browsers


@in_module_loop
async def test_a_picture_too_extreme_to_render_keeps_its_bundle_with_a_note(session: KernelSession) -> None:
    thin = '<svg xmlns="http://www.w3.org/2000/svg" width="1e9" height="1"><rect width="10" height="1"/></svg>'
    result = await session.execute(f"from IPython.display import SVG, display\ndisplay(SVG({thin!r}))")
    assert result.ok and len(result.displays) == 1
    shown = result.displays[0]
    assert shown.png() is None and shown.data["image/svg+xml"] == thin
    observation = format_observation(result)
    assert "SVG image not shown as an image" in observation and "too extreme" in observation
    assert (await session.execute("1 + 1")).result == "2"  # the kernel is fine


@in_module_loop
async def test_a_render_that_takes_too_long_is_given_up_and_leaves_nothing_running(session: KernelSession) -> None:
    result = await session.execute(
        "import plotly.graph_objects as go, threadbook_kernel.render as render\n"
        "render.RENDER_TIMEOUT_S = 0.05\n"
        "try:\n    go.Figure(go.Bar(y=[1, 2])).show()\nfinally:\n    render.RENDER_TIMEOUT_S = 20.0"
    )
    assert result.ok and len(result.displays) == 1 and result.displays[0].png() is None
    assert PLOTLY in result.displays[0].data
    assert "Plotly figure not shown as an image: rendering the Plotly figure took over 0.05 s" in format_observation(
        result
    )
    assert_clean(result)  # Chromium was killed with its process group, not left to the leftover sweep
    assert (await session.execute("1 + 1")).result == "2"


@in_module_loop
async def test_html_and_latex_only_outputs_read_as_text(display_pool: KernelPool) -> None:
    session = await display_pool.get_or_start("slack:C1:html")
    html = await session.execute(
        "from IPython.display import HTML, Latex, display\n"
        "display(HTML('<style>td {color: red}</style><h3>Totals</h3>"
        "<table><tr><th>region</th><th>sales</th></tr><tr><td>north</td><td>12</td></tr></table>'))\n"
        "import pandas as pd\n"
        "pd.DataFrame({'sales': [5, 7]}, index=['east', 'west']).style.highlight_max()"
    )
    observation = format_observation(html)
    assert "Totals\nregion | sales\nnorth | 12" in observation
    assert "color" not in observation  # the style sheet is not text
    assert "east | 5" in observation and "west | 7" in observation  # the Styler, as rows
    assert "object" not in observation and " at 0x" not in observation
    latex = await session.execute("Latex(r'$\\frac{a}{b}$')")
    assert "\\frac{a}{b}" in format_observation(latex)
    await display_pool.shutdown("slack:C1:html")


@in_module_loop
async def test_jpeg_display_is_sent_as_jpeg(session: KernelSession) -> None:
    result = await session.execute(
        "import io\nfrom PIL import Image as P\nfrom IPython.display import Image, display\n"
        "buffer = io.BytesIO()\nP.new('RGB', (40, 30), 'blue').save(buffer, 'JPEG')\n"
        "display(Image(data=buffer.getvalue(), format='jpeg'))"
    )
    assert result.ok, result.error
    outputs = Outputs()
    await collect_outputs([result], session.workspace, outputs)
    assert [(image.mime, image.title, image.filename) for image in outputs.images] == [
        ("image/jpeg", "figure-1.jpg", "figure-1.jpg")
    ]
    assert Image.open(io.BytesIO(outputs.images[0].data)).format == "JPEG"
    assert "1 image displayed" in format_observation(result)


@in_module_loop
async def test_notebook_export_keeps_the_original_bundles(session: KernelSession) -> None:
    code = (
        "import plotly.graph_objects as go, altair as alt, pandas as pd\n"
        "from IPython.display import SVG, display\n"
        f"display(SVG({SVG!r}))\n"
        "go.Figure(go.Scatter(x=[1, 2], y=[2, 1])).show()\n"
        "alt.Chart(pd.DataFrame({'x': [1, 2]})).mark_point().encode(x='x')"
    )
    result = await session.execute(code)
    assert result.ok, result.error
    cell = CellEntry(1, code, result_to_outputs(result), result.execution_count, "ok", 1.0, 0.0)
    notebook = nbformat.reads(export_notebook([cell], title="charts").decode(), as_version=4)
    nbformat.validate(notebook)
    outputs = [output for c in notebook.cells if c.cell_type == "code" for output in c.outputs]
    bundles = [output["data"] for output in outputs if "data" in output]
    assert [sorted(b) for b in bundles] == [
        ["image/png", "image/svg+xml", "text/plain"],
        sorted([PLOTLY, CHART_MIME, "image/png", "text/plain"]),  # a line Slack can draw: its data too
        ["application/vnd.vegalite.v6+json", "image/png", "text/plain"],
    ]
    assert bundles[0]["image/svg+xml"] == SVG
    assert bundles[1][PLOTLY]["data"][0]["type"] == "scatter"
    assert bundles[2]["application/vnd.vegalite.v6+json"]["mark"]["type"] == "point"
    assert all(Image.open(io.BytesIO(base64.b64decode(b["image/png"]))).format == "PNG" for b in bundles)
    assert_clean(result)


def test_export_stays_valid_for_structured_data_under_a_text_type() -> None:
    odd = DisplayOutput({"application/vnd.vegalite.v6.json": {"mark": "bar"}, "text/plain": "chart"})
    result = ExecutionResult(displays=[odd])
    cell = CellEntry(1, "chart", result_to_outputs(result), 1, "ok", 0.1, 0.0)
    notebook = nbformat.reads(export_notebook([cell], title="t").decode(), as_version=4)
    data = notebook.cells[1].outputs[0]["data"]
    assert json.loads(data["application/vnd.vegalite.v6.json"]) == {"mark": "bar"}


def test_prompt_names_the_main_libraries_of_the_kernel() -> None:
    infrastructure = {"ipykernel", "matplotlib-inline", "vl-convert-python", "kaleido", "dill", "nbconvert"}
    names = [
        re.split(r"[<>=!~\[ ]", line.strip())[0]
        for line in REQUIREMENTS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    prompt = build_system_prompt()
    missing = [name for name in names if name not in infrastructure and name not in prompt]
    assert names and not missing, f"kernels/requirements.txt has libraries the prompt does not name: {missing}"
    assert "fig.show()" in prompt and "plt.show()" in prompt and "Altair" in prompt


def test_collector_keeps_rich_payloads_whole_and_cuts_only_plain_text() -> None:
    collector = OutputCollector(max_bytes=1000, max_display_bytes=40_000)
    svg = "<svg>" + "x" * 5000 + "</svg>"
    collector.handle("display_data", {"data": {"image/svg+xml": svg, "text/plain": "p" * 5000}})
    collector.handle("display_data", {"data": {"text/html": "h" * 20_000, "text/plain": "big page"}})
    first, second = collector.displays()
    assert first.data["image/svg+xml"] == svg  # a cut SVG would be broken
    assert len(first.data["text/plain"]) < 1100 and "bytes truncated" in first.data["text/plain"]
    assert second.data == {"text/plain": "big page"}  # over a quarter of the budget: left out whole
