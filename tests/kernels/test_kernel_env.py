"""The kernel environment: the data toolbox is there, the bot's own libraries are not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels import build_pool
from tests.conftest import KERNEL_PYTHON
from tests.kernels.conftest import kernel_settings
from tests.security.conftest import SKIP_REASON

TOOLBOX = (
    "seaborn",
    "sklearn",
    "scipy",
    "statsmodels",
    "pandas",
    "numpy",
    "matplotlib",
    "openpyxl",
    "pyarrow",
    "plotly",
    "altair",
    "tabulate",
    "PIL",
)
BOT_LIBRARIES = (
    "slack_bolt",
    "slack_sdk",
    "discord",
    "openai",
    "sqlalchemy",
    "asyncpg",
    "apscheduler",
    "bot",
    "kernels",
    "adapters",
)
CHECK = f"""
import importlib, json, sys
found = {{}}
for name in {TOOLBOX + BOT_LIBRARIES!r}:
    try:
        importlib.import_module(name)
        found[name] = "ok"
    except ImportError as exc:
        found[name] = type(exc).__name__
print(json.dumps({{"found": found, "executable": sys.executable}}))
"""


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
async def test_the_toolbox_imports_and_the_bots_libraries_do_not(tmp_path: Path, sandbox: str) -> None:
    if sandbox == "bwrap" and SKIP_REASON:
        pytest.skip(SKIP_REASON)
    pool = build_pool(kernel_settings(tmp_path, sandbox=sandbox, exec_timeout_s=120))
    try:
        session = await pool.get_or_start("env:check")
        result = await session.execute(CHECK)
        assert result.ok, result
        report = json.loads(result.stdout)
    finally:
        await pool.shutdown_all()
    assert {name: report["found"][name] for name in TOOLBOX} == dict.fromkeys(TOOLBOX, "ok")
    assert {name: report["found"][name] for name in BOT_LIBRARIES} == dict.fromkeys(
        BOT_LIBRARIES, "ModuleNotFoundError"
    )
    assert report["executable"] == str(KERNEL_PYTHON)  # the kernel environment's interpreter, never the bot's
