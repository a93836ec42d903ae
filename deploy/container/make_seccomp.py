#!/usr/bin/env python3
"""Write deploy/container/seccomp.json: a container runtime's default seccomp profile plus
the calls bubblewrap (and the fork server's jails) make to build a kernel's sandbox.

The base is the default profile of the containers project (Debian's
``golang-github-containers-common``, installed with podman: ``/usr/share/containers/seccomp.json``),
or any profile in the same format given as the first argument (Docker's ``default.json``).
Those profiles allow the namespace calls only to a process holding ``CAP_SYS_ADMIN`` (Docker:
``clone`` with namespace flags, ``unshare``, ``mount``, ``setns``...; podman: ``sethostname``,
``setdomainname``, ``setns``), which the image's non-root bot never has. Here they are allowed
outright; every other rule stays as the base has it. What the calls can then do is still
bounded by the kernel's own rules: an unprivileged process gains capabilities only inside a
user namespace it creates, over what that namespace owns.

    python3 deploy/container/make_seccomp.py [BASE] > deploy/container/seccomp.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_BASE = Path("/usr/share/containers/seccomp.json")

#: bwrap: clone/unshare of user, mount, pid, net, ipc, uts and cgroup namespaces; mount,
#: pivot_root and umount2 to build the new root; sethostname in its own uts namespace; the
#: fork server's anchor enters namespaces with setns.
SANDBOX_CALLS = (
    "clone",
    "clone3",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "sethostname",
    "setdomainname",
)


def with_sandbox_calls(base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with :data:`SANDBOX_CALLS` allowed unconditionally, by one rule of their own
    (taken out of every other rule: those that refuse them or allow them under conditions)."""
    rules: list[dict[str, Any]] = []
    for rule in base["syscalls"]:
        names = [n for n in rule["names"] if n not in SANDBOX_CALLS]
        if names:
            rules.append({**rule, "names": names})
    rules.append(
        {
            "names": list(SANDBOX_CALLS),
            "action": "SCMP_ACT_ALLOW",
            "comment": "Threadbook: bubblewrap builds each kernel's namespaces as the non-root bot (deploy/container/make_seccomp.py)",
        }
    )
    return {**base, "syscalls": rules}


def main(argv: list[str]) -> int:
    """Print the profile made from ``argv[1]`` (default :data:`DEFAULT_BASE`)."""
    base = Path(argv[1]) if len(argv) > 1 else DEFAULT_BASE
    json.dump(with_sandbox_calls(json.loads(base.read_text())), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
