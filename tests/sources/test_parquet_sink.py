"""The Parquet sink on its own: how it makes, names and drops its file in a folder the kernel can write."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bot.sources.parquet import ParquetSink
from kernels import safefs


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
