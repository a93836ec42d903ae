"""Fit a reply's images and files into Discord's upload limit.

A file within the limit goes as is; a bigger one is zipped when the archive fits; otherwise the
user is told (the file stays in the thread's workspace). Files are grouped into messages of at
most 10 attachments whose sizes add up to no more than the limit.

Nothing is read into memory whole: a file goes from the reader the core opened
(:attr:`~bot.events.FileOut.open_reader`) to the socket in chunks that aiohttp reads in a worker
thread, and an archive is written to an anonymous temporary file. Every upload carries a
``Content-Length`` (:class:`SizedReader`), as discord.py's own file uploads do.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import io
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from typing import IO, BinaryIO

import aiohttp.payload
import discord

from bot.attachments import human_size
from bot.events import FileOut, ImageOut, OpenReader
from bot.safetext import inline_code

MAX_FILES_PER_MESSAGE = 10
_CHUNK = 1 << 20


class SizedReader(io.BufferedIOBase):
    """Exactly ``size`` bytes of another reader, for an upload whose length is known in advance.

    A source that ends early raises ``OSError(EIO)`` instead of returning a short body, so a
    file the kernel truncates mid-upload fails the request at once rather than leaving the
    server waiting for bytes that never come.
    """

    def __init__(self, inner: BinaryIO, size: int) -> None:
        super().__init__()
        self._inner = inner
        self.size = size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        """Up to ``n`` bytes (all that is left when ``n`` is negative or None)."""
        left = self.size - self._inner.tell()
        want = left if n is None or n < 0 else min(n, left)
        if want <= 0:
            return b""
        data = self._inner.read(want)
        if not data:
            raise OSError(errno.EIO, f"the file ended {left} bytes before its size")
        return data

    def read1(self, n: int = -1) -> bytes:
        """Same as :meth:`read` (no extra buffering here)."""
        return self.read(n)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move within the ``size`` bytes (``SEEK_END`` counts from ``size``, not the file's end)."""
        if whence == io.SEEK_END:
            offset, whence = self.size + offset, io.SEEK_SET
        return self._inner.seek(offset, whence)

    def tell(self) -> int:
        """The position from the start."""
        return self._inner.tell()

    def close(self) -> None:
        """Close the source reader too."""
        if not self.closed:
            self._inner.close()
        super().close()


class _SizedReaderPayload(aiohttp.payload.BufferedReaderPayload):
    """aiohttp's file payload, but sized from :attr:`SizedReader.size` (no ``fileno`` to ``fstat``)."""

    _value: SizedReader

    @property
    def size(self) -> int | None:
        return self._value.size - self._value.tell()


# Only affects SizedReader objects: aiohttp would otherwise send them chunked, size unknown.
aiohttp.payload.register_payload(_SizedReaderPayload, SizedReader, order=aiohttp.payload.Order.try_first)


@dataclass(frozen=True)
class Upload:
    """One attachment to send: its name (safe to show), its size, and how to read it."""

    name: str
    size: int
    open_reader: OpenReader

    def to_file(self) -> discord.File:
        """(Blocking: opens the reader) the ``discord.File``; release it with :func:`release`."""
        return discord.File(SizedReader(self.open_reader(), self.size), filename=self.name)


@dataclass
class UploadPlan:
    """What to upload (in message-sized batches) and one note per file that cannot go.

    Archives live in temporary files until :meth:`close`.
    """

    batches: list[list[Upload]]
    notes: list[str]
    spools: list[IO[bytes]] = field(default_factory=list)

    def close(self) -> None:
        """(Blocking) delete the temporary archives."""
        for spool in self.spools:
            spool.close()
        self.spools.clear()


def open_files(batch: list[Upload]) -> tuple[list[discord.File], list[str]]:
    """(Blocking) a ``discord.File`` per upload, and the names of those that could not be opened."""
    files: list[discord.File] = []
    unreadable: list[str] = []
    for upload in batch:
        try:
            files.append(upload.to_file())
        except (OSError, ValueError):
            unreadable.append(upload.name)
    return files, unreadable


def release(files: list[discord.File]) -> None:
    """Close the readers behind ``files`` (discord.py leaves readers it did not open to their owner)."""
    for file in files:
        file.close()  # gives the reader its own close() back (discord.py stubs it while sending)
        file.fp.close()


async def plan_uploads(images: tuple[ImageOut, ...], files: tuple[FileOut, ...], limit: int) -> UploadPlan:
    """Decide how each image and file reaches the thread within ``limit`` bytes per message."""
    return await asyncio.to_thread(_plan, images, files, limit)


def _plan(images: tuple[ImageOut, ...], files: tuple[FileOut, ...], limit: int) -> UploadPlan:
    uploads: list[Upload] = []
    notes: list[str] = []
    spools: list[IO[bytes]] = []
    for image in images:
        name = image.filename  # names come escaped from the core (ImageOut, FileOut)
        if len(image.data) <= limit:
            uploads.append(
                Upload(name=name, size=len(image.data), open_reader=functools.partial(io.BytesIO, image.data))
            )
        else:
            notes.append(
                f"🖼️ {inline_code(name)} is {human_size(len(image.data))}, over the {human_size(limit)} upload limit."
            )
    for item in files:
        name = item.name
        if item.size <= limit:
            uploads.append(Upload(name=name, size=item.size, open_reader=item.open_reader))
            continue
        try:
            spool = _zip_within(item, name, limit)
        except OSError:
            notes.append(f"📄 {inline_code(name)} could not be read any more.")
            continue
        if spool is not None:
            size = spool.seek(0, io.SEEK_END)
            spools.append(spool)
            uploads.append(Upload(name=f"{name}.zip", size=size, open_reader=functools.partial(_reopen, spool)))
            notes.append(f"🗜️ {inline_code(name)} is {human_size(item.size)}, so it comes zipped ({human_size(size)}).")
        else:
            notes.append(
                f"📄 {inline_code(name)} is {human_size(item.size)}, over the {human_size(limit)} upload limit even zipped; "
                "it stays in this thread's workspace."
            )
    return UploadPlan(batches=_batches(uploads, limit), notes=notes, spools=spools)


def _zip_within(item: FileOut, name: str, limit: int) -> IO[bytes] | None:
    """(Blocking) the file deflated into a zip archive in an anonymous temporary file, or None
    as soon as the archive outgrows ``limit``. Raises ``OSError`` when the file cannot be read
    to its size."""
    spool = tempfile.TemporaryFile()
    try:
        # The entry name is unpacked on the user's machine: no folder separators in it.
        entry = name.replace("/", "_").replace("\\", "_")
        too_big = False
        with item.open_reader() as source, zipfile.ZipFile(spool, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            with archive.open(entry, "w", force_zip64=True) as target:
                copied = 0
                while copied < item.size:
                    chunk = source.read(min(_CHUNK, item.size - copied))
                    if not chunk:
                        raise OSError(errno.EIO, f"{name} ended {item.size - copied} bytes before its size")
                    target.write(chunk)
                    copied += len(chunk)
                    if spool.tell() > limit:
                        too_big = True
                        break
        if too_big or spool.tell() > limit:
            spool.close()
            return None
        return spool
    except BaseException:
        spool.close()
        raise


def _reopen(spool: IO[bytes]) -> BinaryIO:
    """A new reader over the temporary archive from its start (our own file, never a kernel's)."""
    reader = os.fdopen(os.dup(spool.fileno()), "rb")
    reader.seek(0)
    return reader


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
