"""What the model is told of an MCP tool's result, and what is saved into the thread's workspace.

- A text result up to :data:`MAX_TEXT_CHARS` goes to the model whole.
- A longer one is saved as a file (streamed to disk in slices, never copied whole) and the
  model gets its name, its size and its first :data:`HEAD_CHARS` characters.
- Anything but text (images, audio, embedded resources) is saved as a file, and the model is
  told each file's name, type and size; a resource link is described (not fetched).
- A result the server marks as an error is one sentence with the server's words, cut short.

Files are written through :meth:`kernels.workspace.Workspace.save_upload` (a new unique
name, never following a link, within the per-file limit and the workspace's quota), so the
kernel can load them. Every text (and the bytes of every file) has the servers' secrets hidden.
"""

from __future__ import annotations

import base64
import binascii
import json
import mimetypes
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from urllib.parse import urlsplit

import mcp_types as types

from bot.mcp.hiding import Hider, one_line
from kernels import QuotaError, UnsafePathError, Workspace

#: A text result up to this many characters goes to the model as it is.
MAX_TEXT_CHARS = 8_000
#: Of a longer one the model sees this many characters (the whole of it is in the file).
HEAD_CHARS = 2_000
#: Text is written to disk in slices of this many characters.
_SLICE = 64 * 1024
_EXTENSIONS = {"text/csv": ".csv", "application/json": ".json", "text/plain": ".txt", "text/markdown": ".md"}


@dataclass
class Presented:
    """The tool message for the model, and the files saved for it."""

    text: str
    files: list[str] = field(default_factory=list)
    #: The server said the call failed.
    error: bool = False
    #: Why the last file could not be saved.
    error_note: str = ""


async def present(result: types.CallToolResult, *, function: str, workspace: Workspace, hider: Hider) -> Presented:
    """The model's view of ``result`` (a call of ``function``), saving into ``workspace`` what
    is too large or not text. ``result`` is emptied as it is read, so that no part of it is
    kept longer than needed."""
    content = list(result.content)
    result.content = []
    if result.is_error:
        said = " ".join(part.text for part in content if isinstance(part, types.TextContent))
        said = hider.line(said, 300) or "no reason given"
        return Presented(f"The tool reported an error: {said}", error=True)
    texts = [part.text for part in content if isinstance(part, types.TextContent)]
    others = [part for part in content if not isinstance(part, types.TextContent)]
    del content
    if not texts and not others and result.structured_content is not None:
        texts = [json.dumps(result.structured_content, ensure_ascii=False, default=str)]
    result.structured_content = None
    text = hider.hide("\n".join(texts))
    del texts
    out = Presented("")
    lines: list[str] = []
    if len(text) <= MAX_TEXT_CHARS:
        if text:
            lines.append(text)
    else:
        suffix = ".json" if text.lstrip()[:1] in ("{", "[") else ".txt"
        saved = await _save(workspace, f"{function}{suffix}", _text_slices(text), out)
        head = text[:HEAD_CHARS]
        if saved is None:
            lines.append(
                f"The result is {len(text):,} characters; it could not be saved ({out.error_note}). "
                f"Its first {len(head):,} characters:\n{head}"
            )
        else:
            lines.append(
                f"The result is {len(text):,} characters, too long to show here: it is saved in the workspace as "
                f"`{saved}` (load it with python, e.g. open({saved!r}).read()). Its first {len(head):,} characters:\n{head}"
            )
    del text
    for part in others:
        lines.append(await _other(part, function, workspace, hider, out))
    out.text = "\n\n".join(line for line in lines if line) or "The tool returned nothing."
    return out


async def _other(part: types.ContentBlock, function: str, workspace: Workspace, hider: Hider, out: Presented) -> str:
    """Saves one non-text part and says what became of it."""
    if isinstance(part, types.ImageContent | types.AudioContent):
        kind = "An image" if isinstance(part, types.ImageContent) else "A recording"
        return await _blob(kind, part.data, part.mime_type, f"{function}", workspace, hider, out)
    if isinstance(part, types.EmbeddedResource):
        resource = part.resource
        name = _resource_name(resource.uri, resource.mime_type, function)
        if isinstance(resource, types.TextResourceContents):
            text = hider.hide(resource.text)
            saved = await _save(workspace, name, _text_slices(text), out)
            size = len(text)
            del text
            if saved is None:
                return f"A resource ({resource.mime_type or 'text'}) could not be saved ({out.error_note})."
            return f"A resource ({resource.mime_type or 'text'}, {size:,} characters) is saved as `{saved}`."
        return await _blob("A resource", resource.blob, resource.mime_type, name, workspace, hider, out)
    if isinstance(part, types.ResourceLink):
        what = hider.line(f"{part.name}: {part.uri}", 300)
        return f"A link to a resource (not fetched): {what}"
    return f"A part of type {one_line(str(getattr(part, 'type', 'unknown')), 40)} was left out."


async def _blob(
    kind: str, data: str, mime: str | None, name: str, workspace: Workspace, hider: Hider, out: Presented
) -> str:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"{kind} came that is not valid base64; it was left out."
    raw = hider.hide_bytes(raw)
    if not PurePosixPath(name).suffix:
        name += mimetypes.guess_extension(mime or "") or ".bin"
    saved = await _save(workspace, name, _one(raw), out)
    size = len(raw)
    del raw
    if saved is None:
        return f"{kind} ({mime or 'unknown type'}) could not be saved ({out.error_note})."
    return f"{kind} ({mime or 'unknown type'}, {size:,} bytes) is saved as `{saved}`."


async def _save(workspace: Workspace, name: str, chunks: AsyncIterator[bytes], out: Presented) -> str | None:
    """Streams ``chunks`` into a new file of the workspace; its name, or None (the reason in
    ``out.error_note``)."""
    try:
        saved = await workspace.save_upload(name, chunks)
    except QuotaError:
        out.error_note = "the workspace's quota or the per-file limit would be passed"
        return None
    except (OSError, UnsafePathError) as exc:
        out.error_note = f"the workspace could not be written: {type(exc).__name__}"
        return None
    saved.file.close()
    out.files.append(saved.name)
    return saved.name


async def _text_slices(text: str) -> AsyncIterator[bytes]:
    for start in range(0, len(text), _SLICE):
        yield text[start : start + _SLICE].encode("utf-8", "surrogatepass")


async def _one(data: bytes) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(view), 1 << 20):
        yield bytes(view[start : start + (1 << 20)])


def _resource_name(uri: str, mime: str | None, function: str) -> str:
    """A file name for an embedded resource: the function's name and its URI's last segment when
    that has an extension, else the function's name with the type's extension."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        parts = None
    last = ""
    if parts is not None:  # the path's last segment; for a scheme of the server's own (test://x.csv), its "host"
        last = PurePosixPath(parts.path).name or ("" if parts.scheme in ("http", "https") else parts.netloc)
    if last and PurePosixPath(last).suffix:
        return f"{function}-{last}"
    return function + (_EXTENSIONS.get(mime or "") or mimetypes.guess_extension(mime or "") or ".txt")
