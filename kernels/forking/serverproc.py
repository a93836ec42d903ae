"""The bot's side of a fork server program, whichever it is: the kernels' zygote
(:class:`~kernels.forking.launcher.ForkServer`) or the one-shots'
(:class:`~kernels.oneshot.server.OneShotServer`).

:class:`ServerProcess` owns one such process: it starts it with a lifeline pipe (EOF once
the bot is gone) and registers it with the kernel warden (which takes its whole tree along if
the bot dies), waits for its
``{"ready": pid}`` line, reads and hands on every JSON line it writes, restarts it in the
background with a growing delay when it dies (what it serves is spawned meanwhile), and stops
it: its input closed (it kills what it forked that still runs), killed after
:data:`STOP_GRACE_S`, its folders removed. A subclass says how the process is started, what its
lines mean, and what the bot's side gives up when it exits.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from kernels.seam.result import KernelStartError
from kernels.spawn.spawner import Spawner

log = logging.getLogger(__name__)

#: How long a fork server may take to import what it preloads and say it is ready.
START_TIMEOUT_S = 60.0
#: Pauses before the restarts of a fork server that died, the last one repeated.
RESTART_DELAYS_S = (1.0, 2.0, 5.0, 15.0, 30.0)
#: Restarts tried in a row before the bot gives up on a fork server (about 5 minutes; what it
#: serves is spawned from then on).
RESTART_ATTEMPTS = 12
#: How long a fork server whose input was closed may take to exit before it is killed.
STOP_GRACE_S = 5.0


class ServerProcess(abc.ABC):
    """One fork server process and its life (see the module docstring).

    Subclasses implement :meth:`_spawn`, :meth:`_handle_message` and :meth:`_exited`, and may
    extend :meth:`_detail`, :meth:`_started`, :meth:`_wind_down` and :meth:`_close_input`."""

    #: What the logs call it ("fork server").
    name = "fork server"
    #: What happens to its work while it does not run, for the logs ("kernels are spawned").
    fallback = "its work is spawned"
    #: Its name in the kernel warden's registry and its tasks' names, before the pid.
    key = "fork-server"

    def __init__(self, spawner: Spawner) -> None:
        """``spawner``: the spawner whose kernel warden, run root and interpreter it uses."""
        self.spawner = spawner
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._starter: asyncio.Task[bool] | None = None
        self._restarter: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[int] | None = None
        #: The lifeline: the process gets the read end (and hands it to what it forks); the
        #: write end closes when the bot is gone, and the EOF ends them.
        self._lifeline_r, self._lifeline_w = os.pipe2(os.O_CLOEXEC)
        self._closed = False
        #: Folders its starts made, removed by :meth:`stop`.
        self._folders: list[Path] = []
        self.running = False
        #: Times the process was (re)started.
        self.starts = 0

    @property
    def pid(self) -> int | None:
        """The process id (its sandbox's, sandboxed) while it runs."""
        return self._proc.pid if self._proc is not None and self.running else None

    def open(self) -> None:
        """Start the process in the background (:meth:`launch`); :meth:`wait_ready` waits for it."""
        if self._starter is None:
            self._starter = asyncio.create_task(self.launch(), name=f"{self.key}-start")

    async def wait_ready(self, timeout: float = START_TIMEOUT_S) -> bool:
        """Wait for the first start (tests, benchmarks); whether the process runs."""
        if self._starter is not None:
            await asyncio.wait_for(asyncio.shield(self._starter), timeout)
        return self.running

    async def launch(self) -> bool:
        """Start the process; on failure log it, keep retrying in the background, return False."""
        try:
            await self.start()
            return True
        except Exception:
            log.warning("the %s did not start; %s until it does", self.name, self.fallback, exc_info=True)
            if not self._closed and (self._restarter is None or self._restarter.done()):
                self._restarter = asyncio.create_task(self._restart(), name=f"{self.key}-restart")
            return False

    async def start(self) -> None:
        """Start the process and wait until it says it is ready (its imports done)."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        proc = self._proc = await self._spawn()
        self.starts += 1
        self.running = True
        self._reader = asyncio.create_task(self._read(proc), name=f"{self.key}-reader")
        try:
            await asyncio.to_thread(self.spawner.lifeline.add_process, self._warden_key(proc), proc.pid)
            ready = await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT_S)
        except BaseException:
            await self._kill()
            raise
        log.info("%s ready (pid %s%s)", self.name, ready, self._detail())
        self._started()

    @abc.abstractmethod
    async def _spawn(self) -> asyncio.subprocess.Process:
        """Make the folder the process runs in (added to :attr:`_folders`) and start the
        process with :attr:`_lifeline_r` passed to it; its standard output is a pipe."""

    @abc.abstractmethod
    def _handle_message(self, message: dict[str, Any]) -> None:
        """One line the process wrote (but ``ready``, handled here first)."""

    def _detail(self) -> str:
        """More for the log line that says it is ready (", preloaded …")."""
        return ""

    @abc.abstractmethod
    def _exited(self) -> None:
        """The process exited: fail what waits on it."""

    def _started(self) -> None:
        """The process is ready (here: nothing more)."""
        return None

    async def _wind_down(self) -> None:
        """Before :meth:`stop` closes the process's input (here: nothing)."""
        return None

    def _close_input(self) -> None:
        """Close the process's input (it kills what it forked that still runs, then exits);
        called once the process may have exited too."""
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()

    def _warden_key(self, proc: asyncio.subprocess.Process) -> str:
        return f"{self.key}-{proc.pid}"

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            try:
                message = json.loads(line)
                if "ready" in message:
                    if self._ready is not None and not self._ready.done():
                        self._ready.set_result(message["ready"])
                else:
                    self._handle_message(message)
            except (ValueError, KeyError, TypeError):
                # Not the protocol: log it and keep reading, so a process that dies is still noticed.
                log.error("the %s wrote an unreadable line: %r", self.name, line[:200])
        await proc.wait()
        await asyncio.to_thread(self.spawner.lifeline.drop, self._warden_key(proc))
        self.running = False
        self._exited()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(KernelStartError(f"the {self.name} exited during start ({proc.returncode})"))
        if not self._closed:
            log.error("the %s exited (code %s); %s until it is back", self.name, proc.returncode, self.fallback)
            self._restarter = asyncio.create_task(self._restart(), name=f"{self.key}-restart")

    async def _restart(self) -> None:
        for attempt in range(RESTART_ATTEMPTS):
            await asyncio.sleep(RESTART_DELAYS_S[min(attempt, len(RESTART_DELAYS_S) - 1)])
            if self._closed:
                return
            try:
                await self.start()
                return
            except Exception:
                log.warning("restarting the %s failed", self.name, exc_info=True)
        log.error("the %s failed to restart %d times: %s from now on", self.name, RESTART_ATTEMPTS, self.fallback)

    async def stop(self) -> None:
        """Stop the process (it kills what it forked that still runs), remove its folders and
        release the lifeline."""
        self._closed = True
        for task in (self._restarter, self._starter):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._wind_down()
        self._close_input()
        proc = self._proc
        if proc is not None and proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                pass
        await self._kill()
        for folder in self._folders:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        for fd in (self._lifeline_r, self._lifeline_w):
            try:
                os.close(fd)
            except OSError:
                pass

    async def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
