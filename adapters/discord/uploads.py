"""Fit a reply's images and files into Discord's upload limit.

A file within the limit goes as is; a bigger one is zipped when the archive fits; otherwise the
user is told (the file stays in the thread's workspace). Files are grouped into messages of at
most 10 attachments whose sizes add up to no more than the limit.
"""

from __future__ import annotations

import asyncio
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import discord

from bot.events import FileOut, ImageOut

MAX_FILES_PER_MESSAGE = 10
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Upload:
    """One attachment to send: bytes in memory or a file on disk."""

    name: str
    size: int
    data: bytes | None = None
    path: Path | None = None

    def to_file(self) -> discord.File:
        """The ``discord.File`` (opens the path; call it off the event loop)."""
        if self.data is not None:
            return discord.File(io.BytesIO(self.data), filename=self.name)
        assert self.path is not None
        return discord.File(self.path, filename=self.name)


@dataclass(frozen=True)
class UploadPlan:
    """What to upload (in message-sized batches) and one note per file that cannot go."""

    batches: list[list[Upload]]
    notes: list[str]


async def plan_uploads(images: tuple[ImageOut, ...], files: tuple[FileOut, ...], limit: int) -> UploadPlan:
    """Decide how each image and file reaches the thread within ``limit`` bytes per message."""
    return await asyncio.to_thread(_plan, images, files, limit)


def _plan(images: tuple[ImageOut, ...], files: tuple[FileOut, ...], limit: int) -> UploadPlan:
    uploads: list[Upload] = []
    notes: list[str] = []
    for image in images:
        if len(image.data) <= limit:
            uploads.append(Upload(name=image.filename, size=len(image.data), data=image.data))
        else:
            notes.append(f"🖼️ `{image.filename}` is {_mb(len(image.data))}, over the {_mb(limit)} upload limit.")
    for item in files:
        try:
            size = item.path.stat().st_size
        except OSError:
            notes.append(f"📄 `{item.name}` could not be read any more.")
            continue
        if size <= limit:
            uploads.append(Upload(name=item.name, size=size, path=item.path))
            continue
        archive = _zip_within(item.path, item.name, limit)
        if archive is not None:
            uploads.append(Upload(name=f"{item.name}.zip", size=len(archive), data=archive))
            notes.append(f"🗜️ `{item.name}` is {_mb(size)}, so it comes zipped ({_mb(len(archive))}).")
        else:
            notes.append(
                f"📄 `{item.name}` is {_mb(size)}, over the {_mb(limit)} upload limit even zipped; "
                "it stays in this thread's workspace."
            )
    return UploadPlan(batches=_batches(uploads, limit), notes=notes)


def _zip_within(path: Path, name: str, limit: int) -> bytes | None:
    """``path`` deflated into a zip archive, or None as soon as the archive outgrows ``limit``."""
    buffer = io.BytesIO()
    try:
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            with path.open("rb") as source, archive.open(name, "w", force_zip64=True) as target:
                while chunk := source.read(_CHUNK):
                    target.write(chunk)
                    if buffer.tell() > limit:
                        return None
    except OSError:
        return None
    return buffer.getvalue() if buffer.tell() <= limit else None


def _batches(uploads: list[Upload], limit: int) -> list[list[Upload]]:
    batches: list[list[Upload]] = []
    current: list[Upload] = []
    total = 0
    for upload in uploads:
        if current and (len(current) == MAX_FILES_PER_MESSAGE or total + upload.size > limit):
            batches.append(current)
            current, total = [], 0
        current.append(upload)
        total += upload.size
    if current:
        batches.append(current)
    return batches


def _mb(size: int) -> str:
    return f"{size / 2**20:.1f} MB" if size >= 2**20 else f"{max(1, round(size / 1024))} KB"
