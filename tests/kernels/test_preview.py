"""Upload previews (``threadbook_kernel.preview``) computed in real one-shot processes from a
descriptor of the file, plain and sandboxed; and the silent evaluation the bot still asks a
thread's kernel for its snapshots (``KernelSession.evaluate``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import openpyxl
import pytest
from PIL import Image

from kernels import KernelPool, KernelSession, Outcome, build_pool
from kernels.bwrap.launcher import BwrapLauncher
from kernels.local.launcher import KernelLauncher
from kernels.oneshot.runner import OneShot
from tests.fakes.outputs import PeakRss
from tests.fakes.uploads import huge_header_png, sparse_csv, zip_bomb_xlsx
from tests.kernels.conftest import kernel_settings

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def preview(session: KernelSession, name: str, timeout: float = 30) -> str | None:
    """What a one-shot sandboxed like ``session``'s kernel says about its workspace file
    ``name`` (None: no answer), read from a descriptor as the bot opens it."""
    launcher = session.launcher
    launcher = getattr(launcher, "fallback", launcher)  # a warm hand-off
    launcher = getattr(launcher, "spawn", launcher)  # the fork server's spawning launcher
    assert isinstance(launcher, (KernelLauncher, BwrapLauncher))
    fd = os.open(session.workspace.path / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        result = await OneShot(launcher).run("preview", [str(fd), name], timeout=timeout, max_output=100_000, fd=fd)
    finally:
        os.close(fd)
    return json.loads(result.output) if result.ok else None


def write(session: KernelSession, name: str, data: bytes) -> None:
    (session.workspace.path / name).write_bytes(data)


# --- evaluate ----------------------------------------------------------------------------------


async def test_evaluate_is_silent_and_keeps_the_kernel_state(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:eval")
    await session.execute("x = 41")
    assert await session.evaluate("x + 1", 10) == "42"
    assert await session.evaluate("1 / 0", 10) is None  # an error is no answer, not an exception
    nxt = await session.execute("x")
    assert nxt.result == "41" and nxt.execution_count == 2 and session.executions == 2  # no count used
    assert nxt.stdout == "" and not nxt.kernel_restarted


async def test_evaluate_that_runs_too_long_is_interrupted_and_the_kernel_keeps_its_variables(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:eval-slow")
    await session.execute("kept = 'yes'")
    started = time.monotonic()
    assert await session.evaluate("__import__('time').sleep(60)", 1.0) is None
    assert time.monotonic() - started < 10
    after = await session.execute("kept")
    assert after.result == "'yes'" and not after.kernel_restarted


async def test_evaluate_in_a_kernel_that_ignores_the_interrupt_replaces_it_and_says_so(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:eval-stuck")
    await session.execute("lost = 1")
    # ipykernel installs its own SIGINT handler for each request: ignore SIGINT inside this one.
    stuck = "(__import__('signal').signal(2, __import__('signal').SIG_IGN), __import__('time').sleep(60))"
    started = time.monotonic()
    assert await session.evaluate(stuck, 1.0) is None
    assert time.monotonic() - started < 1.0 + session.settings.interrupt_grace_s + 5
    after = await session.execute("1 + 1")
    assert after.result == "2" and after.kernel_restarted and "variables from before were lost" in (after.notice or "")


async def test_evaluate_that_kills_the_kernel_returns_none_and_the_next_execution_says_so(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:eval-dies")
    await session.execute("y = 1")
    assert await session.evaluate("__import__('os')._exit(3)", 10) is None
    after = await session.execute("1 + 1")
    assert after.outcome is Outcome.OK and after.result == "2" and after.kernel_restarted


# --- each format -------------------------------------------------------------------------------


async def test_csv_previews_sniff_delimiter_encoding_and_decimal_comma(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:csv")
    sales = "region,units,price\nnorth,3,2.5\nsouth,7,1.25\n" + "".join(f"east,{i},{i / 2}\n" for i in range(10))
    write(session, "sales.csv", sales.encode())
    write(session, "euro.csv", "name;amount;city\nJosé;1,5;Zürich\nZoë;2,25;Köln\n".encode("latin-1"))
    write(session, "wide.csv", "a,b\n1,é\n2,ü\n".encode("utf-16"))
    write(session, "scores.tsv", b"name\tscore\nada\t9.5\nbob\t7.0\n")

    text = await preview(session, "sales.csv")
    assert text is not None and text.startswith("CSV, 12 rows × 3 columns")
    assert "units (int64)" in text and "price (float64)" in text and "read it with" not in text
    assert text.split("first 5 rows:")[1].count("\n") == 6  # header + 5 rows

    euro = await preview(session, "euro.csv")
    assert euro is not None and euro.startswith("CSV, 2 rows × 3 columns")
    assert "pd.read_csv('euro.csv', sep=';', encoding='latin-1', decimal=',')" in euro
    assert "amount (float64)" in euro and "José" in euro and "Zürich" in euro

    wide = await preview(session, "wide.csv")
    assert wide is not None and "encoding='utf-16'" in wide and "é" in wide and "a (int64)" in wide

    tsv = await preview(session, "scores.tsv")
    assert tsv is not None and tsv.startswith("TSV, 2 rows × 2 columns") and "score (float64)" in tsv


async def test_big_csv_reads_a_bounded_prefix_and_estimates_rows(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:csv-big")
    rows = 300_000
    with (session.workspace.path / "big.csv").open("w") as handle:
        handle.write("id,value,label\n")
        handle.writelines(f"{i},{i * 0.5},label{i % 7}\n" for i in range(rows))
    text = await preview(session, "big.csv")
    assert text is not None and text.startswith("CSV, about ")
    estimate = int(text.removeprefix("CSV, about ").split(" ")[0].replace(",", ""))
    assert abs(estimate - rows) / rows < 0.1 and "id (int64)" in text


async def test_malformed_csv_shows_its_first_lines(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:csv-bad")
    write(session, "broken.csv", b"a,b\n1,2\n3,4,5,6\n")
    text = await preview(session, "broken.csv")
    assert text is not None and "could not be parsed as CSV" in text and "3,4,5,6" in text


async def test_excel_json_parquet_image_text_binary_and_empty(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:formats")
    workspace = session.workspace.path
    book = openpyxl.Workbook()
    orders = book.active
    assert orders is not None
    orders.title = "Orders"
    orders.append(["order", "amount"])
    for i in range(8):
        orders.append([f"A{i}", i * 10])
    book.create_sheet("Customers").append(["id", "name"])
    book.save(workspace / "book.xlsx")
    write(session, "config.json", json.dumps({"name": "x", "items": [1, 2, 3], "nested": {"a": 1}}).encode())
    write(session, "records.json", json.dumps([{"id": i, "tags": ["a"]} for i in range(25)]).encode())
    write(session, "bad.json", b"{not json")
    write(session, "events.jsonl", b'{"id": 1, "kind": "a"}\n{"id": 2, "kind": "b"}\n')
    made = await session.execute(
        "import pandas as pd\npd.DataFrame({'x': [1, 2, 3], 'y': ['a', 'b', 'c']}).to_parquet('table.parquet')",
        timeout=60,
    )
    assert made.ok, made
    Image.new("RGB", (12, 34)).save(workspace / "pic.png")
    write(session, "notes.txt", "".join(f"line {i}\n" for i in range(30)).encode())
    write(session, "blob", bytes(range(256)) * 8)
    write(session, "empty.csv", b"")

    excel = await preview(session, "book.xlsx")
    assert excel is not None and "2 sheet(s): Orders, Customers" in excel
    assert "first sheet 'Orders', 8 data rows" in excel and "A4" in excel and "A5" not in excel
    assert await preview(session, "config.json") == (
        "JSON, 53 B: object with 3 keys: name (string), items (array, 3 items), nested (object, 1 keys)"
    )
    records = await preview(session, "records.json")
    assert records is not None and "array of 25 items; first item: object with 2 keys: id (number)" in records
    assert "could not be parsed" in (await preview(session, "bad.json") or "")
    lines = await preview(session, "events.jsonl")
    assert lines is not None and lines.startswith("JSON Lines, 2 records") and "kind (string)" in lines
    parquet = await preview(session, "table.parquet")
    assert parquet is not None and parquet.startswith("Parquet, 3 rows × 2 columns") and "x (int64)" in parquet
    assert (await preview(session, "pic.png") or "").startswith("PNG image, 12×34 pixels")
    notes = await preview(session, "notes.txt")
    assert notes is not None and notes.startswith("text, 30 lines") and "line 9" in notes and "line 10" not in notes
    assert await preview(session, "blob") == "binary file of unknown type, 2.0 KB."
    assert await preview(session, "empty.csv") == "empty file (0 bytes)."


# --- hostile files -----------------------------------------------------------------------------


async def test_hostile_files_get_short_previews_and_cost_the_bot_and_the_kernel_nothing(pool: KernelPool) -> None:
    session = await pool.get_or_start("t:hostile")
    workspace = session.workspace.path
    await session.execute("kept = 42")
    zip_bomb_xlsx(workspace / "bomb.xlsx", sheet_mb=300, dimension=False)
    zip_bomb_xlsx(workspace / "rows.xlsx", sheet_mb=300, dimension=True)
    zip_bomb_xlsx(workspace / "theme.xlsx", theme_mb=300)
    sparse_csv(workspace / "huge.csv")
    huge_header_png(workspace / "huge.png")
    try:
        texts: dict[str, str | None] = {}
        with PeakRss() as rss:
            started = time.monotonic()
            for name in ("bomb.xlsx", "rows.xlsx", "theme.xlsx", "huge.csv", "huge.png"):
                texts[name] = await preview(session, name, timeout=20)
            elapsed = time.monotonic() - started
    finally:
        (workspace / "huge.csv").unlink()
    growth = rss.growth / 2**20
    print(f"hostile previews: {elapsed:.1f} s, bot peak RSS growth {growth:.1f} MiB")
    for name, text in texts.items():
        print(f"{name}: {text}")
    assert growth < 20, f"the bot grew by {growth:.0f} MiB while the kernel read hostile files"
    assert "does not say its size" in (texts["bomb.xlsx"] or "")
    assert "7,315,500 data rows" in (texts["rows.xlsx"] or "")  # streamed: only the first rows read
    assert "theme1.xml unpacks to 300.0 MB" in (texts["theme.xlsx"] or "")
    assert (texts["huge.csv"] or "").startswith("CSV file, 10.0 GB, that does not look like text")
    assert "50000×50000 pixels" in (texts["huge.png"] or "") and "over Pillow's limit" in (texts["huge.png"] or "")
    assert all(len(text or "") < 1000 for text in texts.values())
    after = await session.execute("kept")
    assert after.result == "42" and not after.kernel_restarted and after.execution_count == 2  # untouched


@pytest.mark.parametrize("fork_server", [False, True], ids=["spawn", "fork"])
async def test_previews_run_inside_the_bubblewrap_sandbox(tmp_path: Path, fork_server: bool) -> None:
    from tests.security.conftest import KERNEL_PYTHON, SKIP_REASON

    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    settings = kernel_settings(
        tmp_path, sandbox="bwrap", python=KERNEL_PYTHON, fork_server=fork_server, memory_mb=640, interrupt_grace_s=2
    )
    sandboxed = build_pool(settings)
    await sandboxed.start()
    try:
        session = await sandboxed.get_or_start("t:sandboxed")
        assert (await session.execute("import os; os.getcwd()")).result == "'/workspace'"
        write(session, "euro.csv", "name;amount\nJosé;1,5\nZoë;2,25\n".encode("latin-1"))
        zip_bomb_xlsx(session.workspace.path / "bomb.xlsx", sheet_mb=200, dimension=False, theme_mb=200)
        huge_header_png(session.workspace.path / "huge.png")
        await session.execute("os.chdir('/tmp')")
        with PeakRss() as rss:
            euro = await preview(session, "euro.csv")
            bomb = await preview(session, "bomb.xlsx")
            png = await preview(session, "huge.png")
        assert euro is not None and "encoding='latin-1'" in euro and "amount (float64)" in euro and "José" in euro
        assert bomb is not None and "rows not previewed" in bomb
        assert png is not None and "50000×50000 pixels" in png
        assert rss.growth < 20 * 2**20
        assert (await session.execute("1 + 1")).result == "2"
    finally:
        await sandboxed.shutdown_all()
