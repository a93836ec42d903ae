"""Attachment previews and ingest into a real kernels.Workspace."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import openpyxl
import pytest
from PIL import Image

from bot.attachments import PREVIEW_READ_BYTES, describe_for_model, human_size, ingest
from bot.attachments import preview as preview_file
from bot.events import Attachment
from kernels import safefs
from kernels.workspace import Workspace, WorkspaceManager


async def preview(path: Path) -> str:
    """The preview of a file, opened the way the bot opens uploads (no links followed)."""
    with safefs.open_file(path.parent, path.name) as pinned:
        return await preview_file(pinned, path.name)

SALES_CSV = "region,units,price,day\nnorth,3,2.5,2024-01-01\nsouth,7,1.25,2024-01-02\n" + "".join(
    f"east,{i},{i / 2},2024-02-{i % 28 + 1:02d}\n" for i in range(10)
)


async def test_csv_preview_has_columns_dtypes_rows_and_head(tmp_path: Path) -> None:
    path = tmp_path / "sales.csv"
    path.write_text(SALES_CSV)
    text = await preview(path)
    assert text.startswith("CSV, 12 rows × 4 columns")
    assert "region (" in text and "units (int64)" in text and "price (float64)" in text
    assert "north" in text and "south" in text
    assert "east" in text.split("first 5 rows:")[1]
    assert text.split("first 5 rows:")[1].count("\n") == 6  # header + 5 rows


async def test_tsv_preview(tmp_path: Path) -> None:
    path = tmp_path / "data.tsv"
    path.write_text("name\tscore\nada\t9.5\nbob\t7.0\n")
    text = await preview(path)
    assert text.startswith("TSV, 2 rows × 2 columns")
    assert "score (float64)" in text and "ada" in text


async def test_big_csv_preview_estimates_rows_and_reads_a_bounded_prefix(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    rows = 300_000
    with path.open("w") as handle:
        handle.write("id,value,label\n")
        handle.writelines(f"{i},{i * 0.5},label{i % 7}\n" for i in range(rows))
    assert path.stat().st_size > PREVIEW_READ_BYTES
    text = await preview(path)
    assert text.startswith("CSV, about ")
    estimate = int(text.removeprefix("CSV, about ").split(" ")[0].replace(",", ""))
    assert abs(estimate - rows) / rows < 0.1
    assert "id (int64)" in text


async def test_malformed_csv_says_it_could_not_be_parsed(tmp_path: Path) -> None:
    path = tmp_path / "broken.csv"
    path.write_text("a,b\n1,2\n3,4,5,6\n")
    text = await preview(path)
    assert "could not be parsed as CSV" in text
    assert "3,4,5,6" in text  # the first lines are shown so the model can see why


async def test_excel_preview_lists_sheets_and_first_rows(tmp_path: Path) -> None:
    path = tmp_path / "book.xlsx"
    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.title = "Orders"
    sheet.append(["order", "amount"])
    for i in range(8):
        sheet.append([f"A{i}", i * 10])
    workbook.create_sheet("Customers").append(["id", "name"])
    workbook.save(path)
    text = await preview(path)
    assert "2 sheet(s): Orders, Customers" in text
    assert "first sheet 'Orders', 8 data rows" in text
    assert "A0" in text and "A4" in text and "A5" not in text


async def test_json_previews_show_top_level_shape(tmp_path: Path) -> None:
    obj = tmp_path / "config.json"
    obj.write_text(json.dumps({"name": "x", "items": [1, 2, 3], "nested": {"a": 1}}))
    array = tmp_path / "records.json"
    array.write_text(json.dumps([{"id": i, "tags": ["a"]} for i in range(25)]))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "object with 3 keys: name (string), items (array, 3 items), nested (object, 1 keys)" in await preview(obj)
    assert "array of 25 items; first item: object with 2 keys: id (number), tags (array, 1 items)" in await preview(
        array
    )
    assert "could not be parsed" in await preview(bad)


async def test_text_binary_image_and_empty_previews(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("".join(f"line {i}\n" for i in range(30)))
    blob = tmp_path / "blob"
    blob.write_bytes(bytes(range(256)) * 8)
    picture = tmp_path / "pic.png"
    Image.new("RGB", (12, 34)).save(picture)
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")

    text = await preview(notes)
    assert text.startswith("text, 30 lines") and "line 9" in text and "line 10" not in text
    assert await preview(blob) == "binary file of unknown type, 2.0 KB."
    assert await preview(picture) == "PNG image, 12×34 pixels, " + human_size(picture.stat().st_size) + "."
    assert await preview(empty) == "empty file (0 bytes)."


class RecordingFetch:
    """An attachment's fetch that records calls and can fail midway."""

    def __init__(self, chunks: list[bytes], *, fail_after: int | None = None) -> None:
        self.chunks = chunks
        self.fail_after = fail_after
        self.calls = 0
        self.closed = False

    def __call__(self) -> AsyncIterator[bytes]:
        self.calls += 1
        return self._stream()

    async def _stream(self) -> AsyncIterator[bytes]:
        try:
            for i, chunk in enumerate(self.chunks):
                if self.fail_after is not None and i >= self.fail_after:
                    raise ConnectionResetError("connection reset by peer")
                yield chunk
        finally:
            self.closed = True


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    manager = WorkspaceManager(tmp_path / "workspaces", max_file_bytes=10_000, quota_bytes=12_000)
    return manager.for_key("slack:T1:C1:1700.1")


def _files(workspace: Workspace) -> list[str]:
    return sorted(os.listdir(workspace.path))


async def test_ingest_saves_streamed_upload_with_preview(workspace: Workspace) -> None:
    data = SALES_CSV.encode()
    fetch = RecordingFetch([data[:20], data[20:]])
    result = await ingest([Attachment("../Sales 2024.csv", len(data), "text/csv", fetch)], workspace, max_bytes=5000)

    assert result.refused == []
    [saved] = result.saved
    assert saved.original_name == "../Sales 2024.csv"
    assert "/" not in saved.name_in_workspace and saved.name_in_workspace.endswith(".csv")
    assert saved.size == len(data)
    assert (workspace.path / saved.name_in_workspace).read_bytes() == data
    assert saved.preview.startswith("CSV, 12 rows × 4 columns")
    assert fetch.closed

    block = describe_for_model(result.saved, result.refused)
    assert f"`{saved.name_in_workspace}`" in block
    assert human_size(len(data)) in block
    assert 'uploaded as "../Sales 2024.csv"' in block
    assert "units (int64)" in block


async def test_ingest_refuses_oversize_before_fetching(workspace: Workspace) -> None:
    fetch = RecordingFetch([b"x" * 100])
    small = RecordingFetch([b"hello\n"])
    result = await ingest(
        [Attachment("huge.zip", 6000, "application/zip", fetch), Attachment("ok.txt", 6, "text/plain", small)],
        workspace,
        max_bytes=5000,
    )
    assert fetch.calls == 0
    assert result.refused == [("huge.zip", "it is 5.9 KB, over the 4.9 KB upload limit.")]
    assert [s.name_in_workspace for s in result.saved] == ["ok.txt"]
    assert _files(workspace) == ["ok.txt"]
    assert 'Not saved: "huge.zip": it is 5.9 KB' in describe_for_model(result.saved, result.refused)


async def test_ingest_failure_midway_leaves_no_partial_file(workspace: Workspace) -> None:
    fetch = RecordingFetch([b"a" * 1000, b"b" * 1000, b"c" * 1000], fail_after=2)
    result = await ingest([Attachment("data.csv", 3000, "text/csv", fetch)], workspace, max_bytes=5000)
    assert result.saved == []
    assert result.refused == [("data.csv", "it could not be downloaded from the chat platform; please try again.")]
    assert _files(workspace) == []


async def test_ingest_unknown_size_over_limit_is_cut_off(workspace: Workspace) -> None:
    fetch = RecordingFetch([b"x" * 3000] * 5)
    result = await ingest([Attachment("stream.bin", None, None, fetch)], workspace, max_bytes=5000)
    assert result.refused == [("stream.bin", "it is larger than the 4.9 KB upload limit.")]
    assert fetch.closed
    assert _files(workspace) == []


async def test_ingest_workspace_quota_refuses_with_reason(workspace: Workspace) -> None:
    (workspace.path / "existing.bin").write_bytes(b"0" * 9000)
    fetch = RecordingFetch([b"y" * 2000] * 2)
    result = await ingest([Attachment("more.bin", None, None, fetch)], workspace, max_bytes=50_000)
    [(name, reason)] = result.refused
    assert name == "more.bin"
    assert "storage limits" in reason and "11.7 KB in all" in reason
    assert _files(workspace) == ["existing.bin"]
