"""The mount table (``/proc/self/mountinfo``) as data: which file system is mounted where."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: This process's mount table.
MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class Mount:
    """One line of the mount table."""

    root: str  # the folder of the file system seen at ``point`` (a container's own cgroup, say)
    point: Path
    fstype: str
    options: frozenset[str]  # the file system's own options (``memory`` for a cgroup v1 hierarchy)


def parse(mountinfo: str) -> list[Mount]:
    """The mounts of a mount table's text, in its order (a later mount at a point hides an earlier one)."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if dash < 5 or len(fields) < dash + 4:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040 is a space
        found.append(Mount(fields[3], Path(point), fields[dash + 1], frozenset(fields[dash + 3].split(","))))
    return found


def mounted_at(mounts: list[Mount], point: Path) -> Mount | None:
    """The mount seen at ``point`` itself (the last one there), None when ``point`` is no mount point."""
    return next((mount for mount in reversed(mounts) if mount.point == point), None)
