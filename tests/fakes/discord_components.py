"""Components v2 as the fake Discord checks them (what Discord answers 400 for).

A message with the ``IS_COMPONENTS_V2`` flag (``1 << 15``) has no ``content`` or ``embeds``; its
``components`` are at most 40 in all (nested ones counted), of the layout types (action row 1,
section 9, text display 10, thumbnail 11, media gallery 12, file 13, separator 14, container 17;
a container holds action rows, sections, text displays, media galleries, files and separators),
with at most 4,000 characters of text displays in all. A media gallery has 1–10 items, each
``{"media": {"url": ...}}``; a file component ``{"file": {"url": ...}}``; an ``attachment://``
URL must name a file uploaded with the message.
"""

from __future__ import annotations

from typing import Any

IS_COMPONENTS_V2 = 1 << 15
MAX_COMPONENTS = 40
MAX_TEXT = 4000
MAX_GALLERY_ITEMS = 10
_TOP = {1, 9, 10, 12, 13, 14, 17}
_IN_CONTAINER = {1, 9, 10, 12, 13, 14}


class _Invalid(Exception):
    pass


def is_v2(body: dict[str, Any]) -> bool:
    """Whether the message asks for components v2."""
    return bool(int(body.get("flags") or 0) & IS_COMPONENTS_V2)


def check_v2(body: dict[str, Any], uploads: list[str]) -> str | None:
    """Why Discord refuses this components-v2 message (None: it takes it); ``uploads``: the names
    of the files sent with it."""
    try:
        if body.get("content") or body.get("embeds"):
            raise _Invalid("content or embeds with IS_COMPONENTS_V2")
        components = body.get("components")
        if not isinstance(components, list) or not components:
            raise _Invalid("no components")
        count = [0, 0]  # components, text characters
        for component in components:
            _component(component, _TOP, uploads, count)
        if count[0] > MAX_COMPONENTS:
            raise _Invalid(f"{count[0]} components (at most {MAX_COMPONENTS})")
        if count[1] > MAX_TEXT:
            raise _Invalid(f"{count[1]} characters of text (at most {MAX_TEXT})")
    except _Invalid as exc:
        return str(exc)
    return None


def text_of(components: list[dict[str, Any]]) -> list[str]:
    """Every text display's content, in order (nested ones included)."""
    out: list[str] = []
    for component in components:
        if component.get("type") == 10:
            out.append(str(component.get("content", "")))
        out += text_of(component.get("components") or [])
    return out


def attachments_of(components: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(component type, ``attachment://`` name) of every gallery item and file component."""
    out: list[tuple[int, str]] = []
    for component in components:
        kind = component.get("type")
        if kind == 12:
            out += [(12, str(item["media"]["url"]).removeprefix("attachment://")) for item in component["items"]]
        elif kind == 13:
            out.append((13, str(component["file"]["url"]).removeprefix("attachment://")))
        out += attachments_of(component.get("components") or [])
    return out


def _component(component: Any, allowed: set[int], uploads: list[str], count: list[int]) -> None:
    if not isinstance(component, dict) or component.get("type") not in allowed:
        raise _Invalid(f"component type {component.get('type') if isinstance(component, dict) else component!r}")
    count[0] += 1
    kind = component["type"]
    if kind == 17:
        children = component.get("components")
        if not isinstance(children, list) or not children:
            raise _Invalid("an empty container")
        for child in children:
            _component(child, _IN_CONTAINER, uploads, count)
    elif kind == 1:
        buttons = component.get("components")
        if not isinstance(buttons, list) or not 1 <= len(buttons) <= 5:
            raise _Invalid("an action row of 1–5 items")
        count[0] += len(buttons)
    elif kind == 10:
        content = component.get("content")
        if not isinstance(content, str) or not content:
            raise _Invalid("a text display without content")
        count[1] += len(content)
    elif kind == 12:
        items = component.get("items")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_GALLERY_ITEMS:
            raise _Invalid(f"a media gallery of 1–{MAX_GALLERY_ITEMS} items")
        for item in items:
            _media(item.get("media") if isinstance(item, dict) else None, uploads)
    elif kind == 13:
        _media(component.get("file"), uploads)


def _media(media: Any, uploads: list[str]) -> None:
    url = media.get("url") if isinstance(media, dict) else None
    if not isinstance(url, str) or not url:
        raise _Invalid("media without a url")
    if url.startswith("attachment://") and url.removeprefix("attachment://") not in uploads:
        raise _Invalid(f"{url} names no file uploaded with the message")
