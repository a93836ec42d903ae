"""The Parquet sink on its own: how it makes, names and drops its file in a folder the kernel can write."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bot.sources import parquet
from bot.sources.parquet import ParquetSink, SinkFailed
from kernels.host import safefs


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield tmp_path, fd
    finally:
        os.close(fd)


def test_the_file_is_created_through_safefs(folder: tuple[Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    path, fd = folder
    made: list[tuple[int, str]] = []
    real = safefs.create_file_at

    def spy(dir_fd: int, name: str, mode: int = 0o644) -> int:
        made.append((dir_fd, name))
        return real(dir_fd, name, mode)

    monkeypatch.setattr(safefs, "create_file_at", spy)
    sink = ParquetSink(fd, "out.parquet", limit_bytes=2**20)
    sink.start(["n"], [pa.int64()])
    sink.add([(1,), (2,)])
    sink.finish()
    assert [name for _, name in made] == [sink._temp] and made[0][0] == fd
    assert pq.read_table(path / "out.parquet").column("n").to_pylist() == [1, 2]


def test_a_link_planted_at_the_temporary_name_is_not_followed(folder: tuple[Path, int], tmp_path: Path) -> None:
    path, fd = folder
    sink = ParquetSink(fd, "out.parquet", limit_bytes=2**20)
    target = tmp_path / "elsewhere"
    os.symlink(target, path / sink._temp)
    with pytest.raises(FileExistsError):
        sink.start(["n"], [pa.int64()])
    assert not target.exists()


def test_after_abort_every_call_fails_and_makes_no_file(folder: tuple[Path, int]) -> None:
    path, fd = folder
    sink = ParquetSink(fd, "out.parquet", limit_bytes=2**20)
    sink.abort()
    with pytest.raises(SinkFailed):
        sink.start(["n"], [pa.int64()])
    with pytest.raises(SinkFailed):
        sink.add([(1,)])
    with pytest.raises(SinkFailed):
        sink.finish()
    assert os.listdir(path) == []


def test_abort_waits_for_a_batch_being_written_and_drops_its_file(folder: tuple[Path, int]) -> None:
    """A worker thread of an abandoned query still in ``add`` when the tool aborts."""
    path, fd = folder
    sink = ParquetSink(fd, "out.parquet", limit_bytes=2**30)
    sink.start(["n"], [pa.int64()])
    in_add, go_on = threading.Event(), threading.Event()
    real = parquet._array_as
    failures: list[BaseException] = []

    def slow_array_as(values: list[Any], field: pa.Field) -> pa.Array:
        in_add.set()
        go_on.wait(5)
        return real(values, field)

    sink.add([(1,)])
    parquet._array_as = slow_array_as  # type: ignore[assignment]
    try:

        def worker() -> None:
            try:
                sink.add([(2,)])
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=worker)
        thread.start()
        assert in_add.wait(5)
        aborting = threading.Thread(target=sink.abort)
        aborting.start()
        aborting.join(0.2)
        assert aborting.is_alive()  # waits for the batch
        go_on.set()
        aborting.join(5)
        thread.join(5)
    finally:
        parquet._array_as = real  # type: ignore[assignment]
    assert failures == []  # the batch begun before the abort was written whole
    with pytest.raises(SinkFailed):
        sink.add([(3,)])
    assert os.listdir(path) == []


def test_batches_are_written_together_in_row_groups(folder: tuple[Path, int]) -> None:
    """The Parquet writer keeps metadata for each column of each row group until it closes the
    file: a row group per batch (a batch may be one row) would grow the bot with the result."""
    path, fd = folder
    sink = ParquetSink(fd, "out.parquet", limit_bytes=2**30)
    sink.start(["n", "s"], [pa.int64(), pa.string()])
    for start in range(0, 1000, 10):  # 100 small batches
        sink.add([(n, str(n)) for n in range(start, start + 10)])
    wide = "x" * 2**20
    for n in range(3):  # then rows of 1 MB: a row group each (1 MiB for two columns)
        sink.add([(n, wide)])
    sink.finish()
    metadata = pq.ParquetFile(path / "out.parquet").metadata
    assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [1001, 1, 1]
    table = pq.read_table(path / "out.parquet")
    assert table.column("n").to_pylist() == [*range(1000), 0, 1, 2]


def test_small_batches_of_many_columns_are_held_as_one_table(folder: tuple[Path, int]) -> None:
    """Each batch's arrays cost ~1.7 KB apiece beside their values: pending batches are joined."""
    path, fd = folder
    columns = [f"c{i}" for i in range(300)]
    sink = ParquetSink(fd, "out.parquet", limit_bytes=2**30)
    sink.start(columns, [pa.int32()] * len(columns))
    for row in range(40):
        sink.add([tuple(range(row, row + len(columns)))])
        assert len(sink._pending) < parquet._COMPACT_AFTER
    sink.finish()
    table = pq.read_table(path / "out.parquet")
    assert table.num_rows == 40 and table.column("c299").to_pylist() == [row + 299 for row in range(40)]
    assert pq.ParquetFile(path / "out.parquet").metadata.num_row_groups == 1


def test_the_quota_is_checked_before_a_row_group_is_full(folder: tuple[Path, int]) -> None:
    path, fd = folder
    sink = ParquetSink(fd, "out.parquet", limit_bytes=50_000)
    sink.start(["h"], [pa.string()])
    with pytest.raises(parquet.ResultTooLarge):
        for _ in range(100):  # 36 KB of text a batch, far under a row group
            sink.add([(os.urandom(16).hex(),) for _ in range(1000)])
    assert 50_000 < sink.bytes < 50_000 + 40_000  # stopped at the batch that took it past the room
    sink.abort()
