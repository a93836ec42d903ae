"""A real PostgreSQL for the store tests, the replica tests and the bench: Debian's
``postgresql`` package, a fresh cluster made with ``initdb`` in a temporary folder, served
on 127.0.0.1 (and a unix socket in that folder) by ``pg_ctl``, stopped by its pid.

PostgreSQL refuses to run as root, so under root the cluster belongs to ``nobody`` and its
commands run as that user. :func:`find_postgres` says why it cannot run (for a skip reason).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench.gateway import free_port

#: The unprivileged account that owns the cluster when the caller is root.
_SERVICE_USER = "nobody"


def find_postgres() -> tuple[Path | None, str]:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, or None and why not."""
    candidates = [Path(p).parent for p in (shutil.which("initdb"),) if p]
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for folder in candidates:
        folder = folder.resolve()
        if all((folder / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return folder, ""
    return None, "PostgreSQL is not installed (Debian: apt-get install postgresql; needs initdb and pg_ctl)"


class LocalPostgres:
    """One PostgreSQL cluster in a temporary folder; :meth:`database` makes a fresh database."""

    def __init__(self) -> None:
        folder, why = find_postgres()
        if folder is None:
            raise RuntimeError(why)
        self._bin = folder
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="threadbook-pg-"))
        self.data = self.root / "data"
        self._user: pwd.struct_passwd | None = pwd.getpwnam(_SERVICE_USER) if os.geteuid() == 0 else None
        self._databases = 0
        self.pid: int | None = None

    @property
    def role(self) -> str:
        """The superuser role initdb created (the account that ran it)."""
        return self._user.pw_name if self._user is not None else pwd.getpwuid(os.geteuid()).pw_name

    def url(self, database: str = "postgres") -> str:
        """A ``postgresql://`` URL for ``database`` over TCP on 127.0.0.1."""
        return f"postgresql://{self.role}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        """initdb, then start the server and wait until it accepts connections."""
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync")
        self._serve()

    def restart(self) -> None:
        """Stop the server (every connection drops) and start it again on the same data."""
        self._halt()
        self._serve()

    def _serve(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root}"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def database(self) -> str:
        """Create a new empty database; returns its URL."""
        self._databases += 1
        name = f"threadbook_{self._databases}"
        self._run("psql" if (self._bin / "psql").exists() else "createdb", *self._create_args(name))
        return self.url(name)

    def stop(self) -> None:
        """Stop the server by its pid (fast shutdown) and delete the cluster."""
        self._halt()
        shutil.rmtree(self.root, ignore_errors=True)

    def _halt(self) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGINT)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    os.kill(self.pid, 0)
                    time.sleep(0.05)
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.pid = None

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _create_args(self, name: str) -> list[str]:
        if (self._bin / "psql").exists():
            return [
                "-h",
                str(self.root),
                "-p",
                str(self.port),
                "-d",
                "postgres",
                "-q",
                "-c",
                f'CREATE DATABASE "{name}"',
            ]
        return ["-h", str(self.root), "-p", str(self.port), name]

    def _run(self, tool: str, *args: str) -> None:
        program = self._bin / tool
        if not program.exists():
            found = shutil.which(tool)
            if found is None:
                raise RuntimeError(f"{tool} not found")
            program = Path(found)
        user = self._user
        result = subprocess.run(
            [str(program), *args],
            capture_output=True,
            cwd=self.root,
            timeout=120,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
            env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "HOME": str(self.root)},
        )
        if result.returncode != 0:
            raise RuntimeError(f"{tool} failed ({result.returncode}): {result.stderr.decode(errors='replace')[-2000:]}")
