"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.postgres import LocalPostgres, find_postgres
from bot.config import Settings, parse_settings
from tests.fakes.openai_server import scripted_openai  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[1]
#: The kernel interpreter of every test: the repo's kernel environment (``make kernel-env``),
#: or the interpreter ``test_nonroot.py``'s unprivileged child names (it cannot reach that one).
KERNEL_PYTHON = Path(os.environ.get("THREADBOOK_TEST_KERNEL_PYTHON") or REPO / ".venv-kernel" / "bin" / "python")


def kernel_config(tmp_path: Path) -> dict[str, Any]:
    """The ``kernels:`` section of a test's config file: data under ``tmp_path``, no sandbox,
    no warm pool, no preload, the kernel environment."""
    return {
        "workspace_root": str(tmp_path / "ws"),
        "sandbox": "none",
        "warm_pool": 0,
        "preload": [],
        "python": str(KERNEL_PYTHON),
        "packages": {"dir": str(tmp_path / "packages")},
    }


def make_settings(tmp_path: Path, *, llm_url: str = "http://127.0.0.1:9/v1", **sections: dict[str, Any]) -> Settings:
    """Settings for a test: data under ``tmp_path``, short timeouts, no sandbox, no warm pool.

    ``sections`` are merged over the defaults section by section (``kernels={"exec_timeout_s": 5}``).
    """
    raw: dict[str, Any] = {
        "llm": {
            "base_url": llm_url,
            "api_key": "test-key",
            "model": "fake-model",
            "max_rounds": 6,
            "request_timeout_s": 10,
            "max_retries": 2,
        },
        "kernels": {
            "workspace_root": str(tmp_path / "workspaces"),
            "exec_timeout_s": 20,
            "interrupt_grace_s": 2,
            "warm_pool": 0,
            "sandbox": "none",
            "max_kernels": 6,
            "preload": [],
            "python": str(KERNEL_PYTHON),
            "packages": {"dir": str(tmp_path / "packages")},
        },
        "storage": {"path": str(tmp_path / "data" / "threadbook.db")},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    if "url" in raw["storage"]:  # a database URL replaces the SQLite file
        del raw["storage"]["path"]
    return parse_settings(raw, env={})


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """One real PostgreSQL server for the test session (Debian's postgresql, on 127.0.0.1)."""
    folder, why = find_postgres()
    if folder is None:
        pytest.skip(why)
    with LocalPostgres() as server:
        yield server


@pytest.fixture
def pg_url(postgres: LocalPostgres) -> str:
    """The URL of a new, empty PostgreSQL database."""
    return postgres.database()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a store test keeps its data: an SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "data" / "threadbook.db"
    return str(request.getfixturevalue("pg_url"))


#: Parameter ids of kernel sources that run in the sandbox (tests/kernels, tests/security).
_SANDBOXED_IDS = ("bwrap", "fork", "warm", "sandboxed")
_SLOW_FOLDERS = ("tests/container/", "tests/bench/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by what it needs (the markers of pyproject.toml), so a run can leave
    out what is slow or needs a server: ``make test-fast``."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        path = item.path.as_posix()
        ids = item.nodeid.partition("[")[2]
        if fixtures & {"postgres", "pg_url"} or "postgresql" in ids or "/tests/replicas/" in path:
            item.add_marker(pytest.mark.postgres)
        if "gateway" in fixtures or "/tests/gateway/" in path or "gateway" in ids:
            item.add_marker(pytest.mark.gateway)
        if "/tests/security/" in path or any(name in ids for name in _SANDBOXED_IDS):
            item.add_marker(pytest.mark.sandbox)
        if any(f"/{folder}" in path for folder in _SLOW_FOLDERS):
            item.add_marker(pytest.mark.slow)
