"""The kernel runtime writes sizes exactly as the bot does: ``threadbook_kernel.answer.human_size``
is a copy of ``kernels.seam.units.human_size`` (the kernel environment cannot import the bot's
packages), kept equal by this test."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from kernels.seam.units import human_size

ANSWER = Path(__file__).resolve().parents[2] / "kernels" / "runtime" / "threadbook_kernel" / "answer.py"


def kernel_answer_module() -> ModuleType:
    """``threadbook_kernel.answer`` loaded from the source tree (it imports only the standard library)."""
    spec = importlib.util.spec_from_file_location("threadbook_kernel_answer_under_test", ANSWER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SIZES = [0, 1, 1023, 1024, 1025, 1536, 10 * 1024 - 1, 2**20 - 1, 2**20, 5 * 2**20 + 12345, 2**30, 3 * 2**40, 2**60]


@pytest.mark.parametrize("size", SIZES)
def test_the_kernel_writes_sizes_as_the_bot_does(size: int) -> None:
    assert kernel_answer_module().human_size(size) == human_size(size)
