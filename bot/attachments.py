"""Uploads: stream chat attachments into the thread's workspace and preview them for the model.

:func:`ingest` saves each attachment through the kernel layer (sanitised unique names,
per-file and per-workspace quotas, no partial files); :func:`add_previews` has a few lines
computed about each saved file (CSV columns, dtypes, rows; Excel sheets; JSON shape; ...);
:func:`describe_for_model` is the block added to the user's message.

The bot never parses an upload, and never asks the thread's kernel to: a cell could have
replaced the preview function there. Each preview runs ``threadbook_kernel.preview`` in a
fresh sandboxed one-shot process (:mod:`kernels.oneshot`) that reads the file through a
descriptor the bot opened itself (no link followed, a regular file only), so a crafted file
(a zip-bomb workbook, a huge sparse CSV, an image whose header claims billions of pixels)
costs that process, never the bot or the thread. What comes back is treated as untrusted
text: bounded, and replaced by "no preview" when the process fails or is too slow (killed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import mimetypes
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

from bot.events import Attachment, FetchRefused
from bot.safetext import shown
from kernels import KernelError, OneShot, OneShotUnavailableError, QuotaError, UnsafePathError, Workspace, safefs
from kernels import human_size as human_size  # re-exported for the adapters (which never import kernels)

log = logging.getLogger(__name__)

#: A preview still running after this long is killed and replaced by a one-line description.
PREVIEW_TIMEOUT_S = 10.0
#: A preview is cut to this many characters (the one-shot cuts it too; the bot does not trust it to).
MAX_PREVIEW_CHARS = 3000
#: A one-shot's answer longer than this many bytes is cut there (its process killed), not decoded.
_MAX_ANSWER_BYTES = 8 * MAX_PREVIEW_CHARS


@dataclass(frozen=True, slots=True)
class SavedUpload:
    """An attachment saved in the workspace, with its preview for the model (empty until
    :func:`add_previews` had it computed)."""

    name_in_workspace: str
    original_name: str
    size: int
    preview: str = ""


@dataclass(slots=True)
class IngestResult:
    """What :func:`ingest` did: files saved, and files refused with a reason for the user."""

    saved: list[SavedUpload] = field(default_factory=list)
    #: (original name, one-sentence reason, e.g. "it is 2.0 GB, over the 100 MB upload limit.")
    refused: list[tuple[str, str]] = field(default_factory=list)


class _OverLimit(Exception):
    """The stream turned out larger than the upload limit."""


async def ingest(attachments: Sequence[Attachment], workspace: Workspace, *, max_bytes: int) -> IngestResult:
    """Save attachments into ``workspace`` (streamed, capped); nothing is parsed here.

    An attachment whose declared size is over ``max_bytes`` is refused without being
    downloaded. A stream that exceeds ``max_bytes`` or the workspace quotas, or that fails
    midway, is refused and leaves no partial file (the workspace removes it).
    """
    outcome = IngestResult()
    for attachment in attachments:
        name = attachment.name
        if attachment.size is not None and attachment.size > max_bytes:
            reason = f"it is {human_size(attachment.size)}, over the {human_size(max_bytes)} upload limit."
            outcome.refused.append((name, reason))
            continue
        try:
            async with aclosing(_capped(attachment.fetch(), max_bytes)) as stream:
                saved = await workspace.save_upload(name, stream, declared_size=attachment.size)
        except _OverLimit:
            outcome.refused.append((name, f"it is larger than the {human_size(max_bytes)} upload limit."))
            continue
        except QuotaError:
            reason = (
                "it would go over this thread's storage limits "
                f"({human_size(workspace.max_file_bytes)} per file, {human_size(workspace.quota_bytes)} in all)."
            )
            outcome.refused.append((name, reason))
            continue
        except KernelError as exc:
            log.warning("could not store upload %r: %s", name, exc)
            outcome.refused.append((name, "it could not be stored safely in the workspace."))
            continue
        except FetchRefused as exc:
            outcome.refused.append((name, str(exc)))
            continue
        except Exception:
            log.warning("could not download upload %r", name, exc_info=True)
            outcome.refused.append((name, "it could not be downloaded from the chat platform; please try again."))
            continue
        saved.file.close()
        outcome.saved.append(SavedUpload(saved.name, name, saved.size))
    return outcome


async def _capped(chunks: AsyncIterator[bytes], max_bytes: int) -> AsyncGenerator[bytes, None]:
    """Pass chunks through, raising :class:`_OverLimit` past ``max_bytes``; closes the source."""
    seen = 0
    try:
        async for chunk in chunks:
            seen += len(chunk)
            if seen > max_bytes:
                raise _OverLimit
            yield chunk
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()


async def add_previews(uploads: Sequence[SavedUpload], workspace: Workspace, oneshot: OneShot) -> list[SavedUpload]:
    """``uploads`` (files of ``workspace``) with their previews, each from a one-shot of ``oneshot``."""
    return [
        replace(upload, preview=await preview(oneshot, workspace, upload.name_in_workspace, upload.size))
        for upload in uploads
    ]


async def preview(
    oneshot: OneShot, workspace: Workspace, name: str, size: int, *, timeout: float = PREVIEW_TIMEOUT_S
) -> str:
    """A short, model-readable summary of the workspace file ``name``, computed in a fresh
    sandboxed process from the file the bot opened; never raises.

    A preview that takes longer than ``timeout`` is killed; then, or when the process fails,
    the file cannot be opened safely, or previews are unavailable on this machine, the
    summary is one line saying there is no preview (and why).
    """
    if size == 0:
        return "empty file (0 bytes)."
    about = f"{_kind(name)}, {human_size(size)}; no preview"
    try:
        file = await asyncio.to_thread(safefs.open_file, workspace.path, name)
    except (OSError, UnsafePathError) as exc:
        log.warning("preview of %r: could not open it: %s", name, exc)
        return f"{about} (it could not be opened safely)."
    try:
        result = await oneshot.run(
            "preview", [str(file.fd), name], timeout=timeout, max_output=_MAX_ANSWER_BYTES, fd=file.fd
        )
    except OneShotUnavailableError as exc:
        log.warning("preview of %r: %s", name, exc)
        return f"{about} (previews are unavailable on this bot)."
    except OSError as exc:
        log.warning("preview of %r: could not start its process: %s", name, exc)
        return f"{about} (it could not be read)."
    finally:
        file.close()
    text = _decoded(result.output) if result.ok else None
    if text is None:
        if not result.timed_out:
            log.warning("preview of %r gave no answer (exit %s): %s", name, result.exit_code, result.errors[-300:])
        return f"{about} (it could not be read in time)." if result.timed_out else f"{about} (it could not be read)."
    if len(text) > MAX_PREVIEW_CHARS:
        text = text[:MAX_PREVIEW_CHARS].rstrip() + "\n… (preview cut)"
    return text


def _decoded(output: bytes) -> str | None:
    """The preview in a one-shot's output (one JSON string), or None when there is none."""
    try:
        text = json.loads(output.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError included
        return None
    return text if isinstance(text, str) and text.strip() else None


def describe_for_model(saved: Sequence[SavedUpload], refused: Sequence[tuple[str, str]]) -> str:
    """The block appended to the user's message: each saved file's name, size and preview."""
    lines: list[str] = []
    if saved:
        lines.append("Files attached to this message, saved in the workspace (the kernel's working directory):")
        for upload in saved:
            renamed = (
                f'; uploaded as "{shown(upload.original_name)}"'
                if upload.original_name != upload.name_in_workspace
                else ""
            )
            lines.append(f"- `{upload.name_in_workspace}` ({human_size(upload.size)}{renamed})")
            lines.append("```text")
            lines.append(upload.preview)
            lines.append("```")
    for name, reason in refused:
        lines.append(f'- Not saved: "{shown(name)}": {reason}')
    return "\n".join(lines)


def _kind(name: str) -> str:
    mime, _ = mimetypes.guess_type(PurePosixPath(name).name)
    return f"file ({mime})" if mime else "file of unknown type"
