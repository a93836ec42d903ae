"""Previews of uploaded files, computed in a one-shot sandboxed process (never in the bot).

The bot opens each upload itself (no link followed) and runs ``python -I -m
threadbook_kernel.preview <fd> <name>`` in a fresh sandbox (``kernels/oneshot.py``) with that
descriptor inherited: no thread's code has run in that process, and the file read is the one
the bot checked. The model gets a few lines per file (CSV columns and dtypes, with the
delimiter and encoding sniffed; Excel sheets; JSON shape; Parquet schema; image size), printed
as one JSON string. Every reader here is bounded: at most :data:`READ_BYTES` of a text file,
Excel only through openpyxl's streaming reader and only when no part of the workbook unpacks
to more than :data:`EXCEL_PART_MAX`, Parquet through its footer, images through their header
(never decoded). A crafted file can still cost this process (under the kernels' limits); the
bot kills a preview that takes too long.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import mimetypes
import os
import re
import stat
import sys
import warnings
import xml.etree.ElementTree as ElementTree
import zipfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import PurePosixPath
from typing import IO, Any

from threadbook_kernel.answer import first_line, human_size

__all__ = ["prepare", "preview"]

#: Bytes a preview reads at most from a text file (CSV, JSON, plain text).
READ_BYTES = 4 * 2**20
#: A workbook part (other than a worksheet, which is streamed) that unpacks to more is not parsed.
EXCEL_PART_MAX = 32 * 2**20
#: A worksheet is streamed only when it says its size (``<dimension>``) near its start:
#: openpyxl otherwise walks the whole sheet to size it.
_DIMENSION_WINDOW = 64 * 1024
MAX_PREVIEW_CHARS = 3000
_HEAD_ROWS = 5
_TEXT_LINES = 10
_MAX_LINE_CHARS = 200
_MAX_COLUMNS = 40
_MAX_KEYS = 30
_SNIFF_CHARS = 64 * 1024

_CSV_DELIMITERS = {".csv": ",", ".tsv": "\t", ".tab": "\t"}
_CANDIDATE_DELIMITERS = (",", ";", "\t", "|")
_EXCEL_SUFFIXES = {".xlsx", ".xlsm"}
_JSON_LINES_SUFFIXES = {".jsonl", ".ndjson"}
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff"}
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
#: Bytes cp1252 leaves undefined: a file with one of them is read as latin-1 instead.
_NOT_CP1252 = frozenset(b"\x81\x8d\x8f\x90\x9d")
_CP1252_RANGE = frozenset(range(0x80, 0xA0))
_DECIMAL_COMMA = re.compile(r"^-?\d+,\d+$")
#: Control characters other than whitespace (tab, newline, vertical tab, form feed, return).
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1f]")


def preview(fd: int, name: str) -> str:
    """A short, model-readable summary of the open file ``fd`` (``name``: what it is called,
    for its kind); never raises. ``fd`` is closed."""
    try:
        # Quietly: a library's warning is no part of a preview.
        with warnings.catch_warnings(), _open(fd) as (file, size):
            warnings.simplefilter("ignore")
            text = _preview(file, name, size)
    except Exception as exc:
        text = f"{_kind(name)}; could not be read for a preview ({first_line(exc)})."
    if len(text) > MAX_PREVIEW_CHARS:
        text = text[:MAX_PREVIEW_CHARS].rstrip() + "\n… (preview cut)"
    return text


#: Made-up files :func:`prepare` previews (trusted: written here).
_SAMPLES = (
    ("sample.csv", b"id,name,price,day\n1,a,1.5,2024-01-02\n2,b,2.5,2024-01-03\n"),
    ("sample.tsv", b"id\tname\n1\ta\n"),
    ("sample.json", b'{"rows": [{"a": 1}, {"a": 2}]}'),
)


def prepare() -> None:
    """Preview a few made-up files: what a first preview imports and builds (pandas' CSV
    reader, its printing) is done once, by a one-shot fork server before it forks any job."""
    for name, data in _SAMPLES:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.write(fd, data)
        preview(fd, name)


@contextmanager
def _open(fd: int) -> Iterator[tuple[IO[bytes], int]]:
    """The regular file open at ``fd``, read from its start (closed at the end)."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with file:
        file.seek(0)
        yield file, info.st_size


def _preview(file: IO[bytes], name: str, size: int) -> str:
    if size == 0:
        return "empty file (0 bytes)."
    suffix = PurePosixPath(name).suffix.lower()
    if suffix in _CSV_DELIMITERS:
        return _csv(file, name, size, _CSV_DELIMITERS[suffix])
    if suffix in _EXCEL_SUFFIXES:
        return _excel(file, size)
    if suffix == ".json":
        return _json(file, size)
    if suffix in _JSON_LINES_SUFFIXES:
        return _json_lines(file, size)
    if suffix == ".parquet":
        return _parquet(file, size)
    if suffix in _IMAGE_SUFFIXES:
        return _image(file, name, size)
    data = file.read(READ_BYTES)
    decoded = _decode(data, complete=size <= len(data))
    if decoded is None:
        return f"binary {_kind(name)}, {human_size(size)}."
    return _text(decoded, size, len(data))


# --- text: encoding and delimiter ------------------------------------------------------------


def _decode(data: bytes, *, complete: bool) -> tuple[str, str] | None:
    """(text, encoding) of the head of a file, or None when it does not look like text.

    A byte-order mark wins; then UTF-16 without one (every other byte zero), UTF-8, and
    else Windows-1252 where it differs from latin-1 (bytes 0x80-0x9F it defines), else
    latin-1 (every byte is some latin-1 character).
    """
    encoding = next((name for bom, name in _BOMS if data.startswith(bom)), None)
    if encoding is None:
        encoding = _utf16_without_bom(data[:4096])
    if encoding is None:
        try:
            codecs.getincrementaldecoder("utf-8")().decode(data, final=complete)
            encoding = "utf-8"
        except UnicodeDecodeError:
            high = set(data) & _CP1252_RANGE  # where cp1252 and latin-1 differ
            encoding = "cp1252" if high and not high & _NOT_CP1252 else "latin-1"
    text = codecs.getincrementaldecoder(encoding)(errors="replace").decode(data, final=complete)
    sample = text[:_SNIFF_CHARS]
    controls = len(_CONTROLS.findall(sample))
    if controls > len(sample) // 100:
        return None
    return text, encoding


def _utf16_without_bom(head: bytes) -> str | None:
    if len(head) < 4:
        return None
    even, odd = head[0::2], head[1::2]
    if odd.count(0) > 0.4 * len(odd) and even.count(0) < 0.05 * len(even):
        return "utf-16-le"
    if even.count(0) > 0.4 * len(even) and odd.count(0) < 0.05 * len(odd):
        return "utf-16-be"
    return None


def _read_text(file: IO[bytes], size: int) -> tuple[str, str, bool, float] | None:
    """The head of a text file as whole lines: (text, encoding, whole file?, share of the
    file it covers), or None when it is not text."""
    data = file.read(READ_BYTES)
    complete = size <= len(data)
    decoded = _decode(data, complete=complete)
    if decoded is None:
        return None
    text, encoding = decoded
    share = 1.0
    if not complete:
        cut = text.rfind("\n") + 1
        if cut:
            share = len(data) / size * cut / max(len(text), 1)
            text = text[:cut]
        else:
            share = len(data) / size
    return text, encoding, complete, share


def _delimiter(sample: str, default: str) -> str:
    """The delimiter that splits the first lines into the same number (> 1) of fields."""
    lines = [line for line in sample.splitlines()[:30] if line.strip()]
    if len(lines) > 1:
        lines = lines[:-1]  # the last one may be cut
    best, best_score = default, (0.0, 0)
    for candidate in (default, *(d for d in _CANDIDATE_DELIMITERS if d != default)):
        try:
            counts = [len(row) for row in csv.reader(lines, delimiter=candidate)]
        except csv.Error:
            continue
        if not counts:
            continue
        fields, agreeing = Counter(counts).most_common(1)[0]
        score = (agreeing / len(counts), fields)
        if fields > 1 and score > best_score:
            best, best_score = candidate, score
    return best


def _csv(file: IO[bytes], name: str, size: int, default: str) -> str:
    kind = "TSV" if default == "\t" else "CSV"
    head = _read_text(file, size)
    if head is None:
        return f"{kind} file, {human_size(size)}, that does not look like text (binary content); no preview."
    text, encoding, complete, share = head
    import pandas as pd  # only CSV previews need it (and the kernel has it)

    sep = _delimiter(text[:_SNIFF_CHARS], default)
    decimal = "," if sep == ";" and _has_decimal_commas(text[:_SNIFF_CHARS]) else "."
    try:
        frame = pd.read_csv(io.StringIO(text), sep=sep, decimal=decimal)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        return (
            f"{kind} file, {human_size(size)}, that could not be parsed as {kind} ({first_line(exc)}).\n"
            f"First lines:\n{_head_lines(text)}"
        )
    rows = f"{len(frame):,} rows"
    if not complete:
        estimate = round(len(frame) / max(share, 1e-12))
        rows = f"about {estimate:,} rows (estimated; dtypes from the first {len(frame):,})"
    lines = [f"{kind}, {rows} × {len(frame.columns)} columns, {human_size(size)}"]
    options = []
    if sep != default:
        options.append(f"sep={sep!r}")
    if encoding not in ("utf-8", "utf-8-sig"):
        options.append(f"encoding={encoding!r}")
    if decimal != ".":
        options.append(f"decimal={decimal!r}")
    if options:
        lines.append(f"read it with pd.read_csv({name!r}, {', '.join(options)})")
    lines += [
        f"columns: {_columns(frame)}",
        f"first {min(_HEAD_ROWS, len(frame))} rows:",
        _table(frame.head(_HEAD_ROWS)),
    ]
    return "\n".join(lines)


def _has_decimal_commas(sample: str) -> bool:
    fields = (field.strip().strip('"') for line in sample.splitlines()[1:30] for field in line.split(";"))
    return any(_DECIMAL_COMMA.match(field) for field in fields)


def _text(decoded: tuple[str, str], size: int, read: int) -> str:
    text, encoding = decoded
    count = text.count("\n") + (0 if text.endswith("\n") else 1)
    lines = f"{count:,} lines" if size <= read else f"about {round(count * size / read):,} lines"
    coding = "" if encoding in ("utf-8", "utf-8-sig") else f" (encoding {encoding})"
    return f"text{coding}, {lines}, {human_size(size)}; first lines:\n{_head_lines(text)}"


# --- Excel -------------------------------------------------------------------------------------


def _excel(file: IO[bytes], size: int) -> str:
    with zipfile.ZipFile(file) as archive:
        sheets = _sheet_names(archive)
        lines = [f"Excel workbook, {human_size(size)}, {len(sheets)} sheet(s): {', '.join(sheets)}"]
        why_not = _why_not_rows(archive)
    if why_not is not None or not sheets:
        if why_not is not None:
            lines.append(f"rows not previewed: {why_not}")
        return "\n".join(lines)
    import openpyxl  # only Excel previews need it

    file.seek(0)
    workbook = openpyxl.load_workbook(file, read_only=True, data_only=True)
    try:
        sheet = workbook.worksheets[0]
        width = min(sheet.max_column or _MAX_COLUMNS, _MAX_COLUMNS)
        rows = list(islice(sheet.iter_rows(values_only=True, max_col=width), _HEAD_ROWS + 1))
        total = sheet.max_row
    finally:
        workbook.close()
    if not rows:
        lines.append(f"first sheet {sheets[0]!r} is empty")
        return "\n".join(lines)
    import pandas as pd

    used = max((i + 1 for row in rows for i, value in enumerate(row) if value is not None), default=0)
    rows = [tuple(row[:used]) + (None,) * (used - len(row)) for row in rows]
    header = [str(value) if value is not None else f"column {i + 1}" for i, value in enumerate(rows[0])]
    frame = pd.DataFrame(rows[1:], columns=header)
    count = f", {total - 1:,} data rows below the header" if total else ""
    lines.append(f"first sheet {sheets[0]!r}{count}; first rows:")
    lines.append(_table(frame))
    return "\n".join(lines)


def _sheet_names(archive: zipfile.ZipFile) -> list[str]:
    """Sheet names from ``xl/workbook.xml`` (checked small before it is parsed)."""
    info = archive.getinfo("xl/workbook.xml")
    if info.file_size > EXCEL_PART_MAX:
        raise ValueError(f"its workbook part unpacks to {human_size(info.file_size)}")
    root = ElementTree.fromstring(archive.read(info))
    return [element.attrib.get("name", "?") for element in root.iter() if element.tag.endswith("}sheet")]


def _why_not_rows(archive: zipfile.ZipFile) -> str | None:
    """Why openpyxl must not open this workbook (a part that unpacks to too much, a sheet
    that does not say its size), or None. zipfile stops at a member's declared size, so
    the sizes checked here are the most any read can unpack."""
    for info in archive.infolist():
        is_sheet = info.filename.startswith("xl/worksheets/") and info.filename.endswith(".xml")
        if not is_sheet and info.file_size > EXCEL_PART_MAX:
            return f"{info.filename} unpacks to {human_size(info.file_size)} (a zip bomb?)"
        if is_sheet and info.file_size > _DIMENSION_WINDOW:
            with archive.open(info) as member:
                start = member.read(_DIMENSION_WINDOW)
            if b"<dimension" not in start and b":dimension" not in start:
                return f"{info.filename} unpacks to {human_size(info.file_size)} and does not say its size"
    return None


# --- JSON --------------------------------------------------------------------------------------


def _json(file: IO[bytes], size: int) -> str:
    data = file.read(READ_BYTES)
    if size <= len(data):
        try:
            value = json.loads(data)
        except (ValueError, RecursionError) as exc:
            return f"JSON file, {human_size(size)}, that could not be parsed ({first_line(exc)})."
        return f"JSON, {human_size(size)}: {_shape(value)}"
    decoded = _decode(data, complete=False)
    text = decoded[0] if decoded else ""
    start = len(text) - len(text.lstrip())
    if text[start : start + 1] == "[":
        try:
            first, _ = json.JSONDecoder().raw_decode(text, _skip_space(text, start + 1))
        except (ValueError, RecursionError):
            pass
        else:
            described = _shape(first) if isinstance(first, dict) else _json_type(first)
            return f"JSON, {human_size(size)} (too large to count for a preview): array; first item: {described}"
    return f"JSON, {human_size(size)} (too large to parse for a preview); it starts with:\n{text[:500]}"


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index].isspace():
        index += 1
    return index


def _json_lines(file: IO[bytes], size: int) -> str:
    data = file.read(READ_BYTES)
    lines = [line for line in data.splitlines() if line.strip()]
    count = f"{len(lines):,}" if size <= len(data) else f"about {round(len(lines) * size / len(data)):,}"
    try:
        first = json.loads(lines[0]) if lines else None
    except (ValueError, RecursionError) as exc:
        return f"JSON Lines file, {human_size(size)}, whose first line is not JSON ({first_line(exc)})."
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


# --- Parquet and images ------------------------------------------------------------------------


def _parquet(file: IO[bytes], size: int) -> str:
    import pyarrow.parquet as pq  # the footer only: no row group is read

    parquet = pq.ParquetFile(file)
    schema = parquet.schema_arrow
    columns = ", ".join(f"{field.name} ({field.type})" for field in list(schema)[:_MAX_COLUMNS])
    more = f", … {len(schema) - _MAX_COLUMNS} more" if len(schema) > _MAX_COLUMNS else ""
    meta = parquet.metadata
    return (
        f"Parquet, {meta.num_rows:,} rows × {len(schema)} columns, {meta.num_row_groups} row group(s), "
        f"{human_size(size)}\ncolumns: {columns}{more}"
    )


def _image(file: IO[bytes], name: str, size: int) -> str:
    from PIL import Image, UnidentifiedImageError

    # Only the header is read (no pixel is decoded), so Pillow's decompression-bomb check,
    # which refuses to even open a huge image, is lifted for this call: the size is the news.
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        with Image.open(file) as image:
            kind, (width, height), mode = image.format, image.size, image.mode
    except UnidentifiedImageError:
        return f"{_kind(name)}, {human_size(size)}; not a readable image."
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    text = f"{kind} image, {width}×{height} pixels, {human_size(size)}."
    if limit is not None and width * height > limit:
        text += (
            f" Its header claims {width * height:,} pixels, over Pillow's limit of {limit:,}: loading it "
            "would need a lot of memory (Pillow refuses unless Image.MAX_IMAGE_PIXELS is raised)."
        )
    elif mode:
        text = text[:-1] + f", mode {mode}."
    return text


# --- formatting ---------------------------------------------------------------------------------


def _columns(frame: Any) -> str:
    parts = [f"{name} ({dtype})" for name, dtype in islice(frame.dtypes.items(), _MAX_COLUMNS)]
    more = f", … {len(frame.columns) - _MAX_COLUMNS} more" if len(frame.columns) > _MAX_COLUMNS else ""
    return ", ".join(parts) + more


def _table(frame: Any) -> str:
    import pandas as pd

    # pandas turns surplus leading fields into the index; show it then, it is data.
    plain_index = isinstance(frame.index, pd.RangeIndex)
    return str(frame.to_string(max_cols=12, max_colwidth=40, index=not plain_index))


def _head_lines(text: str) -> str:
    lines = text[:_SNIFF_CHARS].splitlines()[:_TEXT_LINES]
    return "\n".join(line if len(line) <= _MAX_LINE_CHARS else line[:_MAX_LINE_CHARS] + "…" for line in lines)


def _kind(name: str) -> str:
    mime, _ = mimetypes.guess_type(PurePosixPath(name).name)
    return f"file ({mime})" if mime else "file of unknown type"


if __name__ == "__main__":
    print(json.dumps(preview(int(sys.argv[1]), sys.argv[2])))
