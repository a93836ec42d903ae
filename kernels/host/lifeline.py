"""The bot's end of the kernel warden (:mod:`kernels.host.warden`): kernels die with the bot.

A :class:`Lifeline` starts the warden (``python -I -S warden.py``: the bot's interpreter, no
site, standard library only, in a session of its own, outside every kernel cgroup, with an
empty environment) and holds the only write end of the pipe that is the warden's stdin
(close-on-exec: what the bot starts never inherits it). Each local kernel is registered
before it can be frozen: its cgroup's folders as soon as they exist, its root process once
it runs (with its start time, so a recycled pid is never killed), and dropped once it has
stopped. When the bot's process ends - in any way, ``kill -9`` included - the kernel closes
the pipe, and the warden kills and thaws every kernel still registered.

Fail closed: kernels never run frozen without a warden. :meth:`Lifeline.ensure` starts it
(again, if it died, with every registration sent once more) and raises
:class:`WardenUnavailableError` when it cannot; the launcher calls it when it opens (the bot
then stops at start-up with that one line), before each kernel start (the start fails with
it) and before each freeze (the session then stops the kernel instead of freezing it). A
warden that dies between those is replaced at once, every kernel told again: a thread of the
lifeline waits on its pidfd, so frozen kernels are never left unguarded until the next start
or freeze (a bot that died in between would have left them frozen for good).

Every method blocks (a process start, a ``/proc`` read, a pipe write): call them off the
event loop. They may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kernels.host import warden
from kernels.seam.result import SandboxUnavailableError

log = logging.getLogger(__name__)

WARDEN = Path(warden.__file__)
#: How long a new warden may take to say it listens (its start, measured: ~20 ms).
READY_TIMEOUT_S = 10.0
#: How long :meth:`Lifeline.close` waits for the warden to sweep and exit.
CLOSE_TIMEOUT_S = warden.SWEEP_S + 2.0
#: How long a registration waits for room in the pipe before the warden counts as stuck.
SEND_TIMEOUT_S = 5.0


class WardenUnavailableError(SandboxUnavailableError):
    """The kernel warden cannot run: no kernel may start or be frozen (one line, names the fix)."""


class Lifeline:
    """Starts the kernel warden and tells it which kernels to kill when this process ends."""

    def __init__(self, python: str | None = None) -> None:
        """``python``: the interpreter that runs the warden (default: the bot's own)."""
        self.python = python or sys.executable
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._write: int | None = None
        #: Kernel id → the messages that registered it, sent again to a restarted warden.
        self._kernels: dict[str, list[dict[str, Any]]] = {}
        #: Times a warden was started, and how long the last start took (seconds).
        self.starts = 0
        self.start_seconds = 0.0
        #: Times a warden that died was replaced by the thread that watches it.
        self.replaced = 0
        # A lifeline nobody closed still ends its warden once it is collected.
        self._finalizer: weakref.finalize[Any, Lifeline] | None = None

    @property
    def pid(self) -> int | None:
        """The warden's process id while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def ensure(self) -> None:
        """(Blocking) make sure a warden runs: start one (and tell it every registered kernel)
        if none does; raises :class:`WardenUnavailableError` when it cannot."""
        with self._lock:
            self._ensure()

    def add_cgroup(self, kernel_id: str, folders: Iterable[Path]) -> None:
        """(Blocking) kill and thaw the cgroup of ``kernel_id`` (its folders) if the bot dies."""
        self._register(kernel_id, [{"id": kernel_id, "cgroup": str(folder)} for folder in folders])

    def add_process(self, kernel_id: str, *pids: int) -> None:
        """(Blocking) kill the process trees of ``pids`` (``kernel_id``'s root processes) if
        the bot dies. Nothing to do for one that has already ended."""
        messages = [
            {"id": kernel_id, "pid": pid, "start": start}
            for pid in pids
            if (start := warden.process_start(pid)) is not None
        ]
        if messages:
            self._register(kernel_id, messages)

    def drop(self, kernel_id: str) -> None:
        """(Blocking) ``kernel_id`` has stopped: forget it (a warden that is down is not started for this)."""
        with self._lock:
            if self._kernels.pop(kernel_id, None) is not None and self._running():
                try:
                    self._send([{"id": kernel_id, "drop": True}])
                except OSError:
                    self._stop()  # the next ensure() starts a fresh one with what is left

    def close(self) -> None:
        """(Blocking) close the lifeline: the warden kills what is still registered and exits;
        wait for it. A later :meth:`ensure` starts a new one."""
        with self._lock:
            self._kernels.clear()
            self._stop(wait=CLOSE_TIMEOUT_S)

    def _register(self, kernel_id: str, messages: list[dict[str, Any]]) -> None:
        with self._lock:
            self._kernels.setdefault(kernel_id, []).extend(messages)
            if self._running():
                try:
                    self._send(messages)
                    return
                except OSError:
                    self._stop()
            self._ensure()  # a fresh warden gets every registration, these included

    def _running(self) -> bool:
        return self._proc is not None and self._write is not None and self._proc.poll() is None

    def _ensure(self) -> None:
        if self._running():
            return
        self._stop()
        try:
            self._start()
            self._send([message for messages in self._kernels.values() for message in messages])
        except OSError as exc:
            self._stop()
            raise WardenUnavailableError(
                f"the kernel warden, which kills kernels if the bot dies, could not be started ({exc}): "
                f"no kernel starts or stays frozen without it; check that `{self.python} -I -S {WARDEN}` "
                "runs and that the bot may start processes and open files (ulimit -u, ulimit -n)"
            ) from exc

    def _start(self) -> None:
        started = time.monotonic()
        read, write = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(write, False)  # a warden that stopped reading must not hang a kernel start
        try:
            proc = subprocess.Popen(
                [self.python, "-I", "-S", str(WARDEN)],
                stdin=read,
                stdout=subprocess.PIPE,
                env={},
                cwd="/",
                start_new_session=True,  # a Ctrl-C or signal to the bot's process group spares it
            )
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        try:
            answer = _read_ready(proc, READY_TIMEOUT_S)
        except BaseException:
            os.close(write)
            proc.kill()
            proc.wait()
            raise
        if answer != warden.READY:
            os.close(write)
            proc.kill()
            code = proc.wait()
            raise OSError(f"it exited with code {code} before it was ready")
        self._proc, self._write = proc, write
        self._finalizer = weakref.finalize(self, _close_quietly, write)
        self.starts += 1
        self.start_seconds = time.monotonic() - started
        self._watch(proc)

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        """Replace ``proc`` as soon as it dies (:func:`_wait_for_death`, in a thread of its own).
        Its pidfd is opened here, before anything may reap it and free its pid for reuse."""
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError as exc:  # Linux < 5.3: it is replaced at the next kernel start or freeze
            log.warning(
                "the kernel warden (pid %d) cannot be watched (%s): one that dies is replaced late", proc.pid, exc
            )
            return
        threading.Thread(
            target=_wait_for_death, args=(weakref.ref(self), proc, pidfd), name="kernel-warden-watch", daemon=True
        ).start()

    def _replace(self, proc: subprocess.Popen[bytes]) -> None:
        """(The watching thread) ``proc`` died: start a new warden with every registration,
        unless ``proc`` was stopped or replaced on purpose meanwhile."""
        with self._lock:
            if self._proc is not proc:
                return
            log.warning(
                "the kernel warden (pid %d) died (exit status %s); starting a new one for %d kernel(s)",
                proc.pid,
                proc.poll(),
                len(self._kernels),
            )
            try:
                self._ensure()
            except WardenUnavailableError as exc:
                # Kernels frozen now are unguarded; the next kernel start or freeze fails closed.
                log.error("%s", exc)
                return
            self.replaced += 1

    def _send(self, messages: list[dict[str, Any]]) -> None:
        fd = self._write
        assert fd is not None
        for message in messages:
            data = (json.dumps(message) + "\n").encode()
            while data:
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:  # a full pipe: wait, but not for a warden that stopped reading
                    poller = select.poll()
                    poller.register(fd, select.POLLOUT)
                    if not poller.poll(SEND_TIMEOUT_S * 1000):
                        raise OSError(f"the kernel warden read nothing for {SEND_TIMEOUT_S:.0f} s") from None

    def _stop(self, wait: float | None = None) -> None:
        """End the current warden. ``wait`` (seconds): close the lifeline, so the warden kills
        what is registered, and wait for it. None: it is being replaced (it died, or stopped
        reading): SIGKILL it first, so it kills nothing its successor is told of."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        proc, self._proc = self._proc, None
        if proc is not None and wait is None:
            proc.kill()
        if self._write is not None:
            _close_quietly(self._write)
            self._write = None
        if proc is None:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_death(lifeline: weakref.ref[Lifeline], proc: subprocess.Popen[bytes], pidfd: int) -> None:
    """(A thread) wait until the warden ``proc`` ends (its pidfd becomes readable), then have
    the lifeline replace it. Holds the lifeline weakly: a lifeline nobody holds any more still
    closes (its warden then exits, and this thread with it)."""
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll():
            pass
    finally:
        os.close(pidfd)
    owner = lifeline()
    if owner is not None:
        owner._replace(proc)


def _read_ready(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The warden's first output (its ready line), then its stdout is closed here."""
    assert proc.stdout is not None
    try:
        poller = select.poll()  # not select(): a busy bot has fds above 1024
        poller.register(proc.stdout.fileno(), select.POLLIN)
        data = b""
        deadline = time.monotonic() + timeout
        while not data.endswith(b"\n") and (remaining := deadline - time.monotonic()) > 0:
            if not poller.poll(remaining * 1000):
                break
            chunk = os.read(proc.stdout.fileno(), 64)
            if not chunk:
                break
            data += chunk
        if not data:
            raise OSError(f"it did not say it was ready within {timeout:.0f} s")
        return data
    finally:
        proc.stdout.close()


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
