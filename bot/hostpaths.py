"""Host paths kept out of what people see: posted texts and exported notebooks.

A traceback, a warning or an answer quoting one names where things live on the server: the
kernels' and the bot's virtual environments, the Python installation, Threadbook's own
folder, the workspace root, the shared packages folder, channel data folders and kernel run
folders. :meth:`HostPaths.hide` rewrites each as what a kernel sees or a neutral name:
``…/site-packages/pandas/core/frame.py``, ``/workspace/sales.csv``, ``/packages``,
``/data``, ``<venv>``, ``<python>``, ``<threadbook>``, ``<run>``. Pure string work, no I/O.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bot.config import Settings
from kernels import possible_run_parents

#: The code folder holding ``bot/``: Threadbook's own installation.
_CODE_DIR = Path(__file__).resolve().parent.parent
#: System prefixes that name nothing about this server.
_COMMON_PREFIXES = frozenset({"/", "/usr", "/usr/local"})


@dataclass(frozen=True, slots=True)
class HostPaths:
    """Rewrites host paths in text (see the module docstring); rules apply in order."""

    rules: tuple[tuple[re.Pattern[str], str], ...] = ()

    @classmethod
    def of(cls, settings: Settings) -> HostPaths:
        """The host paths of this configuration and of this process."""
        kernels = settings.kernels
        venvs = [_parent_of_bin(kernels.python), sys.prefix, sys.exec_prefix]
        pythons = [p for p in (sys.base_prefix, sys.base_exec_prefix) if p not in _COMMON_PREFIXES]
        run_roots = [os.path.join(parent, "threadbook-") for parent in possible_run_parents(kernels.run_root)]
        rules: list[tuple[str, str]] = []
        for prefix in _unique(venvs + pythons):
            rules.append((re.escape(prefix) + r"/lib/python[\d.]+/(site|dist)-packages(?=/)", r"…/\1-packages"))
        rules += [(re.escape(p), "<venv>") for p in _unique(venvs) if p not in _COMMON_PREFIXES]
        rules += [(re.escape(p), "<python>") for p in _unique(pythons)]
        rules.append((re.escape(_abs(kernels.workspace_root)) + r"/[^/\s'\"]+", "/workspace"))
        rules.append((re.escape(_abs(kernels.workspace_root)), "<workspaces>"))
        rules.append((re.escape(_abs(kernels.packages.dir)), "/packages"))
        rules += [(re.escape(_abs(c.data_dir)), "/data") for c in settings.channels.values() if c.data_dir is not None]
        rules += [(re.escape(run_root) + r"\d+(?:/[^/\s'\"]+)?", "<run>") for run_root in run_roots]
        rules.append((re.escape(str(_CODE_DIR)), "<threadbook>"))
        return cls(tuple((re.compile(pattern + r"(?![\w.-])"), shown) for pattern, shown in rules))

    def hide(self, text: str) -> str:
        """``text`` with every host path this knows rewritten."""
        if "/" not in text:
            return text
        for pattern, shown in self.rules:
            text = pattern.sub(shown, text)
        return text


def _abs(path: Path) -> str:
    return os.path.abspath(path)


def _parent_of_bin(python: Path) -> str:
    """The environment of an interpreter path (``…/venv/bin/python`` → ``…/venv``)."""
    absolute = Path(_abs(python))
    return str(absolute.parent.parent if absolute.parent.name == "bin" else absolute.parent)


def _unique(paths: Iterable[str]) -> list[str]:
    """Longest first, so a path inside another is rewritten before its parent."""
    return sorted({p.rstrip("/") or "/" for p in paths if p}, key=len, reverse=True)
