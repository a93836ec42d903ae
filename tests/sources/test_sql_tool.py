"""The ``sql`` tool on its own (an SQLite source, a real workspace, a kernel that only records
its code): what the model is told when writing the rows fails, and that nothing is left behind."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from bot.sources import tool as tool_module
from bot.sources.registry import Sources
from bot.sources.settings import SourceSettings
from bot.sources.tool import SqlTool
from kernels.host.workspace import STATE_DIR, Workspace
from kernels.seam.result import ExecutionResult

MakeSettings = Callable[..., SourceSettings]


class RecordingKernel:
    """Runs nothing: records the code and says it went well."""

    def __init__(self) -> None:
        self.codes: list[str] = []

    async def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
        self.codes.append(code)
        return ExecutionResult()


@pytest_asyncio.fixture
async def sources(sqlite_file: Path, source_settings: MakeSettings) -> AsyncIterator[Sources]:
    opened = Sources({"shop": source_settings(f"sqlite:///{sqlite_file}")})
    yield opened
    await opened.close()


def workspace_in(tmp_path: Path) -> Workspace:
    path = tmp_path / "ws"
    path.mkdir()
    return Workspace(path, max_file_bytes=2**26, quota_bytes=2**27)


async def make_tool(sources: Sources, workspace: Workspace, kernel: RecordingKernel, **kw: object) -> SqlTool:
    return await SqlTool.open(sources=sources, granted=["shop"], kernel=kernel, workspace=workspace, **kw)  # type: ignore[arg-type]


def fds_on(folder: Path) -> list[str]:
    """This process's descriptors open on ``folder`` or a file in it."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == str(folder) or target.startswith(f"{folder}/"):
            found.append(target)
    return found


def call(query: str, name: str = "result") -> str:
    return json.dumps({"query": query, "name": name})


async def test_a_folder_planted_under_the_result_name_is_told_as_a_write_failure(
    sources: Sources, tmp_path: Path
) -> None:
    workspace, kernel = workspace_in(tmp_path), RecordingKernel()
    tool = await make_tool(sources, workspace, kernel)
    (workspace.path / STATE_DIR).mkdir()
    (workspace.path / STATE_DIR / "sql-result.parquet").mkdir()
    told = await tool.call(call("SELECT * FROM orders"))
    assert told.startswith("Not loaded: the rows could not be written into the workspace"), told
    assert kernel.codes == []
    assert sorted(os.listdir(workspace.path / STATE_DIR)) == ["sql-result.parquet"]  # the temporary file is gone
    assert fds_on(workspace.path / STATE_DIR) == []


async def test_a_loaded_result_leaves_no_file_and_no_descriptor(sources: Sources, tmp_path: Path) -> None:
    workspace, kernel = workspace_in(tmp_path), RecordingKernel()
    tool = await make_tool(sources, workspace, kernel)
    told = await tool.call(call("SELECT * FROM orders"))
    assert "3 rows" in told, told
    assert len(kernel.codes) == 1
    assert os.listdir(workspace.path / STATE_DIR) == []
    assert fds_on(workspace.path / STATE_DIR) == []


async def test_a_refused_query_leaves_no_descriptor(sources: Sources, tmp_path: Path) -> None:
    workspace, kernel = workspace_in(tmp_path), RecordingKernel()
    tool = await make_tool(sources, workspace, kernel)
    told = await tool.call(call("SELECT * FROM nowhere"))
    assert told.startswith("The database refused or failed the query"), told
    assert fds_on(workspace.path / STATE_DIR) == []


async def test_the_query_is_checked_off_the_event_loop(
    sources: Sources, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace, kernel = workspace_in(tmp_path), RecordingKernel()
    tool = await make_tool(sources, workspace, kernel)
    loop_thread = threading.get_ident()
    checked_in: list[int] = []
    real = tool_module.check_query

    def spy(query: str, dialect: str) -> None:
        checked_in.append(threading.get_ident())
        real(query, dialect)

    monkeypatch.setattr(tool_module, "check_query", spy)
    told = await tool.call(call("DELETE FROM orders"))
    assert told.startswith("Refused"), told
    assert checked_in and checked_in[0] != loop_thread


async def test_a_backtick_in_the_query_keeps_the_status_one_code_span(sources: Sources, tmp_path: Path) -> None:
    shown: list[str] = []

    async def status(text: str) -> None:
        shown.append(text)

    workspace, kernel = workspace_in(tmp_path), RecordingKernel()
    tool = await make_tool(sources, workspace, kernel, status=status)
    await tool.call(call('SELECT id AS `the id` FROM orders -- a "quoted" ``` run'))
    assert len(shown) == 1
    line = shown[0]
    assert line.count("`") == 4, line  # the source's span and the query's, nothing else
    assert line.endswith("`") and "'the id'" in line
