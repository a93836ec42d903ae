"""Host paths rewritten in what people see (bot/hostpaths.py), as pure string work."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from bot.hostpaths import HostPaths
from tests.conftest import make_settings


def test_each_kind_of_host_path_becomes_what_a_kernel_sees_or_a_neutral_name(tmp_path: Path) -> None:
    data = tmp_path / "shared-data"
    data.mkdir()
    settings = make_settings(tmp_path, channels={"slack:C1": {"data_dir": str(data)}})
    kernels = settings.kernels
    venv = os.path.dirname(os.path.dirname(os.path.abspath(kernels.python)))
    root = os.path.abspath(kernels.workspace_root)
    hide = HostPaths.of(settings).hide
    assert hide(f"File {venv}/lib/python3.11/site-packages/pandas/io/common.py:873") == (
        "File …/site-packages/pandas/io/common.py:873"
    )
    assert hide(f"{venv}/bin/python") == "<venv>/bin/python"
    assert hide(f"open('{root}/0a1b2c/sales.csv')") == "open('/workspace/sales.csv')"
    assert hide(f"{os.path.abspath(kernels.packages.dir)}/tbdemo") == "/packages/tbdemo"
    assert hide(f"{data}/2026.csv") == "/data/2026.csv"
    assert hide(f"{sys.prefix}/bin/python -m bot") == "<venv>/bin/python -m bot"
    assert hide(str(Path(__file__).resolve())) == "<threadbook>/tests/bot/test_hostpaths.py"
    # Only whole path components: a sibling folder that starts the same is someone else's.
    assert hide(f"{root}-old/x and {data}2/y") == f"{root}-old/x and {data}2/y"
    assert hide("no paths here, a/b is a ratio") == "no paths here, a/b is a ratio"


def test_a_kernel_run_dir_is_hidden_wherever_the_run_root_is(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, kernels={"run_root": str(tmp_path / "runtime")})
    run_dir = tmp_path / "runtime" / f"threadbook-{os.getuid()}" / "kernel-0123456789ab"
    hide = HostPaths.of(settings).hide
    assert hide(f"see {run_dir}/kernel.log") == "see <run>/kernel.log"
    default = HostPaths.of(make_settings(tmp_path))
    for parent in ("/dev/shm", tempfile.gettempdir()):  # either may hold them when run_root is unset
        assert default.hide(f"{parent}/threadbook-{os.getuid()}/kernel-0123456789ab/kernel.json") == "<run>/kernel.json"
