"""A thread's variables outlive its kernel: saved on the way down, restored on the way up.

Real kernels: plain, bubblewrap-sandboxed and forked from the sandboxed fork server where this
machine allows. The snapshot is serialised and loaded by the kernel; the bot only sizes and
deletes its files.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from kernels import KernelPool, Reaper, build_pool
from kernels.host.workspace import STATE_DIR
from kernels.session.snapshots import MAX_ANSWER_CHARS, parse_restore, parse_save
from tests.kernels.conftest import kernel_settings
from tests.security.conftest import SKIP_REASON

#: Defines what a thread typically holds: a number, a DataFrame (and a second name for it), a
#: function and a class of the thread's own, an instance, a lambda, a fitted scikit-learn
#: model, modules, and an open file (which must be reported lost, by name).
NAMESPACE = """
import pandas as pd, numpy as np
from sklearn.linear_model import LinearRegression
x = 42
df = pd.DataFrame({"region": ["north", "south"] * 500, "sales": np.arange(1000.0)})
same = df
def scaled(n):
    return n * x
class Point:
    def __init__(self, a):
        self.a = a
    def far(self):
        return self.a * x
p = Point(3)
inc = lambda v: v + 1
model = LinearRegression().fit(df[["sales"]], df["sales"] * 2)
fh = open("notes.txt", "w")
"""
CHECK = (
    "x = 10\n"  # the restored function and method see the namespace as it is now
    "print(scaled(2), p.far(), isinstance(p, Point), inc(1), same is df, df.shape, "
    "round(float(model.predict(pd.DataFrame({'sales': [3.0]}))[0]), 3), pd.__name__, "
    "df.groupby('region').sales.sum().to_dict())"
)
SOURCES = {
    "spawn": {},
    "bwrap": {"sandbox": "bwrap"},
    "fork": {"sandbox": "bwrap", "fork_server": True},
    # The thread's next kernel is a warm one, adopted into the workspace its last kernel wrote
    # (as root: under another uid than the one that wrote it).
    "warm": {"sandbox": "bwrap", "fork_server": True, "warm_pool": 1},
}


@pytest_asyncio.fixture(params=list(SOURCES))
async def any_pool(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KernelPool]:
    if request.param != "spawn" and SKIP_REASON:
        pytest.skip(SKIP_REASON)
    pool = build_pool(kernel_settings(tmp_path, idle_timeout_s=0.2, **SOURCES[request.param]))
    await pool.start()
    yield pool
    await pool.shutdown_all()


@pytest_asyncio.fixture
async def plain_pool(tmp_path: Path) -> AsyncIterator[KernelPool]:
    pool = build_pool(kernel_settings(tmp_path, idle_timeout_s=0.2))
    yield pool
    await pool.shutdown_all()


async def test_variables_survive_a_cull(any_pool: KernelPool) -> None:
    session = await any_pool.get_or_start("s:cull")
    assert (await session.execute(NAMESPACE)).ok
    await asyncio.sleep(0.3)
    assert await Reaper(any_pool, any_pool.settings).cull_kernels() == ["s:cull"]
    workspace = session.workspace
    saved = await asyncio.to_thread(workspace.saved_state)
    assert saved is not None and saved.bytes > 0
    # Threadbook's own folder is neither a file of the thread nor something a turn sends back.
    assert [f.name for f in await workspace.list_files()] == ["notes.txt"]
    assert not any(name.startswith(STATE_DIR) for name in workspace.stamps())

    if any_pool.warm is not None:
        await any_pool.warm.wait_ready(timeout=60)
    again = await any_pool.get_or_start("s:cull")
    assert again is not session and again.restored is not None and again.restored.failure is None
    restored = dict(again.restored.restored)
    assert restored["df"] == "DataFrame 1,000×2" and restored["scaled"] == "function" and restored["Point"] == "class"
    assert {"x", "same", "p", "inc", "model", "pd", "np", "LinearRegression"} <= restored.keys()
    lost = dict(again.restored.lost)
    assert "open file handle" in lost["fh"] and "fh" not in restored
    result = await again.execute(CHECK)
    assert result.ok, result.error
    assert result.stdout.strip() == ("20 30 True 2 True (1000, 2) 6.0 pandas {'north': 249500.0, 'south': 250000.0}")
    notice = again.restored.notice()
    assert "`df` (DataFrame 1,000×2)" in notice and "`fh` (it is an open file handle" in notice


async def test_a_crash_loses_at_most_the_last_turn(tmp_path: Path) -> None:
    """After each turn (lease) the variables are saved in the background: a bot killed without
    any chance to save (its kernels die with it) restarts with them."""
    settings = kernel_settings(tmp_path)
    first = build_pool(settings)
    try:
        async with first.lease("s:crash") as session:
            assert (await session.execute("y = [1, 2, 3]\nz = {'k': 'v'}")).ok
        while first._saves:  # the after-turn save runs in the background
            await asyncio.sleep(0.05)
        assert session.snapshots.last_save is not None and session.snapshots.last_save.saved == 2
        assert session.pid is not None
        os.kill(session.pid, signal.SIGKILL)  # as if the machine lost the bot and its kernels
    finally:
        await first.shutdown_all()

    second = build_pool(settings)
    try:
        again = await second.get_or_start("s:crash")
        assert (await again.execute("print(y, z)")).stdout.strip() == "[1, 2, 3] {'k': 'v'}"
    finally:
        await second.shutdown_all()


async def test_a_variable_over_the_limit_is_left_out_by_name(tmp_path: Path) -> None:
    pool = build_pool(kernel_settings(tmp_path, snapshot_max_mb=1))
    try:
        session = await pool.get_or_start("s:big")
        await session.execute(
            "import numpy as np\nbig = np.zeros(1_000_000)\nsmall = list(range(10))\nbytes_ = b'x' * 3_000_000"
        )
        report = await session.save_state()
        assert report is not None and report.saved == 2 and report.bytes < 2**20  # np and small
        assert dict(report.lost).keys() == {"big", "bytes_"}
        assert "larger than the snapshot's 1.0 MB limit" in dict(report.lost)["big"]
        await pool.shutdown("s:big")
        again = await pool.get_or_start("s:big")
        assert again.restored is not None and [name for name, _ in again.restored.lost] == ["big", "bytes_"]
        assert (await again.execute("small[-1]")).result == "9"
    finally:
        await pool.shutdown_all()


async def test_a_damaged_snapshot_is_reported_and_the_kernel_works(plain_pool: KernelPool) -> None:
    session = await plain_pool.get_or_start("s:damaged")
    await session.execute("a = 1\nb = 2")
    await plain_pool.shutdown("s:damaged")
    snapshot = session.workspace.path / STATE_DIR / "snapshot"
    # One variable's file broken: only that variable is lost.
    manifest = (snapshot / "manifest.json").read_text()
    broken = next(f for f in snapshot.iterdir() if f.suffix == ".pkl" and f.read_bytes().endswith(b"K\x02."))
    broken.write_bytes(b"not a pickle")
    again = await plain_pool.get_or_start("s:damaged")
    assert again.restored is not None and dict(again.restored.restored) == {"a": "int"}
    assert "could not be loaded" in dict(again.restored.lost)["b"]
    assert manifest  # the manifest itself was fine

    # The manifest broken: the snapshot is reported, discarded, and the kernel works.
    await again.execute("c = 3")
    await plain_pool.shutdown("s:damaged")
    (snapshot / "manifest.json").write_bytes(b"\x00garbage")
    third = await plain_pool.get_or_start("s:damaged")
    assert third.restored is not None and third.restored.failure is not None
    assert "could not be restored (it is damaged" in third.restored.notice()
    assert await asyncio.to_thread(third.workspace.saved_state) is None  # never tried again
    assert (await third.execute("1 + 1")).result == "2"


async def test_a_snapshot_that_kills_its_kernel_is_discarded(plain_pool: KernelPool) -> None:
    session = await plain_pool.get_or_start("s:bomb")
    await session.execute(
        "import os\nclass Bomb:\n    def __reduce__(self):\n        return (os._exit, (3,))\nbomb = Bomb()"
    )
    await plain_pool.shutdown("s:bomb")
    again = await plain_pool.get_or_start("s:bomb")
    assert again.restored is not None and again.restored.failure is not None
    assert await again.is_alive() and (await again.execute("'bomb' in dir()")).result == "False"
    assert await asyncio.to_thread(again.workspace.saved_state) is None


async def test_reset_forgets_and_retention_deletes(plain_pool: KernelPool) -> None:
    session = await plain_pool.get_or_start("s:reset")
    await session.execute("kept = 'no'")
    await plain_pool.shutdown("s:reset")
    workspace = session.workspace
    assert await asyncio.to_thread(workspace.saved_state) is not None
    await plain_pool.forget_state("s:reset")  # ``reset`` with no kernel running
    assert await asyncio.to_thread(workspace.saved_state) is None
    again = await plain_pool.get_or_start("s:reset")
    assert again.restored is None and (await again.execute("'kept' in dir()")).result == "False"

    await again.execute("kept = 'yes'")
    assert await again.save_state() is not None
    await plain_pool.forget_state("s:reset")  # ``reset`` with a kernel running: fresh kernel, no snapshot
    assert again.restored is None and await asyncio.to_thread(workspace.saved_state) is None
    assert (await again.execute("'kept' in dir()")).result == "False"

    await again.execute("kept = 'again'")
    await plain_pool.shutdown("s:reset")
    assert await plain_pool.workspaces.delete_stale(-1.0) == [workspace.path]
    assert not workspace.path.exists()


async def test_nothing_to_save_means_no_save(plain_pool: KernelPool) -> None:
    session = await plain_pool.get_or_start("s:idle")
    assert await session.save_state() is None  # no code ran
    await session.execute("q = 1")
    assert await session.save_state() is not None
    assert await session.save_state() is None  # nothing ran since


async def test_a_cell_that_leaves_nothing_to_keep_is_not_followed_by_a_save(plain_pool: KernelPool) -> None:
    """Code ran, but the namespace holds nothing a save keeps and the thread has no snapshot:
    no save (the kernel says so with the cell's reply). Once there is something, or a snapshot
    to replace, there is one."""
    session = await plain_pool.get_or_start("s:nothing-kept")
    assert (await session.execute("print(1)\n_scratch = 2")).ok
    assert await session.save_state() is None
    assert await asyncio.to_thread(session.workspace.saved_state) is None
    assert (await session.execute("kept = 1")).ok
    assert await session.save_state() is not None
    assert (await session.execute("del kept")).ok  # the snapshot still holds it: replaced by an empty one
    report = await session.save_state()
    assert report is not None and report.saved == 0
    assert (await session.execute("1 / 0")).error is not None  # no answer after a failed cell: saved all the same
    assert await session.save_state() is not None


async def test_planted_links_are_not_followed(plain_pool: KernelPool, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "snapshot").mkdir(parents=True)
    (outside / "snapshot" / "precious").write_text("keep")
    session = await plain_pool.get_or_start("s:links")
    await session.execute(f"import os\nos.symlink({str(outside)!r}, {STATE_DIR!r})\nv = 1")
    assert await session.save_state() is None  # the kernel refuses to write through the link
    assert await asyncio.to_thread(session.workspace.saved_state) is None
    await plain_pool.forget_state("s:links")
    assert (outside / "snapshot" / "precious").read_text() == "keep"


def test_kernel_answers_about_snapshots_are_bounded_and_checked() -> None:
    hostile = json.dumps(
        {
            "found": True,
            "saved_at": 0,
            "seconds": 0.1,
            "restored": [["a\x1b[31m`b" + "x" * 500, "int"], "junk", [1, 2]],
            "lost": None,
        }
    )
    report = parse_restore(hostile)
    assert report is not None and report.failure is None and len(report.restored) == 1
    name, kind = report.restored[0]
    assert name.startswith("a [31m'b") and len(name) == 80 and kind == "int"
    assert parse_restore(json.dumps({"found": False})) is None
    assert parse_restore(None) is not None and parse_restore("{").failure is not None  # type: ignore[union-attr]
    assert parse_restore("x" * (MAX_ANSWER_CHARS + 1)).failure is not None  # type: ignore[union-attr]
    assert parse_save(json.dumps({"saved": "many"})) is None
