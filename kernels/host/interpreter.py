"""The kernel interpreter: the Python environment kernels run from, separate from the bot's.

``kernels.python`` names it (default: ``.venv-kernel/bin/python``, which ``make`` and the
Dockerfile build from ``kernels/requirements.txt``). :func:`inspect_interpreter` asks it once
where it lives, so the launchers can start it and the sandbox can show its folders (and
nothing of the bot's own environment) to the kernel.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kernels.seam.result import KernelStartError

INSPECT_TIMEOUT_S = 30.0
#: Printed by the interpreter: where it is installed and whether ipykernel is there.
_INSPECT = (
    "import importlib.util as u, json, os, sys; print(json.dumps({"
    "'prefixes': [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix], "
    "'real': os.path.realpath(sys.executable), 'version': list(sys.version_info[:2]), "
    "'ipykernel': u.find_spec('ipykernel') is not None}))"
)
HOW_TO_BUILD = "build it with `make kernel-env` (or point kernels.python at a Python with ipykernel)"


@dataclass(frozen=True)
class KernelPython:
    """Where the kernel interpreter lives."""

    #: The interpreter as configured, absolute, symlinks kept (a venv is found through its path).
    executable: Path
    #: The folders its stdlib and packages live in, outside ``/usr``, none inside another
    #: (what the sandbox binds read-only).
    dirs: tuple[Path, ...]
    version: tuple[int, int]

    @property
    def bin_dir(self) -> Path:
        """The folder of its scripts (first on the kernel's ``PATH``)."""
        return self.executable.parent


@functools.lru_cache(maxsize=8)
def inspect_interpreter(executable: Path) -> KernelPython:
    """(Blocking, once per path) run ``executable`` to learn where it lives; raises
    :class:`KernelStartError` saying how to fix a missing or unusable interpreter."""
    path = Path(os.path.abspath(executable))
    if not os.access(path, os.X_OK):
        raise KernelStartError(f"kernels.python: no kernel interpreter at {path}; {HOW_TO_BUILD}")
    try:
        done = subprocess.run(
            [str(path), "-I", "-c", _INSPECT], capture_output=True, text=True, timeout=INSPECT_TIMEOUT_S, env={}
        )
        found = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise KernelStartError(f"kernels.python: {path} does not run: {exc}") from exc
    if not found["ipykernel"]:
        raise KernelStartError(f"kernels.python: {path} has no ipykernel; {HOW_TO_BUILD}")
    candidates = {Path(p) for p in found["prefixes"]} | {Path(found["real"]).parent.parent}
    candidates |= {Path(os.path.realpath(p)) for p in candidates}
    usr = Path("/usr")
    roots = sorted(p for p in candidates if p != usr and usr not in p.parents and p.exists())
    dirs = tuple(p for p in roots if not any(other in p.parents for other in roots))
    major, minor = found["version"]
    return KernelPython(executable=path, dirs=dirs, version=(major, minor))
