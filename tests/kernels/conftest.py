"""Real-kernel fixtures: one pool per test module, torn down with a no-orphans check."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_asyncio

from kernels import KernelPool, build_pool
from kernels.seam.settings import KernelSettings
from tests.conftest import KERNEL_PYTHON


def kernel_settings(root: Path, **overrides: Any) -> KernelSettings:
    """Settings with short timeouts, no preload, data under ``root``."""
    values: dict[str, Any] = {
        "workspace_root": root / "workspaces",
        "exec_timeout_s": 20,
        "interrupt_grace_s": 2,  # an interrupt on a loaded 2-core CI machine can take over 1 s
        "max_kernels": 6,
        "preload": (),
        "sandbox": "none",
        "max_output_bytes": 10_000,
        "packages": {"dir": root / "packages"},
        "python": KERNEL_PYTHON,
    }
    values.update(overrides)
    return KernelSettings(**values)


def kernel_processes() -> list[psutil.Process]:
    """ipykernel processes started by this test process (directly or via the pool)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = proc.info["cmdline"] or []
            env = proc.info["environ"] or {}
        except psutil.Error:
            continue
        if any("ipykernel_launcher" in part for part in cmdline) and env.get("JPY_PARENT_PID") == str(os.getpid()):
            found.append(proc)
    return found


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[KernelPool]:
    root = tmp_path_factory.mktemp("kernels")
    kernel_pool = build_pool(kernel_settings(root, exec_timeout_s=2, max_file_mb=20))
    yield kernel_pool
    await kernel_pool.shutdown_all()
