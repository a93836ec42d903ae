"""``export html``: the thread's notebook as one self-contained web page, rendered in a one-shot.

The bot builds the thread's ``.ipynb`` from its store (its own bytes), writes it into a fresh
private scratch folder and runs ``python -I -m threadbook_kernel.export <notebook> <page>
<max bytes>`` there, in a new sandboxed process that no thread's code has touched
(``kernels/oneshot.py``); it reads the page back with a size cap. The page is made here, never
in the bot: the outputs in a notebook are whatever a kernel printed, so parsing and rendering
them (nbconvert, Markdown, HTML sanitising) costs this sandboxed process at most. It is never
asked of the thread's kernel, where a cell could have replaced this module.

The page is one file with nothing to fetch: nbconvert's lab template without its scripts
(require.js, MathJax, Mermaid, the widget manager: every one is loaded from a CDN), images as
``data:`` URIs, HTML outputs and Markdown through an allow-list sanitiser (no script, no event
handler, no style, images only as ``data:`` URIs), then one last pass over the whole page that
drops any element that loads or runs something and any attribute that points off the page,
and a Content-Security-Policy that lets a browser load nothing but what is inline.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import sys
import tempfile
from typing import Any

from threadbook_kernel.answer import first_line

__all__ = ["prepare", "render"]

#: What a browser may load for the page: nothing from anywhere but the page itself.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:; base-uri 'none'; form-action 'none'"
)

#: Which representation of an output is shown, best first. Widgets and JavaScript are left out
#: (they need scripts; their ``text/plain`` is shown), Mermaid too (nbconvert writes it unescaped).
_PRIORITY = [
    "text/html",
    "text/markdown",
    "image/svg+xml",
    "text/latex",
    "image/png",
    "image/jpeg",
    "text/plain",
]
#: nbconvert's lab page with every script block emptied (each would load from a CDN).
_TEMPLATE_NAME = "threadbook_export.html.j2"
_TEMPLATE = """\
{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block data_javascript -%}{%- endblock data_javascript -%}
{%- block data_widget_view -%}{%- endblock data_widget_view -%}
{%- block data_mermaid scoped -%}
<div class="jp-RenderedText jp-OutputArea-output"><pre>{{ output.data['text/vnd.mermaid'] | escape_html }}</pre></div>
{%- endblock data_mermaid -%}
"""

# --- the sanitiser of HTML outputs and Markdown (nbconvert's ``clean_html`` filter) -------------

_TAGS = frozenset(
    "a abbr acronym b blockquote br caption code col colgroup dd del details dfn div dl dt em figcaption "
    "figure h1 h2 h3 h4 h5 h6 hr i img ins kbd li mark ol p pre q s samp small span strike strong sub "
    "summary sup table tbody td tfoot th thead tr tt u ul var".split()
)
_COMMON_ATTRIBUTES = frozenset({"class", "id", "title", "lang", "dir"})
_CELL_ATTRIBUTES = frozenset({"colspan", "rowspan", "align", "valign", "scope", "headers"})
_TAG_ATTRIBUTES = {
    "td": _CELL_ATTRIBUTES,
    "th": _CELL_ATTRIBUTES,
    "table": frozenset({"border", "summary"}),
    "ol": frozenset({"start", "reversed", "type"}),
    "col": frozenset({"span"}),
    "colgroup": frozenset({"span"}),
    "details": frozenset({"open"}),
}
_IMAGE_DATA = ("data:image/png;", "data:image/jpeg;", "data:image/gif;", "data:image/webp;", "data:image/svg+xml;")
_LINK_SCHEMES = re.compile(r"^(https?:|mailto:|#)", re.IGNORECASE)


def _allowed_attribute(tag: str, name: str, value: str) -> bool:
    if name in _COMMON_ATTRIBUTES or name in _TAG_ATTRIBUTES.get(tag, ()):
        return True
    if tag == "a":
        return name == "href" and bool(_LINK_SCHEMES.match(value.strip()))
    if tag == "img":
        if name == "src":
            return value.strip().lower().startswith(_IMAGE_DATA)
        return name in ("alt", "width", "height")
    return False


def clean_html(element: Any) -> str:
    """An HTML fragment with only the tags and attributes of a document (tables, lists, text,
    links, images as ``data:`` URIs); anything else (``<script>``, ``<iframe>``, an ``on…``
    handler, a ``style`` attribute) is written out as text or dropped. ``<style>`` elements
    (pandas puts one before every DataFrame) go whole: the page's own styles lay tables out,
    and CSS written out as text would precede each table. nbconvert's own filter leaves out
    paragraphs, headings and table heads, which turns every DataFrame into text."""
    import bleach
    from bs4 import BeautifulSoup

    text = element.decode() if isinstance(element, bytes) else str(element)
    if "<style" in text.lower():
        soup = BeautifulSoup(text, features="html.parser")
        for style in soup.find_all("style"):
            style.decompose()
        text = str(soup)
    return str(
        bleach.clean(
            text,
            tags=_TAGS,
            attributes=_allowed_attribute,
            protocols={"http", "https", "mailto", "data"},
            strip_comments=True,
        )
    )


# --- the last pass over the whole page -----------------------------------------------------------

#: Elements that run or load something: removed wherever they are.
_ACTIVE = (
    "script noscript iframe frame frameset object embed applet base link portal audio video source "
    "track form input button textarea select svg math".split()
)
#: Attributes that name something to load or open.
_URL_ATTRIBUTES = frozenset(
    "src srcset href xlink:href poster background action formaction data codebase cite longdesc lowsrc "
    "dynsrc manifest ping profile usemap icon archive classid".split()
)
_CSS_IMPORT = re.compile(r"@import[^;]*;?", re.IGNORECASE)
_CSS_URL = re.compile(r"url\(\s*(?!['\"]?data:)[^)]*\)", re.IGNORECASE)
_CSS_RISKY = re.compile(r"url\(|@import|expression\(|behavior:|-moz-binding", re.IGNORECASE)


def _self_contained(html: str) -> str:
    """The page with nothing that runs or loads from elsewhere, and its Content-Security-Policy."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, features="html.parser")
    for element in soup.find_all(_ACTIVE):
        element.decompose()
    for element in soup.find_all("meta", attrs={"http-equiv": True}):
        element.decompose()
    for element in soup.find_all("style"):
        css = element.string or ""
        element.string = _CSS_URL.sub("none", _CSS_IMPORT.sub("", css))
    for element in soup.find_all(True):
        for name, value in list(element.attrs.items()):
            text = " ".join(value) if isinstance(value, list) else str(value)
            lowered, key = text.strip().lower(), name.lower()
            if key.startswith("on") or key == "srcdoc":
                del element.attrs[name]
            elif key == "style" and _CSS_RISKY.search(text):
                del element.attrs[name]
            elif key in _URL_ATTRIBUTES:
                if element.name == "a" and key == "href" and _LINK_SCHEMES.match(lowered):
                    continue
                if (key == "src" and lowered.startswith(_IMAGE_DATA)) or lowered.startswith("#"):
                    continue
                del element.attrs[name]
    head = soup.head
    if head is not None:
        policy = soup.new_tag(
            "meta", attrs={"http-equiv": "Content-Security-Policy", "content": CONTENT_SECURITY_POLICY}
        )
        head.insert(0, policy)
        charset = soup.new_tag("meta", attrs={"charset": "utf-8"})
        head.insert(0, charset)
        for extra in head.find_all("meta", attrs={"charset": True})[1:]:
            extra.decompose()
    return str(soup)


@functools.cache
def _exporter() -> Any:
    """The page's exporter, made once per process: its templates are compiled on first use."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    exporter = HTMLExporter(
        config=Config({"NbConvertBase": {"display_data_priority": _PRIORITY}}),
        template_name="lab",
        embed_images=True,
        sanitize_html=True,
        extra_loaders=[DictLoader({_TEMPLATE_NAME: _TEMPLATE})],
        filters={"clean_html": clean_html},
    )
    exporter.template_file = _TEMPLATE_NAME
    return exporter


def prepare() -> None:
    """Render a made-up notebook (a Markdown cell, a cell with text and HTML output): the
    imports, the compiled templates and the sanitiser are ready before a one-shot fork server
    forks any job."""
    render(json.dumps(_SAMPLE))


#: The notebook :func:`prepare` renders (trusted: made here).
_SAMPLE = {
    "nbformat": 4,
    "nbformat_minor": 5,
    "metadata": {"title": "sample"},
    "cells": [
        {"cell_type": "markdown", "id": "a", "metadata": {}, "source": "**sample** `code`"},
        {
            "cell_type": "code",
            "id": "b",
            "metadata": {},
            "execution_count": 1,
            "source": "1",
            "outputs": [
                {"output_type": "stream", "name": "stdout", "text": "1\n"},
                {
                    "output_type": "execute_result",
                    "execution_count": 1,
                    "metadata": {},
                    "data": {"text/plain": "1", "text/html": "<table><tr><td>1</td></tr></table>"},
                },
            ],
        },
    ],
}


def render(notebook: str) -> str:
    """One self-contained HTML page of the notebook (JSON text); raises when it is not one."""
    import nbformat

    node = nbformat.reads(notebook, as_version=4)  # type: ignore[no-untyped-call]
    node.metadata.pop("widgets", None)
    exporter = _exporter()
    title = str(node.metadata.get("title") or "Threadbook thread")
    # Markdown images are embedded from this (empty) folder only: nothing of the file system is
    # read into the page, whatever a message's Markdown names.
    with tempfile.TemporaryDirectory(prefix="threadbook-export-") as nothing:
        html, _ = exporter.from_notebook_node(node, resources={"metadata": {"name": title, "path": nothing}})
    return _self_contained(html)


# --- the one-shot's entry point -----------------------------------------------------------------


def _main(argv: list[str]) -> dict[str, Any]:
    """Render the notebook file ``argv[0]`` of the current folder into the new file ``argv[1]``,
    unless the page is over ``argv[2]`` bytes."""
    source, target, max_bytes = argv[0], argv[1], int(argv[2])
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ValueError("the notebook is not a regular file")
        notebook = file.read().decode("utf-8")
    page = render(notebook).encode("utf-8")
    if len(page) > max_bytes:
        return {"error": "too_big", "bytes": len(page)}
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    out = os.open(target, flags, 0o644)
    with os.fdopen(out, "wb") as file:
        file.write(page)
    return {"ok": True, "bytes": len(page)}


if __name__ == "__main__":
    try:
        result = _main(sys.argv[1:])
    except Exception as exc:
        result = {"error": "failed", "detail": f"{type(exc).__name__}: {first_line(exc)}"}
    print(json.dumps(result))
