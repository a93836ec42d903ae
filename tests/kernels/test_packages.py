"""Packages on demand: the name mapping, the allow-list, and real installs (uv, offline wheels)
that a running kernel from the kernel environment then imports."""

from __future__ import annotations

import asyncio
import io
import os
import stat
import sys
import tarfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_asyncio

from kernels import KernelPool, Outcome, build_launcher
from kernels.host.packages import (
    STAGING,
    PackageInstaller,
    Verdict,
    distribution_for,
    installed_distributions,
    installer_environment,
    installer_error,
    missing_module,
)
from kernels.local.launcher import KernelLauncher
from kernels.seam.result import ErrorInfo
from kernels.seam.settings import PackageSettings
from tests.fakes.wheels import make_wheel
from tests.kernels.conftest import kernel_settings

in_module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    make_wheel(folder, "tbdemo", "1.2.3")
    make_wheel(folder, "tbother", "1.0")
    make_wheel(folder, "tbfirst", "1.0")
    make_wheel(folder, "tbsecond", "1.0")
    make_wheel(
        folder, "tbnum", "2.0", code="import numpy\nTOTAL = int(numpy.arange(5).sum())\n", requires=("numpy>=1",)
    )
    make_wheel(folder, "tbfuture", "1.0", requires=("numpy>=99",))
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def launched(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[KernelPool, KernelLauncher]]:
    root = tmp_path_factory.mktemp("packages")
    settings = kernel_settings(root)
    launcher = await asyncio.to_thread(build_launcher, settings)
    kernel_pool = KernelPool(settings, launcher=launcher)
    yield kernel_pool, launcher
    await kernel_pool.shutdown_all()


def installer(launcher: KernelLauncher, links: Path, **overrides: Any) -> PackageInstaller:
    values: dict[str, Any] = {
        "allow": ("tbdemo", "tbfirst", "tbsecond", "tbnum", "tbfuture", "tbmissing"),
        "find_links": (str(links),),
        "no_index": True,
    }
    values.update(overrides)
    return PackageInstaller(
        PackageSettings(**values), python=launcher.spawner.python, target=launcher.spawner.packages_dir
    )


def test_import_names_map_to_their_distributions() -> None:
    assert distribution_for("sklearn") == "scikit-learn"
    assert distribution_for("cv2") == "opencv-python-headless"
    assert distribution_for("PIL") == "pillow"
    assert distribution_for("yaml") == "pyyaml"
    assert distribution_for("bs4") == "beautifulsoup4"
    assert distribution_for("dateutil") == "python-dateutil"
    assert distribution_for("Some_Module") == "some-module"  # no mismatch: the name itself, canonical


def test_only_a_missing_top_level_module_counts() -> None:
    def error(ename: str, evalue: str) -> ErrorInfo:
        return ErrorInfo(ename=ename, evalue=evalue, traceback="")

    assert missing_module(error("ModuleNotFoundError", "No module named 'sklearn'")) == "sklearn"
    assert missing_module(error("ModuleNotFoundError", "No module named 'pandas.nothing'")) is None
    assert missing_module(error("ImportError", "cannot import name 'x' from 'os'")) is None
    assert missing_module(error("ModuleNotFoundError", "No module named 'not valid'")) is None
    assert missing_module(None) is None


def test_allow_list_compares_canonical_names(tmp_path: Path) -> None:
    settings = PackageSettings(allow=("Scikit_Learn",))
    fake = installer_for_names(settings, tmp_path)
    assert fake.allowed("scikit-learn") and fake.allowed("scikit.learn")
    assert not fake.allowed("pyyaml")
    assert not installer_for_names(PackageSettings(), tmp_path).allowed("scikit-learn")  # empty: none


def installer_for_names(settings: PackageSettings, folder: Path) -> PackageInstaller:
    from kernels.host.interpreter import KernelPython

    return PackageInstaller(settings, python=KernelPython(Path(sys.executable), (), (3, 11)), target=folder)


def test_installer_errors_are_one_line() -> None:
    output = (
        "Using CPython 3.11.7 interpreter at: /x/python\n"
        "error: Request failed after 3 retries in 11.2s\n"
        "  cause: Failed to fetch: http://127.0.0.1:9/simple/x/\n"
        "  cause: Connection refused (os error 111)\n"
    )
    assert installer_error(output, 2) == "Request failed after 3 retries in 11.2s; Connection refused (os error 111)"
    assert installer_error("", 3) == "the installer exited with status 3"
    leaky = "error: Failed to fetch: https://me:s3cret@pypi.example/simple/x/"
    assert installer_error(leaky, 2) == "Failed to fetch: https://***@pypi.example/simple/x/"
    assert len(installer_error("error: " + "x" * 1000, 1)) <= 300


@in_module_loop
async def test_missing_module_is_installed_and_the_code_then_runs(
    launched: tuple[KernelPool, KernelLauncher], links: Path
) -> None:
    pool, launcher = launched
    session = await pool.get_or_start("t:install")
    await session.execute("before = 'kept'")
    failed = await session.execute("import tbdemo\nprint('value', tbdemo.VALUE)")
    assert failed.outcome is Outcome.ERROR and (module := missing_module(failed.error)) == "tbdemo"

    outcome = await installer(launcher, links).provide(module)

    assert outcome.verdict is Verdict.INSTALLED and outcome.version == "1.2.3" and outcome.rerun
    assert outcome.thread_note() == "📦 Installed tbdemo 1.2.3 for this code."
    again = await session.execute("import tbdemo\nprint('value', tbdemo.VALUE, before)")
    assert again.ok and again.stdout == "value 42 kept\n"  # the same kernel, variables kept
    assert installed_distributions(launcher.spawner.packages_dir) == {"tbdemo": "1.2.3"}
    assert list((launcher.spawner.packages_dir / STAGING).iterdir()) == []  # nothing half-done left
    # Another thread's kernel (started before or after) sees it too, and a second ask installs nothing.
    other = await pool.get_or_start("t:install-2")
    assert (await other.execute("import tbdemo; tbdemo.VALUE")).result == "42"
    assert (await installer(launcher, links).provide("tbdemo")).verdict is Verdict.AVAILABLE


@in_module_loop
async def test_dependency_the_kernel_environment_has_is_not_installed_again(
    launched: tuple[KernelPool, KernelLauncher], links: Path
) -> None:
    pool, launcher = launched
    outcome = await installer(launcher, links).provide("tbnum")  # needs numpy; no numpy wheel offline
    assert outcome.verdict is Verdict.INSTALLED, outcome.detail
    assert "numpy" not in installed_distributions(launcher.spawner.packages_dir)
    assert not (launcher.spawner.packages_dir / "numpy").exists()
    session = await pool.get_or_start("t:dependency")
    assert (await session.execute("import tbnum; tbnum.TOTAL")).result == "10"


@in_module_loop
async def test_requirement_the_kernel_environment_does_not_meet_is_refused(
    launched: tuple[KernelPool, KernelLauncher], links: Path
) -> None:
    _, launcher = launched
    outcome = await installer(launcher, links).provide("tbfuture")
    assert outcome.verdict is Verdict.FAILED and not outcome.rerun
    assert "tbfuture needs numpy>=99, but the kernels have numpy" in outcome.detail
    assert "tbfuture" not in installed_distributions(launcher.spawner.packages_dir)
    assert not (launcher.spawner.packages_dir / "tbfuture").exists()


@in_module_loop
async def test_module_off_the_allow_list_is_refused_and_nothing_is_installed(
    launched: tuple[KernelPool, KernelLauncher], links: Path
) -> None:
    _, launcher = launched
    outcome = await installer(launcher, links).provide("tbother")  # its wheel is there, but not allowed
    assert outcome.verdict is Verdict.NOT_ALLOWED and not outcome.rerun
    assert "not on the allow-list" in outcome.model_note() and "Do without it" in outcome.model_note()
    assert outcome.thread_note() is None
    assert not (launcher.spawner.packages_dir / "tbother").exists()
    assert "tbother" not in installed_distributions(launcher.spawner.packages_dir)


@in_module_loop
async def test_two_installs_at_once_run_one_after_the_other(
    launched: tuple[KernelPool, KernelLauncher], links: Path, tmp_path: Path
) -> None:
    _, launcher = launched
    log = tmp_path / "installs.log"
    shim = tmp_path / "python"  # the bot's python, noting when each install starts and ends
    shim.write_text(
        "#!/bin/sh\n"
        'if [ "$4" = install ]; then\n'
        f'  echo "start $(date +%s.%N)" >> {log}; sleep 0.5\n'
        f'  {sys.executable} "$@"; rc=$?\n'
        f'  echo "end $(date +%s.%N)" >> {log}; exit $rc\n'
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    shared = installer(launcher, links)
    shared.bot_python = shim

    first, second = await asyncio.gather(shared.provide("tbfirst"), shared.provide("tbsecond"))

    assert first.verdict is second.verdict is Verdict.INSTALLED
    events = [line.split() for line in log.read_text().splitlines()]
    assert [kind for kind, _ in events] == ["start", "end", "start", "end"]  # never two at once
    assert float(events[2][1]) >= float(events[1][1])


@in_module_loop
async def test_install_without_a_matching_wheel_is_one_note_and_the_kernel_still_works(
    launched: tuple[KernelPool, KernelLauncher], links: Path
) -> None:
    pool, launcher = launched
    session = await pool.get_or_start("t:no-wheel")
    failed = await session.execute("import tbmissing")
    assert missing_module(failed.error) == "tbmissing"

    outcome = await installer(launcher, links).provide("tbmissing")

    assert outcome.verdict is Verdict.FAILED and not outcome.rerun
    assert "tbmissing" in outcome.detail and "\n" not in outcome.detail
    assert outcome.thread_note() == f"⚠️ Could not install tbmissing: {outcome.detail}"
    assert "installing tbmissing failed" in outcome.model_note()
    assert (await session.execute("1 + 1")).result == "2"
    assert list((launcher.spawner.packages_dir / STAGING).iterdir()) == []


@in_module_loop
async def test_install_past_its_timeout_is_stopped_and_the_kernel_still_works(
    launched: tuple[KernelPool, KernelLauncher], links: Path
) -> None:
    pool, launcher = launched
    session = await pool.get_or_start("t:timeout")
    # Nothing listens on port 9: uv retries for over 10 s, far past the 2 s allowed.
    slow = installer(launcher, links, no_index=False, find_links=(), index_url="http://127.0.0.1:9/simple", timeout_s=2)
    started = time.monotonic()

    outcome = await slow.provide("tbmissing")

    elapsed = time.monotonic() - started
    assert outcome.verdict is Verdict.FAILED
    assert outcome.detail == "the install took longer than 2 s and was stopped"
    assert elapsed < 9, elapsed
    assert not [p for p in psutil.Process().children(recursive=True) if "uv" in " ".join(_cmdline(p))]
    assert (await session.execute("2 + 2")).result == "4"
    assert list((launcher.spawner.packages_dir / STAGING).iterdir()) == []


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_packages_folder_is_readable_by_everyone(launched: tuple[KernelPool, KernelLauncher]) -> None:
    # Sandboxed kernels may run as other uids: what was moved in must be world-readable.
    _, launcher = launched
    for folder, _dirs, files in os.walk(launcher.spawner.packages_dir):
        if STAGING in Path(folder).parts:
            continue
        for name in files:
            assert os.stat(Path(folder) / name).st_mode & stat.S_IROTH, name


@in_module_loop
async def test_sandboxed_kernel_sees_an_install_made_after_it_started_and_cannot_change_it(
    tmp_path: Path, links: Path
) -> None:
    from tests.security.conftest import SKIP_REASON

    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    settings = kernel_settings(tmp_path, sandbox="bwrap")
    launcher = await asyncio.to_thread(build_launcher, settings)
    sandboxed = KernelPool(settings, launcher=launcher)
    try:
        session = await sandboxed.get_or_start("t:sandboxed")
        assert missing_module((await session.execute("import tbdemo")).error) == "tbdemo"

        outcome = await installer(launcher, links).provide("tbdemo")

        assert outcome.verdict is Verdict.INSTALLED, outcome.detail
        assert (await session.execute("import tbdemo; tbdemo.__file__, tbdemo.VALUE")).result == (
            "('/packages/tbdemo/__init__.py', 42)"
        )
        denied = await session.execute("open('/packages/tbdemo/__init__.py', 'a')")
        assert denied.error is not None and denied.error.ename in ("OSError", "PermissionError")
    finally:
        await sandboxed.shutdown_all()


def _sdist(folder: Path, name: str, marker: Path) -> None:
    """A source distribution with an in-tree build backend (no download needed) whose first
    hook writes ``marker`` with the environment it saw."""
    backend = (
        "import json, os\n"
        "def _ran():\n"
        f"    open({str(marker)!r}, 'w').write(json.dumps(dict(os.environ)))\n"
        "def get_requires_for_build_wheel(config_settings=None):\n    _ran()\n    return []\n"
        "def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):\n    _ran()\n    raise RuntimeError('no')\n"
        "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n    _ran()\n    raise RuntimeError('no')\n"
    )
    pyproject = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    files = {"backend.py": backend, "pyproject.toml": pyproject, "PKG-INFO": pkg_info}
    with tarfile.open(folder / f"{name}-1.0.tar.gz", "w:gz") as archive:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-1.0/{path}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_the_installer_never_sees_the_bots_secrets() -> None:
    bot = {
        "SLACK_BOT_TOKEN": "xoxb-canary",
        "OPENAI_API_KEY": "sk-canary",
        "PATH": "/usr/bin",
        "HTTPS_PROXY": "http://proxy:3128",
        "UV_INDEX_URL": "https://mirror/simple",
    }
    env = installer_environment(bot)
    assert "SLACK_BOT_TOKEN" not in env and "OPENAI_API_KEY" not in env
    assert env["PATH"] == "/usr/bin" and env["HTTPS_PROXY"] and env["UV_INDEX_URL"]


@in_module_loop
async def test_a_source_distribution_is_never_built_on_the_bots_side(
    launched: tuple[KernelPool, KernelLauncher], tmp_path: Path
) -> None:
    """Building an sdist would run the package's own code in the bot's process tree: only
    wheels are installed."""
    _, launcher = launched
    links = tmp_path / "sdists"
    links.mkdir()
    marker = tmp_path / "built.json"
    _sdist(links, "tbsource", marker)

    outcome = await installer(launcher, links, allow=("tbsource",)).provide("tbsource")

    assert outcome.verdict is Verdict.FAILED and "tbsource" in outcome.detail
    assert not marker.exists(), "the package's setup.py ran on the bot's side"
