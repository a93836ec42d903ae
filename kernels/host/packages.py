"""Packages on demand: a module that is not installed, mapped to its distribution and, when the
allow-list has it, installed into the one shared folder every kernel sees read-only.

Kernels have no network and a read-only view of the folder, so installs run here, on the bot's
side: ``<bot python> -m uv pip install --python <kernel python> --target <staging>``. Installs
are serialised (one :class:`asyncio.Lock`), stopped after ``timeout_s`` and fail with one line.

Kernels never see a half-installed package: uv writes into a staging folder inside the shared
one (a dot-name, so nothing in it is importable), and only a complete install is moved in,
entry by entry with ``rename`` (code first, the ``.dist-info`` folders that mark a
distribution as installed last). Distributions the kernel environment or the shared folder
already has are left out of the resolution (``--excludes``), so a package that needs
``numpy`` uses the kernel environment's numpy (checked against its requirement) instead of
downloading another copy that the environment's would shadow anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import email.parser
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement

from kernels.host.interpreter import KernelPython
from kernels.seam.result import ErrorInfo
from kernels.seam.settings import PackageSettings

log = logging.getLogger(__name__)

#: Import names whose distribution is called something else (the common mismatches).
IMPORT_TO_DISTRIBUTION: dict[str, str] = {
    "sklearn": "scikit-learn",
    "skimage": "scikit-image",
    "cv2": "opencv-python-headless",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "bs4": "beautifulsoup4",
    "dateutil": "python-dateutil",
    "docx": "python-docx",
    "pptx": "python-pptx",
    "dotenv": "python-dotenv",
    "slugify": "python-slugify",
    "Crypto": "pycryptodome",
    "OpenSSL": "pyopenssl",
    "jwt": "pyjwt",
    "serial": "pyserial",
    "attr": "attrs",
    "fitz": "pymupdf",
    "Bio": "biopython",
    "zmq": "pyzmq",
    "dns": "dnspython",
    "psycopg2": "psycopg2-binary",
    "MySQLdb": "mysqlclient",
    "pdfminer": "pdfminer.six",
    "tabula": "tabula-py",
    "odf": "odfpy",
    "umap": "umap-learn",
    "community": "python-louvain",
    "Levenshtein": "levenshtein",
    "magic": "python-magic",
    "osgeo": "gdal",
    "mpl_toolkits": "matplotlib",
}
#: The installer's environment: what it needs to reach an index (proxies, certificates, uv's
#: own settings), never the rest of the bot's (its tokens).
_INSTALLER_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "XDG_CACHE_HOME",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
    }
)


def installer_environment(bot_environment: Mapping[str, str]) -> dict[str, str]:
    """The installer's environment: only what it needs from the bot's."""
    env = {name: value for name, value in bot_environment.items() if name in _INSTALLER_ENV or name.startswith("UV_")}
    env.update(UV_NO_PROGRESS="1", NO_COLOR="1")
    return env


#: The staging folders of installs under way live here, inside the shared folder (one
#: file system, so the move is a rename); the dot keeps them out of any import.
STAGING = ".staging"
#: The most of the installer's error output one note carries.
MAX_ERROR_CHARS = 300
_MISSING = re.compile(r"^No module named '([^']+)'")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: ``user:token@`` in an index URL: never repeated into a chat thread.
_CREDENTIALS = re.compile(r"//[^/@\s]+@")


def canonical(name: str) -> str:
    """A distribution name as the package index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_for(module: str) -> str:
    """The distribution that provides the top-level import ``module`` (canonical name)."""
    return canonical(IMPORT_TO_DISTRIBUTION.get(module, module))


def missing_module(error: ErrorInfo | None) -> str | None:
    """The top-level module whose absence ``error`` reports, or None.

    Only a ``ModuleNotFoundError`` for a top-level name counts: ``No module named 'a.b'``
    means ``a`` was found, so installing something would not help.
    """
    if error is None or error.ename != "ModuleNotFoundError":
        return None
    found = _MISSING.match(error.evalue)
    if found is None or not _IDENTIFIER.match(found.group(1)):
        return None
    return found.group(1)


class Verdict(str, Enum):
    """What became of a missing module."""

    INSTALLED = "installed"  # installed just now: run the code again
    AVAILABLE = "available"  # installed on demand before (another thread): run the code again
    IN_ENVIRONMENT = "in_environment"  # the kernel environment has it: the import fails for another reason
    NOT_ALLOWED = "not_allowed"  # not on the allow-list
    FAILED = "failed"  # the install failed (index, resolution, timeout)


@dataclass(frozen=True)
class PackageOutcome:
    """The answer to one missing module."""

    module: str
    distribution: str
    verdict: Verdict
    version: str | None = None
    #: One line saying why an install failed.
    detail: str = ""

    @property
    def rerun(self) -> bool:
        """Whether the failed code should run again (the package is there now)."""
        return self.verdict in (Verdict.INSTALLED, Verdict.AVAILABLE)

    @property
    def label(self) -> str:
        """``scikit-learn 1.5.2`` (the version when known)."""
        return f"{self.distribution} {self.version}" if self.version else self.distribution

    def model_note(self) -> str:
        """What the model is told (the re-run's notice, or the failed result's)."""
        if self.verdict is Verdict.INSTALLED:
            return f"Module '{self.module}' was missing, so {self.label} was installed and the code ran again."
        if self.verdict is Verdict.AVAILABLE:
            return f"{self.label} (module '{self.module}') was installed on demand earlier; the code ran again."
        if self.verdict is Verdict.IN_ENVIRONMENT:
            return (
                f"{self.label} is installed in the kernel environment, yet importing '{self.module}' failed; "
                "nothing was installed."
            )
        if self.verdict is Verdict.NOT_ALLOWED:
            return (
                f"Module '{self.module}' is not available: its package {self.distribution} is not on the "
                "allow-list of packages this bot may install, so it cannot be installed here. "
                "Do without it, with the libraries that are installed."
            )
        return (
            f"Module '{self.module}' is not available: installing {self.distribution} failed ({self.detail}). "
            "Do without it, with the libraries that are installed."
        )

    def thread_note(self) -> str | None:
        """The short line the thread gets, or None (nothing worth telling the people)."""
        if self.verdict is Verdict.INSTALLED:
            return f"📦 Installed {self.label} for this code."
        if self.verdict is Verdict.FAILED:
            return f"⚠️ Could not install {self.distribution}: {self.detail}"
        return None


class PackageInstaller:
    """Decides about missing modules and installs allowed distributions, one at a time."""

    def __init__(
        self, settings: PackageSettings, *, python: KernelPython, target: Path, bot_python: Path | None = None
    ) -> None:
        """``python``: the kernel interpreter installs are for; ``target``: the shared folder
        (the launcher's ``packages_dir``); ``bot_python``: the interpreter that has uv
        (default: this one)."""
        self.settings = settings
        self.python = python
        self.target = target
        self.bot_python = bot_python or Path(sys.executable)
        self._allowed = frozenset(canonical(name) for name in settings.allow)
        self._lock = asyncio.Lock()
        self._environment: dict[str, str] | None = None
        self._swept = False

    def allowed(self, distribution: str) -> bool:
        """Whether ``distribution`` is on the allow-list."""
        return canonical(distribution) in self._allowed

    async def provide(self, module: str) -> PackageOutcome:
        """Make ``module`` importable if the allow-list lets it be: install its distribution
        into the shared folder (waiting for any install under way first). Never raises for a
        failed install: the outcome says so."""
        distribution = distribution_for(module)
        if not self.allowed(distribution):
            return PackageOutcome(module, distribution, Verdict.NOT_ALLOWED)
        async with self._lock:
            environment = await self._environment_distributions()
            if (version := environment.get(distribution)) is not None:
                return PackageOutcome(module, distribution, Verdict.IN_ENVIRONMENT, version)
            shared = await asyncio.to_thread(installed_distributions, self.target)
            if (version := shared.get(distribution)) is not None:
                return PackageOutcome(module, distribution, Verdict.AVAILABLE, version)
            error, version = await self._install(distribution, {**shared, **environment})
        if error is not None:
            log.warning("installing %s for %r failed: %s", distribution, module, error)
            return PackageOutcome(module, distribution, Verdict.FAILED, detail=error)
        log.info("installed %s %s for %r into %s", distribution, version, module, self.target)
        return PackageOutcome(module, distribution, Verdict.INSTALLED, version)

    async def _install(self, distribution: str, present: dict[str, str]) -> tuple[str | None, str | None]:
        """(Holding the lock) install ``distribution`` into a staging folder and move it in:
        (None, version), or (one-line error, None)."""
        staging_root = self.target / STAGING
        if not self._swept:  # what an install cut off by a crash left behind
            await asyncio.to_thread(shutil.rmtree, staging_root, True)
            self._swept = True
        await asyncio.to_thread(staging_root.mkdir, parents=True, exist_ok=True)
        staging = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="install-", dir=staging_root))
        try:
            excludes = staging / "excludes.txt"
            site = staging / "site"
            await asyncio.to_thread(excludes.write_text, "".join(f"{name}\n" for name in sorted(present)))
            error = await self._run_installer(distribution, site, excludes)
            if error is None:
                error = await asyncio.to_thread(unmet_requirement, site, present, self.python.version)
            if error is not None:
                return error, None
            return None, await asyncio.to_thread(move_in, site, self.target, distribution)
        except OSError as exc:
            return f"could not write the packages folder: {exc}", None
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)

    def _command(self, distribution: str, site: Path, excludes: Path) -> list[str]:
        settings = self.settings
        # Distributions the kernels have already (``excludes``) stay out of the resolution:
        # kernels import them from where they are (their versions are checked afterwards).
        command = [
            str(self.bot_python),
            "-m",
            "uv",
            "pip",
            "install",
            "--no-config",
            "--quiet",
            "--python",
            str(self.python.executable),
            "--target",
            str(site),
            "--excludes",
            str(excludes),
            "--link-mode",
            "copy",
            "--compile-bytecode",
            # Wheels only: building a source distribution would run the package's own code here,
            # in the bot's process tree, next to its secrets.
            "--no-build",
        ]
        if settings.index_url:
            command += ["--index-url", settings.index_url]
        for link in settings.find_links:
            command += ["--find-links", link]
        if settings.no_index:
            command.append("--no-index")
        return [*command, distribution]

    async def _run_installer(self, distribution: str, site: Path, excludes: Path) -> str | None:
        """Run uv, stopped (its whole process group) after ``timeout_s``: None when it worked,
        else one line."""
        timeout = self.settings.timeout_s
        env = installer_environment(os.environ)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._command(distribution, site, excludes),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return f"the installer did not start: {exc}"
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except (TimeoutError, asyncio.CancelledError) as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            if isinstance(exc, asyncio.CancelledError):
                raise
            return f"the install took longer than {timeout:g} s and was stopped"
        if proc.returncode != 0:
            return installer_error(output.decode(errors="replace"), proc.returncode)
        return None

    async def _environment_distributions(self) -> dict[str, str]:
        """The kernel environment's distributions (canonical name → version), asked once."""
        if self._environment is None:
            listed = await self._list_environment()
            if not listed:
                log.warning("could not list the kernel environment's packages; installs exclude none of them")
                return {}  # not cached: asked again next time
            self._environment = {canonical(d["name"]): str(d["version"]) for d in listed}
        return self._environment

    async def _list_environment(self) -> list[dict[str, str]]:
        """``uv pip list`` of the kernel interpreter, or [] when it cannot be had."""
        command = [
            str(self.bot_python),
            "-m",
            "uv",
            "pip",
            "list",
            "--no-config",
            "--format",
            "json",
            "--python",
            str(self.python.executable),
        ]
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
        except OSError:
            return []
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.settings.timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            if isinstance(exc, asyncio.CancelledError):
                raise
            return []
        try:
            listed = json.loads(out) if proc.returncode == 0 else []
        except ValueError:
            return []
        return [d for d in listed if isinstance(d, dict) and "name" in d and "version" in d]


def installer_error(output: str, returncode: int | None) -> str:
    """One line out of uv's error output: its ``error:`` line and the last ``cause:``."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    error = next((line.removeprefix("error:").strip() for line in lines if line.startswith("error:")), "")
    causes = [line.removeprefix("cause:").strip() for line in lines if line.startswith("cause:")]
    text = "; ".join(filter(None, [error, causes[-1] if causes else ""])) or (lines[-1] if lines else "")
    text = _CREDENTIALS.sub("//***@", text) or f"the installer exited with status {returncode}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def installed_distributions(folder: Path) -> dict[str, str]:
    """(Blocking) the distributions installed in ``folder`` (canonical name → version)."""
    found: dict[str, str] = {}
    try:
        entries = list(folder.iterdir())
    except OSError:
        return found
    for entry in entries:
        if entry.name.endswith(".dist-info") and (meta := _metadata(entry)) is not None:
            found[canonical(meta[0])] = meta[1]
    return found


def _metadata(dist_info: Path) -> tuple[str, str] | None:
    """(Blocking) (name, version) from a ``.dist-info`` folder's METADATA, or None."""
    try:
        text = (dist_info / "METADATA").read_text(errors="replace")
    except OSError:
        return None
    headers = email.parser.HeaderParser().parsestr(text)
    name, version = headers.get("Name"), headers.get("Version")
    return (str(name), str(version)) if name and version else None


def move_in(site: Path, target: Path, distribution: str) -> str | None:
    """(Blocking) move a finished install from ``site`` into ``target`` and return the
    version of ``distribution`` it holds.

    Whole entries are renamed: dependencies first, then the package itself, then the
    ``.dist-info`` folders, so whatever a kernel imports in between finds what it needs, or
    nothing. A folder that exists already (a namespace package, ``bin``) is merged; a file
    that exists already is kept.
    """
    version = None
    own: set[str] = set()  # the top-level entries of ``distribution`` itself
    for dist_info in site.glob("*.dist-info"):
        meta = _metadata(dist_info)
        if meta is not None and canonical(meta[0]) == distribution:
            version = meta[1]
            own = {Path(relative).parts[0] for relative in _record(dist_info) if Path(relative).parts}
    entries = sorted(
        (e for e in site.iterdir() if e.name != ".lock"), key=lambda e: (e.name.endswith(".dist-info"), e.name in own)
    )
    for entry in entries:
        _merge(entry, target / entry.name)
    return version


def _record(dist_info: Path) -> list[str]:
    """(Blocking) the paths a ``.dist-info`` folder's RECORD lists (relative to the install)."""
    try:
        record = (dist_info / "RECORD").read_text(errors="replace")
    except OSError:
        return []
    return [row[0] for row in csv.reader(record.splitlines()) if row and row[0]]


def unmet_requirement(site: Path, present: dict[str, str], python_version: tuple[int, int]) -> str | None:
    """(Blocking) one line naming a requirement of what was installed into ``site`` that the
    version the kernels already have (``present``, left out of the install) does not meet,
    or None."""
    major, minor = python_version
    environment = {"python_version": f"{major}.{minor}", "python_full_version": f"{major}.{minor}.0"}
    for dist_info in site.glob("*.dist-info"):
        try:
            text = (dist_info / "METADATA").read_text(errors="replace")
        except OSError:
            continue
        headers = email.parser.HeaderParser().parsestr(text)
        for line in headers.get_all("Requires-Dist") or []:
            try:
                requirement = Requirement(str(line))
                if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": ""}):
                    continue
            except (InvalidRequirement, UndefinedEnvironmentName):
                continue
            have = present.get(canonical(requirement.name))
            if have is not None and not requirement.specifier.contains(have, prereleases=True):
                return (
                    f"{headers.get('Name')} needs {requirement.name}{requirement.specifier}, "
                    f"but the kernels have {requirement.name} {have}"
                )
    return None


def _merge(source: Path, destination: Path) -> None:
    """Rename ``source`` to ``destination``; merge into a folder that exists, keep a file that does."""
    if not os.path.lexists(destination):
        os.rename(source, destination)
        return
    if source.is_dir() and not source.is_symlink() and destination.is_dir() and not destination.is_symlink():
        for child in sorted(source.iterdir(), key=lambda e: e.name.endswith(".dist-info")):
            _merge(child, destination / child.name)
