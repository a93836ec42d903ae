"""Uploads: stream chat attachments into the thread's workspace and preview them for the model.

:func:`ingest` saves each attachment through the kernel layer (sanitised unique names,
per-file and per-workspace quotas, no partial files); :func:`preview` summarises a saved
file in a few lines (CSV columns, dtypes, rows; Excel sheets; JSON shape; ...) reading at
most a few MB; :func:`describe_for_model` is the block added to the user's message.

A preview reads the upload through the descriptor it was written with
(:class:`kernels.safefs.PinnedFile`), never by name: a kernel that renames a link over the
fresh upload cannot make the bot read anything else.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import logging
import mimetypes
import os
import xml.etree.ElementTree as ElementTree
import zipfile
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from itertools import islice
from pathlib import PurePosixPath
from typing import Any

import pandas as pd
from PIL import Image, UnidentifiedImageError

from bot.events import Attachment
from bot.safetext import shown
from kernels.result import KernelError, QuotaError
from kernels.safefs import PinnedFile
from kernels.units import human_size as human_size  # re-exported for the adapters (which never import kernels)
from kernels.workspace import Workspace

log = logging.getLogger(__name__)

#: A preview that takes longer than this is replaced by a one-line description.
PREVIEW_TIMEOUT_S = 5.0
#: Bytes a preview reads at most from one file (more only for Excel rows, see _EXCEL_ROWS_MAX).
PREVIEW_READ_BYTES = 4 * 2**20
#: Excel rows are previewed only for workbooks up to this size (openpyxl keeps shared strings in memory).
_EXCEL_ROWS_MAX = 16 * 2**20
_HEAD_ROWS = 5
_TEXT_LINES = 10
_MAX_LINE_CHARS = 200
_MAX_COLUMNS = 40
_MAX_KEYS = 30
_MAX_PREVIEW_CHARS = 3000
_SNIFF_BYTES = 64 * 1024

_CSV_SEPARATORS = {".csv": ",", ".tsv": "\t", ".tab": "\t"}
_EXCEL_SUFFIXES = {".xlsx", ".xlsm"}
_JSON_LINES_SUFFIXES = {".jsonl", ".ndjson"}
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff"}


@dataclass(frozen=True, slots=True)
class SavedUpload:
    """An attachment saved in the workspace, with its preview for the model."""

    name_in_workspace: str
    original_name: str
    size: int
    preview: str


@dataclass(slots=True)
class IngestResult:
    """What :func:`ingest` did: files saved, and files refused with a reason for the user."""

    saved: list[SavedUpload] = field(default_factory=list)
    #: (original name, one-sentence reason, e.g. "it is 2.0 GB, over the 100 MB upload limit.")
    refused: list[tuple[str, str]] = field(default_factory=list)


class _OverLimit(Exception):
    """The stream turned out larger than the upload limit."""


async def ingest(attachments: Sequence[Attachment], workspace: Workspace, *, max_bytes: int) -> IngestResult:
    """Save attachments into ``workspace`` (streamed, capped) and preview each saved file.

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
        except Exception:  # noqa: BLE001 - the adapter's fetch may fail in any client library's way
            log.warning("could not download upload %r", name, exc_info=True)
            outcome.refused.append((name, "it could not be downloaded from the chat platform; please try again."))
            continue
        try:
            text = await preview(saved.file, saved.name)
        finally:
            saved.file.close()
        outcome.saved.append(SavedUpload(saved.name, name, saved.size, text))
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


async def preview(file: PinnedFile, name: str) -> str:
    """A short, model-readable summary of the open file ``file`` called ``name``; never raises.

    Runs in a worker thread on its own duplicate of the descriptor (a preview that times out
    may still be reading when the caller closes ``file``), reads at most about
    :data:`PREVIEW_READ_BYTES` and gives up after :data:`PREVIEW_TIMEOUT_S` with a one-line
    description instead.
    """
    own = PinnedFile(os.dup(file.fd), name, file.size)
    try:
        text = await asyncio.wait_for(asyncio.to_thread(_preview_and_close, own), PREVIEW_TIMEOUT_S)
    except TimeoutError:
        text = f"{_kind(name)}, {human_size(file.size)}; no preview (it took too long)."
    if len(text) > _MAX_PREVIEW_CHARS:
        text = text[:_MAX_PREVIEW_CHARS].rstrip() + "\n… (preview cut)"
    return text


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


# --- previews (blocking; run in a worker thread) -------------------------------------------


def _preview_and_close(file: PinnedFile) -> str:
    with file:
        return _preview(file)


def _preview(file: PinnedFile) -> str:
    size, name = file.size, file.name
    if size == 0:
        return "empty file (0 bytes)."
    suffix = PurePosixPath(name).suffix.lower()
    try:
        if suffix in _CSV_SEPARATORS:
            return _csv(file, _CSV_SEPARATORS[suffix], size)
        if suffix in _EXCEL_SUFFIXES:
            return _excel(file, size)
        if suffix == ".json":
            return _json(file, size)
        if suffix in _JSON_LINES_SUFFIXES:
            return _json_lines(file, size)
        if suffix == ".parquet" and importlib.util.find_spec("pyarrow") is not None:
            return _parquet(file)
        if suffix in _IMAGE_SUFFIXES:
            return _image(file, size)
        head = file.read(_SNIFF_BYTES)
        if _looks_like_text(head):
            return _text(file, size)
    except Exception as exc:  # noqa: BLE001 - a preview must never break the turn
        log.info("preview of %s failed", shown(name), exc_info=True)
        return f"{_kind(name)}, {human_size(size)}; could not be read for a preview ({_first_line(exc)})."
    return f"binary {_kind(name)}, {human_size(size)}."


def _csv(file: PinnedFile, sep: str, size: int) -> str:
    kind = "TSV" if sep == "\t" else "CSV"
    exact = size <= PREVIEW_READ_BYTES
    data = file.read(PREVIEW_READ_BYTES)
    if not exact:
        data = data[: data.rfind(b"\n") + 1] or data  # whole lines only
    try:
        frame = pd.read_csv(io.BytesIO(data), sep=sep, encoding_errors="replace")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        return (
            f"{kind} file, {human_size(size)}, that could not be parsed as {kind} ({_first_line(exc)}).\n"
            f"First lines:\n{_head_lines(data)}"
        )
    rows = f"{len(frame):,} rows"
    if not exact:
        estimate = round(len(frame) * size / max(len(data), 1))
        rows = f"about {estimate:,} rows (estimated; dtypes from the first {len(frame):,})"
    return "\n".join(
        [
            f"{kind}, {rows} × {len(frame.columns)} columns, {human_size(size)}",
            f"columns: {_columns(frame)}",
            f"first {min(_HEAD_ROWS, len(frame))} rows:",
            _table(frame.head(_HEAD_ROWS)),
        ]
    )


def _excel(file: PinnedFile, size: int) -> str:
    sheets = _sheet_names(file)
    lines = [f"Excel workbook, {human_size(size)}, {len(sheets)} sheet(s): {', '.join(sheets)}"]
    if size > _EXCEL_ROWS_MAX or not sheets:
        return "\n".join(lines)
    import openpyxl  # imported here: only Excel previews need it

    workbook = openpyxl.load_workbook(file.reader(), read_only=True, data_only=True)
    try:
        sheet = workbook.worksheets[0]
        rows = list(islice(sheet.iter_rows(values_only=True), _HEAD_ROWS + 1))
        total = sheet.max_row
    finally:
        workbook.close()
    if not rows:
        lines.append(f"first sheet {sheets[0]!r} is empty")
        return "\n".join(lines)
    header = [str(value) if value is not None else f"column {i + 1}" for i, value in enumerate(rows[0])]
    frame = pd.DataFrame(rows[1:], columns=header)
    count = f", {total - 1:,} data rows below the header" if total else ""
    lines.append(f"first sheet {sheets[0]!r}{count}; first rows:")
    lines.append(_table(frame))
    return "\n".join(lines)


def _sheet_names(file: PinnedFile) -> list[str]:
    """Sheet names from ``xl/workbook.xml`` (small; no need to load the workbook)."""
    with zipfile.ZipFile(file.reader()) as archive:
        root = ElementTree.fromstring(archive.read("xl/workbook.xml"))
    return [element.attrib["name"] for element in root.iter() if element.tag.endswith("}sheet")]


def _json(file: PinnedFile, size: int) -> str:
    if size > PREVIEW_READ_BYTES:
        head = file.read(2048).decode("utf-8", errors="replace")
        return f"JSON, {human_size(size)} (too large to parse for a preview); it starts with:\n{head[:500]}"
    try:
        value = json.loads(file.read(PREVIEW_READ_BYTES))
    except ValueError as exc:
        return f"JSON file, {human_size(size)}, that could not be parsed ({_first_line(exc)})."
    return f"JSON, {human_size(size)}: {_shape(value)}"


def _json_lines(file: PinnedFile, size: int) -> str:
    data = file.read(PREVIEW_READ_BYTES)
    lines = [line for line in data.splitlines() if line.strip()]
    count = f"{len(lines):,}" if size <= PREVIEW_READ_BYTES else f"about {round(len(lines) * size / len(data)):,}"
    try:
        first = json.loads(lines[0]) if lines else None
    except ValueError as exc:
        return f"JSON Lines file, {human_size(size)}, whose first line is not JSON ({_first_line(exc)})."
    return f"JSON Lines, {count} records, {human_size(size)}; first record: {_shape(first)}"


def _shape(value: Any) -> str:
    """The top-level shape of a JSON value: object keys, array length and first item."""
    if isinstance(value, dict):
        keys = [f"{key} ({_json_type(item)})" for key, item in islice(value.items(), _MAX_KEYS)]
        more = f", … {len(value) - _MAX_KEYS} more" if len(value) > _MAX_KEYS else ""
        return f"object with {len(value)} keys: {', '.join(keys)}{more}"
    if isinstance(value, list):
        if not value:
            return "empty array"
        first = value[0]
        described = _shape(first) if isinstance(first, dict) else _json_type(first)
        return f"array of {len(value):,} items; first item: {described}"
    return f"a single {_json_type(value)}: {json.dumps(value)[:200]}"


def _json_type(value: Any) -> str:
    if isinstance(value, dict):
        return f"object, {len(value)} keys"
    if isinstance(value, list):
        return f"array, {len(value)} items"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "null" if value is None else "string"


def _parquet(file: PinnedFile) -> str:
    import pyarrow.parquet as pq  # optional dependency, checked by the caller

    parquet = pq.ParquetFile(file.reader())
    schema = parquet.schema_arrow
    columns = ", ".join(f"{f.name} ({f.type})" for f in list(schema)[:_MAX_COLUMNS])
    return f"Parquet, {parquet.metadata.num_rows:,} rows × {len(schema)} columns\ncolumns: {columns}"


def _image(file: PinnedFile, size: int) -> str:
    try:
        with Image.open(file.reader()) as image:
            return f"{image.format} image, {image.width}×{image.height} pixels, {human_size(size)}."
    except UnidentifiedImageError:
        return f"{_kind(file.name)}, {human_size(size)}; not a readable image."


def _text(file: PinnedFile, size: int) -> str:
    data = file.read(PREVIEW_READ_BYTES)
    count = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    lines = f"{count:,} lines" if size <= PREVIEW_READ_BYTES else f"about {round(count * size / len(data)):,} lines"
    return f"text, {lines}, {human_size(size)}; first lines:\n{_head_lines(data)}"


def _columns(frame: pd.DataFrame) -> str:
    parts = [f"{name} ({dtype})" for name, dtype in islice(frame.dtypes.items(), _MAX_COLUMNS)]
    more = f", … {len(frame.columns) - _MAX_COLUMNS} more" if len(frame.columns) > _MAX_COLUMNS else ""
    return ", ".join(parts) + more


def _table(frame: pd.DataFrame) -> str:
    # pandas turns surplus leading fields into the index; show it then, it is data.
    plain_index = isinstance(frame.index, pd.RangeIndex)
    return str(frame.to_string(max_cols=12, max_colwidth=40, index=not plain_index))


def _head_lines(data: bytes) -> str:
    lines = data[:_SNIFF_BYTES].decode("utf-8", errors="replace").splitlines()[:_TEXT_LINES]
    return "\n".join(line if len(line) <= _MAX_LINE_CHARS else line[:_MAX_LINE_CHARS] + "…" for line in lines)


def _looks_like_text(head: bytes) -> bool:
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3  # only a multi-byte character cut at the end
    return True


def _kind(name: str) -> str:
    mime, _ = mimetypes.guess_type(PurePosixPath(name).name)
    return f"file ({mime})" if mime else "file of unknown type"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
