"""podman for the container tests: the settings that work on a root CI machine without a
daemon (runc, cgroupfs, no rlimit raising), a stand-in base image made with mmdebstrap where
no registry can be pulled from, and the repository's images built from the working tree."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Built from the working tree; removed when the tests end.
IMAGE = "localhost/threadbook-ci:test"
STANDIN = "localhost/threadbook-ci-base:bookworm"
#: A base image to build on instead of the stand-in (python:3.12-slim where it can be pulled).
BASE_ENV = "THREADBOOK_TEST_BASE_IMAGE"
SECCOMP = REPO / "deploy" / "container" / "seccomp.json"
#: The flags docs/security.md documents for the image (the seccomp profile, /proc unmasked).
SANDBOX_FLAGS = ("--security-opt", f"seccomp={SECCOMP}", "--security-opt", "systempaths=unconfined")
#: The stand-in: Debian's Python (3.11) where python:3.*-slim keeps its own, pip usable, and
#: the host's CA bundle (builds behind a TLS-inspecting proxy).
STANDIN_HOOK = (
    'ln -sf /usr/bin/python3 "$1/usr/local/bin/python3"; ln -sf /usr/bin/python3 "$1/usr/local/bin/python"; '
    'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED; '
    'cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"'
)


def skip_reason() -> str | None:
    """Why the container tests cannot run here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (.ci/run installs Debian's podman, buildah, runc, mmdebstrap)"
    if not os.environ.get(BASE_ENV) and shutil.which("mmdebstrap") is None:
        return f"no base image: install mmdebstrap (a stand-in is made with it) or set {BASE_ENV}"
    return None


@dataclass
class Podman:
    """The podman command line with this machine's settings."""

    root: Path
    made: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # In a containers.conf (podman-compose's podman reads it too): runc cannot raise
        # rlimits without CAP_SYS_RESOURCE, so no default ulimits; crun refuses the hybrid
        # cgroup layout of the CI machines, so runc where it is installed; no systemd.
        conf = self.root / "containers.conf"
        runtime = 'runtime = "runc"\n' if shutil.which("runc") else ""
        conf.write_text(f'[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\n{runtime}')
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        self.prefix = ["podman"]

    def run(self, *args: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """(Blocking) one podman command; raises with its output when it fails."""
        done = subprocess.run(
            [*self.prefix, *args], env=self.env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"podman {' '.join(args[:2])} failed ({done.returncode}): {(done.stdout + done.stderr)[-3000:]}"
            )
        return done

    async def run_async(self, *args: str, stdin: str = "", timeout: float = 300) -> tuple[int, str, str]:
        """One podman command on the event loop (the fakes it talks to answer meanwhile)."""
        process = await asyncio.create_subprocess_exec(
            *self.prefix,
            *args,
            env=self.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(stdin.encode()), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        return process.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    def base_image(self) -> str:
        """(Blocking) the base to build on: ``$THREADBOOK_TEST_BASE_IMAGE``, else a stand-in
        made with mmdebstrap (minbase, ~20 s)."""
        if base := os.environ.get(BASE_ENV):
            return base
        with tempfile.TemporaryDirectory(dir=self.root) as folder:
            rootfs = Path(folder) / "rootfs.tar"
            subprocess.run(
                [
                    "mmdebstrap",
                    "--quiet",
                    "--variant=minbase",
                    "--include=python3,python3-venv,python3-pip,ca-certificates",
                    f"--customize-hook={STANDIN_HOOK}",
                    "bookworm",
                    str(rootfs),
                ],
                check=True,
                capture_output=True,
                timeout=600,
            )
            self.run("import", str(rootfs), STANDIN)
        self.made.append(STANDIN)
        return STANDIN

    def build(self, tag: str, context: Path, *, base: str | None = None, containerfile: Path | None = None) -> None:
        """(Blocking) build ``context`` into ``tag`` without layer caching (nothing kept
        besides the image, which :meth:`remove_made` removes)."""
        args = ["build", "--isolation=chroot", "--network=host", "--layers=false", "--quiet", "-t", tag]
        if base is not None:
            args += ["--build-arg", f"BASE_IMAGE={base}"]
        if containerfile is not None:
            args += ["-f", str(containerfile)]
        self.run(*args, str(context), timeout=1200)
        self.made.append(tag)

    def size(self, tag: str) -> int:
        """The image's size in bytes."""
        return int(self.run("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())

    def remove_made(self) -> None:
        """(Blocking) remove the images this session made, newest first."""
        for tag in reversed(self.made):
            subprocess.run([*self.prefix, "rmi", "--force", tag], env=self.env, capture_output=True, timeout=120)
        self.made.clear()
