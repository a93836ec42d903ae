"""Every output in its best chat form, made inside the kernel before it is sent.

:func:`install` wraps the shell's display publisher (``display()``, ``fig.show()``) and its
display hook (a cell's last expression), so each MIME bundle passes through :func:`improve`:

* an SVG, Vega-Lite/Vega or Plotly bundle without ``image/png`` gains one (see
  :mod:`threadbook_kernel.render`); the original types stay in the bundle, so a notebook
  export keeps the interactive chart; a Plotly or Vega-Lite chart whose data can be read also
  gains Threadbook's chart bundle (:mod:`threadbook_kernel.chartdata`), which a platform that
  draws charts itself can use;
* an HTML, LaTeX or Markdown bundle whose ``text/plain`` is only a default repr
  (``<IPython.core.display.HTML object>``) gets readable ``text/plain`` made from it;
* a render that fails, times out or is refused leaves the bundle as it was, with a short
  note in ``text/plain`` for the model.

Plotly and Altair are never imported here: right after user code imports them (a
``sys.meta_path`` hook), Plotly gets a renderer that displays the figure's JSON bundle (its
own mimetype renderer would need nbformat in the kernel) and Altair one that emits its
Vega-Lite spec. Both bundles then pass through the wrapper, which renders them.
"""

from __future__ import annotations

import base64
import importlib.abc
import importlib.machinery
import re
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["install", "improve"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: Where Plotly keeps its renderers (plotly 5 and 6).
PLOTLY_RENDERERS = "plotly.io._renderers"
#: Altair 6's own renderers name the type ``application/vnd.vegalite.v6.json`` (a dot).
_VEGALITE_MIME = re.compile(r"^application/vnd\.vegalite\.v\d+[+.]json$")
_VEGA_MIME = re.compile(r"^application/vnd\.vega\.v\d+[+.]json$")
#: A repr that says nothing: ``<IPython.core.display.HTML object>``, ``<x.Styler at 0x7f…>``.
_DEFAULT_REPR = re.compile(r"^<[\w.]+ (?:object(?: at 0x[0-9a-fA-F]+)?|at 0x[0-9a-fA-F]+)>$")
_IMAGES = ("image/png", "image/jpeg")
_INSTALLED = "_threadbook_display_installed"


def improve(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with a PNG for charts and vector images and readable text for HTML/LaTeX.

    Returns ``data`` itself when there is nothing to add, else a new dict; never raises
    (but lets ``KeyboardInterrupt`` through).
    """
    if not isinstance(data, dict) or any(mime in data for mime in _IMAGES):
        return data
    try:
        return _improved(data)
    except Exception as exc:
        return _with_note(data, "output", f"internal error: {type(exc).__name__}")


def _improved(data: dict[str, Any]) -> dict[str, Any]:
    from threadbook_kernel.render import RenderError  # on first use: kernel start-up stays lean

    render = _renderer(data)
    if render is not None:
        what, make = render
        try:
            png = make()
        except RenderError as exc:
            return _with_note(data, what, str(exc))
        return {**data, "image/png": base64.b64encode(png).decode("ascii"), **_chart_data(data)}
    plain = data.get("text/plain")
    if isinstance(plain, str) and not _DEFAULT_REPR.match(plain.strip()):
        return data
    readable = _readable_text(data)
    return {**data, "text/plain": readable} if readable else data


def _renderer(data: dict[str, Any]) -> tuple[str, Callable[[], bytes]] | None:
    """What to render this bundle's PNG from (a name for notes, the render), if anything."""
    from threadbook_kernel.render import plotly_to_png, svg_to_png, vega_to_png, vegalite_to_png

    figure = data.get(PLOTLY_MIME)
    if isinstance(figure, dict):
        return "Plotly figure", lambda: plotly_to_png(figure)
    for mime, spec in data.items():
        if isinstance(spec, dict) and _VEGALITE_MIME.match(mime):
            return "Vega-Lite chart", lambda spec=spec: vegalite_to_png(spec)
        if isinstance(spec, dict) and _VEGA_MIME.match(mime):
            return "Vega chart", lambda spec=spec: vega_to_png(spec)
    svg = data.get("image/svg+xml")
    if isinstance(svg, str):
        return "SVG image", lambda: svg_to_png(svg)
    return None


def _chart_data(data: dict[str, Any]) -> dict[str, Any]:
    """The chart bundle (:mod:`threadbook_kernel.chartdata`) of a Plotly or Vega-Lite bundle whose
    data can be read, as ``{CHART_MIME: bundle}``; empty for anything else, or on any failure."""
    from threadbook_kernel.chartdata import CHART_MIME, from_plotly, from_vegalite

    try:
        figure = data.get(PLOTLY_MIME)
        if isinstance(figure, dict):
            chart = from_plotly(figure)
        else:
            specs = [spec for mime, spec in data.items() if isinstance(spec, dict) and _VEGALITE_MIME.match(mime)]
            chart = from_vegalite(specs[0]) if specs else None
    except Exception:
        return {}  # a figure we cannot read stays a picture
    return {CHART_MIME: chart} if chart is not None else {}


def _readable_text(data: dict[str, Any]) -> str | None:
    html = data.get("text/html")
    if isinstance(html, str) and html.strip():
        from threadbook_kernel.htmltext import html_to_text

        return html_to_text(html) or None
    for mime in ("text/latex", "text/markdown"):
        value = data.get(mime)
        if isinstance(value, str) and value.strip():
            return value.strip()[:20_000]
    return None


def _with_note(data: dict[str, Any], what: str, reason: str) -> dict[str, Any]:
    note = f"[{what} not shown as an image: {reason}]"
    plain = data.get("text/plain")
    text = note if not isinstance(plain, str) or _DEFAULT_REPR.match(plain.strip()) else f"{plain}\n{note}"
    return {**data, "text/plain": text}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a hook right after a named module is first imported (found by the other finders)."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        del self.hooks[fullname]
        spec.loader = _HookedLoader(loader, hook)
        return spec


class _HookedLoader(importlib.abc.Loader):
    """The module's real loader, then the hook; the module keeps its real loader."""

    def __init__(self, loader: importlib.abc.Loader, hook: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            self.hook(module)
        except Exception:
            pass


def _configure_plotly(renderers: ModuleType) -> None:
    """``fig.show()`` and a figure as a cell's last expression display the figure's JSON."""
    import json

    from plotly.io._base_renderers import ExternalRenderer
    from plotly.io.json import to_json_plotly

    class ChatRenderer(ExternalRenderer):  # type: ignore[misc]
        def render(self, fig_dict: dict[str, Any]) -> None:
            from IPython.display import display

            figure = json.loads(to_json_plotly(fig_dict))
            display({PLOTLY_MIME: figure, "text/plain": "<Plotly figure>"}, raw=True)  # type: ignore[no-untyped-call]

    renderers.renderers["threadbook"] = ChatRenderer()
    renderers.renderers.default = "threadbook"


def _configure_altair(altair: ModuleType) -> None:
    """Altair emits its Vega-Lite spec (which :func:`improve` renders), not HTML, under the
    standard ``+json`` type (Altair 6's own ``mimetype`` renderer says ``….v6.json``, which
    notebook front ends do not draw and nbformat does not accept as JSON)."""

    def chat_renderer(spec: dict[str, Any], **metadata: Any) -> dict[str, Any]:
        match = re.search(r"vega-lite/v(\d+)", str(spec.get("$schema", "")))
        major = match.group(1) if match else "5"
        return {f"application/vnd.vegalite.v{major}+json": spec, "text/plain": f"<VegaLite {major} chart>"}

    altair.renderers.register("threadbook", chat_renderer)
    altair.renderers.enable("threadbook")


def install() -> None:
    """Route this kernel's displays through :func:`improve`; idempotent, no heavy import."""
    hooks = {PLOTLY_RENDERERS: _configure_plotly, "altair": _configure_altair}
    for name, configure in list(hooks.items()):
        if name in sys.modules:
            del hooks[name]
            configure(sys.modules[name])
    if hooks and not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(hooks))
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or getattr(shell, _INSTALLED, False):
        return
    setattr(shell, _INSTALLED, True)
    publisher = shell.display_pub
    publish = publisher.publish

    def improved_publish(data: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return publish(improve(data), *args, **kwargs)

    publisher.publish = improved_publish
    hook = shell.displayhook
    write_format_data = hook.write_format_data

    def improved_write(format_dict: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return write_format_data(improve(format_dict), *args, **kwargs)

    hook.write_format_data = improved_write
