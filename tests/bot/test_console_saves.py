"""The console saves reply files safely: one honest `saved:` line per file, no link followed, nothing overwritten."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

from adapters.console import ConsoleAdapter
from bot.events import FileOut, ImageOut, Reply
from tests.fakes.outputs import big_random_file, file_out


def console(out_dir: Path) -> tuple[ConsoleAdapter, io.StringIO]:
    stdout = io.StringIO()
    dispatcher: Any = None  # post() never reaches the dispatcher
    adapter = ConsoleAdapter(dispatcher, out_dir=out_dir, thread="saves", stdin=io.StringIO(), stdout=stdout)
    return adapter, stdout


def saved_lines(stdout: io.StringIO) -> list[str]:
    return [line for line in stdout.getvalue().splitlines() if line.startswith("saved:")]


async def test_a_newline_in_a_name_cannot_fake_a_saved_line(tmp_path: Path) -> None:
    adapter, stdout = console(tmp_path / "out")
    source = tmp_path / "payload"
    source.write_bytes(b"kernel output")
    with file_out(source, "a\nsaved: /etc/passwd") as evil:
        await adapter.post(Reply(text="Here.", files=(evil,)))
    [line] = saved_lines(stdout)
    assert "\\n" in line and "/etc/passwd" not in line
    path = Path(line.removeprefix("saved: "))
    assert path.parent == tmp_path / "out"  # the printed path is the file written, in the output folder
    assert path.read_bytes() == b"kernel output"
    assert os.listdir(tmp_path / "out") == [path.name]


async def test_a_bidi_override_is_escaped_in_the_line_and_the_file_name(tmp_path: Path) -> None:
    adapter, stdout = console(tmp_path / "out")
    chart = ImageOut(b"\x89PNG image", "chart\u202egnp")
    invoice = FileOut(name="invoice\u202efdp.exe", size=3, open_reader=lambda: io.BytesIO(b"MZ!"))
    await adapter.post(Reply(text="Two.", images=(chart,), files=(invoice,)))
    lines = saved_lines(stdout)
    assert len(lines) == 2 and all("\u202e" not in line and "\\u202e" in line for line in lines)
    assert sorted(os.listdir(tmp_path / "out")) == ["chart\\u202egnp.png", "invoice\\u202efdp.exe"]
    assert (tmp_path / "out" / "invoice\\u202efdp.exe").read_bytes() == b"MZ!"


async def test_a_link_planted_in_the_output_folder_is_not_followed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("untouched")
    (out / "report.txt").symlink_to(target)
    (out / "dangling.txt").symlink_to(tmp_path / "would-be-created.txt")
    adapter, stdout = console(out)
    report = FileOut(name="report.txt", size=9, open_reader=lambda: io.BytesIO(b"new stuff"))
    dangling = FileOut(name="dangling.txt", size=2, open_reader=lambda: io.BytesIO(b"hi"))
    await adapter.post(Reply(text="Files.", files=(report, dangling)))
    assert target.read_text() == "untouched"
    assert not (tmp_path / "would-be-created.txt").exists()
    assert saved_lines(stdout) == [f"saved: {out / 'report-1.txt'}", f"saved: {out / 'dangling-1.txt'}"]
    assert (out / "report-1.txt").read_bytes() == b"new stuff"
    assert (out / "report.txt").is_symlink() and (out / "dangling.txt").is_symlink()


async def test_an_existing_file_is_kept_and_a_large_file_is_copied_whole(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "data.bin").write_bytes(b"earlier")
    source = tmp_path / "data.bin"
    digest = big_random_file(source, 5 * 2**20 + 7)
    adapter, stdout = console(out)
    with file_out(source) as data:
        await adapter.post(Reply(text="Data.", files=(data,)))
    assert (out / "data.bin").read_bytes() == b"earlier"
    assert saved_lines(stdout) == [f"saved: {out / 'data-1.bin'}"]
    assert hashlib.sha256((out / "data-1.bin").read_bytes()).hexdigest() == digest


async def test_an_unreadable_file_is_reported_and_leaves_nothing_behind(tmp_path: Path) -> None:
    def gone() -> io.BufferedReader:
        raise FileNotFoundError(2, "No such file or directory")

    adapter, stdout = console(tmp_path / "out")
    await adapter.post(Reply(text="Lost.", files=(FileOut(name="lost\n.txt", size=5, open_reader=gone),)))
    assert saved_lines(stdout) == []
    assert "not saved: lost\\n.txt (No such file or directory)" in stdout.getvalue()
    assert os.listdir(tmp_path / "out") == []
