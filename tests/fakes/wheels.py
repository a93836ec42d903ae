"""Tiny valid wheels written by hand, for offline installs (``find_links`` + ``no_index``)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    folder: Path, name: str, version: str, *, code: str = "VALUE = 42\n", requires: tuple[str, ...] = ()
) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` into ``folder``: one module ``name`` whose
    ``__init__.py`` is ``code``, depending on ``requires``; returns its path."""
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    files = {
        f"{name}/__init__.py": code.encode(),
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: threadbook-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},{_hash(data)},{len(data)}" for path, data in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel
