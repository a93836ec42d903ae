"""Hostile uploads for preview tests: a zip-bomb workbook, a huge sparse CSV, an image whose
header claims 50,000 × 50,000 pixels. Each is small (or sparse) on disk and written without
holding its unpacked size in memory."""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path

import openpyxl

#: One repeated worksheet row (no ``r`` attributes: identical rows compress about 1000:1).
_ROW = b"<row><c><v>1</v></c><c><v>2.5</v></c></row>"
_SHEET_HEAD = (
    b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
    b'<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
)


def zip_bomb_xlsx(path: Path, *, sheet_mb: int = 0, dimension: bool = True, theme_mb: int = 0) -> Path:
    """A valid workbook whose first sheet unpacks to ``sheet_mb`` MiB of rows (with or without
    a ``<dimension>`` saying its size) and/or whose theme part unpacks to ``theme_mb`` MiB."""
    plain = path.with_suffix(".plain.xlsx")
    workbook = openpyxl.Workbook()
    sheet = workbook.active
    assert sheet is not None
    sheet.title = "Bomb"
    sheet.append(["id", "value"])
    workbook.create_sheet("Other")
    workbook.save(plain)
    block = _ROW * (2**20 // len(_ROW))
    rows = (sheet_mb * 2**20 // len(block)) * (len(block) // len(_ROW))
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        for info in source.infolist():
            if info.filename == "xl/worksheets/sheet1.xml" and sheet_mb:
                with out.open(info.filename, "w", force_zip64=True) as member:
                    member.write(_SHEET_HEAD)
                    if dimension:
                        member.write(f'<dimension ref="A1:B{rows + 1}"/>'.encode())
                    member.write(b'<sheetData><row><c t="inlineStr"><is><t>id</t></is></c>')
                    member.write(b'<c t="inlineStr"><is><t>value</t></is></c></row>')
                    for _ in range(sheet_mb):
                        member.write(block)
                    member.write(b"</sheetData></worksheet>")
            elif info.filename == "xl/theme/theme1.xml" and theme_mb:
                with out.open(info.filename, "w", force_zip64=True) as member:
                    member.write(b'<?xml version="1.0"?><a:theme xmlns:a="x"><!--')
                    for _ in range(theme_mb):
                        member.write(b"-" * 2**20)
                    member.write(b"--></a:theme>")
            else:
                out.writestr(info, source.read(info))
    plain.unlink()
    return path


def sparse_csv(path: Path, size: int = 10 * 2**30) -> Path:
    """A CSV with a real header and two rows, then zeros up to ``size`` bytes (sparse on disk)."""
    with path.open("wb") as handle:
        handle.write(b"id,value\n1,2.5\n2,3.5\n")
        handle.truncate(size)
    return path


def huge_header_png(path: Path, width: int = 50_000, height: int = 50_000) -> Path:
    """A PNG of a few dozen bytes whose header claims ``width`` × ``height`` pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
    return path
