"""nbclient's conformance notebooks, run cell by cell in a thread's kernel.

The notebooks are read at test time from ``../shared/conformance/nbclient`` (relative to
the repository); they are data, not part of this project.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest

from kernels import ExecutionResult, KernelPool, Outcome

pytestmark = pytest.mark.asyncio(loop_scope="module")

NOTEBOOKS = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "nbclient"
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
_IMAGES = ("image/png", "image/svg+xml", "image/jpeg")

if not NOTEBOOKS.is_dir():
    pytest.skip(f"conformance notebooks not found at {NOTEBOOKS}", allow_module_level=True)


def _code_cells(name: str) -> list[Any]:
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _expected(cell: Any) -> dict[str, Any]:
    streams = "".join(out.text for out in cell.outputs if out.output_type == "stream")
    results = [out.data for out in cell.outputs if out.output_type == "execute_result"]
    errors = [out.ename for out in cell.outputs if out.output_type == "error"]
    images = {m for data in results for m in data if m in _IMAGES}
    if "image/svg+xml" in images:
        images.add("image/png")  # threadbook_kernel.display adds a PNG to every SVG, for the chat
    return {
        "stdout": streams,
        "result": _ADDRESS.sub("", results[0]["text/plain"]) if results else None,
        "images": sorted(images),
        "error": errors[0] if errors else None,
    }


def _got(result: ExecutionResult) -> dict[str, Any]:
    bundles = [*result.displays, *([result.result_data] if result.result_data else [])]
    return {
        "stdout": result.stdout,
        "result": _ADDRESS.sub("", result.result) if result.result is not None else None,
        "images": sorted({m for out in bundles for m in out.data if m in _IMAGES}),
        "error": result.error.ename if result.error else None,
    }


@pytest.mark.parametrize(
    "name",
    [
        "HelloWorld",
        "Factorials",
        "Error",
        "Unicode",
        "UnicodePy3",
        "SVG",
        "Inline Image",
        "Empty Cell",
        "Check History in Memory",
    ],
)
async def test_notebook_outputs_match(pool: KernelPool, name: str) -> None:
    session = await pool.get_or_start(f"conformance:{name}")
    shutil.copy(NOTEBOOKS / "python.png", session.workspace.path / "python.png")
    for cell in _code_cells(name):
        # The pool's 2 s bound is for the timeout tests; an SVG's first PNG (vl_convert's import
        # and first render, ~0.6 s idle) can pass it on a loaded CI machine.
        result = await session.execute(cell.source, timeout=30)
        assert _got(result) == _expected(cell), cell.source
        assert result.outcome in (Outcome.OK, Outcome.ERROR)


async def test_sleep1s(pool: KernelPool) -> None:
    session = await pool.get_or_start("conformance:Sleep1s")
    results = [await session.execute(cell.source) for cell in _code_cells("Sleep1s")]
    assert all(r.ok for r in results) and results[1].duration_s >= 1.0
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT[\d:.]+Z \d{4}-\d\d-\d\dT[\d:.]+Z", results[2].stdout + " " + results[3].stdout
    )


async def test_interrupt_notebook(pool: KernelPool) -> None:
    session = await pool.get_or_start("conformance:Interrupt")
    loop_cell, print_cell = _code_cells("Interrupt")
    stopped = await session.execute(loop_cell.source, timeout=0.5)
    assert stopped.outcome is Outcome.TIMEOUT_INTERRUPTED and _got(stopped)["error"] == _expected(loop_cell)["error"]
    assert _got(await session.execute(print_cell.source)) == _expected(print_cell)


async def test_autokill_notebook(pool: KernelPool) -> None:
    session = await pool.get_or_start("conformance:Autokill")
    (cell,) = _code_cells("Autokill")
    died = await session.execute(cell.source)
    assert died.outcome is Outcome.DIED and "SIGTERM" in died.notice
    assert (await session.execute("1+1")).kernel_restarted
