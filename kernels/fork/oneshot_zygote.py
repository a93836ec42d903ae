"""The one-shot fork server's program: import the bot's own one-shot code once, fork a fresh
process for every job.

Run as ``python -I kernels/fork/oneshot_zygote.py PRELOAD_JSON LIFELINE_FD [jail|userns]`` by
:class:`kernels.oneshot.server.OneShotServer`, inside the kernels' sandbox (the same bubblewrap
command as the kernels' zygote, :func:`kernels.sandbox.args.zygote_args`) or, with
``kernels.sandbox: none``, as a plain child. Like ``zygote.py`` it imports nothing of the
project but ``jail.py`` and ``zygote.py`` beside it (by path: their helpers), and it never runs
anything of a thread: it imports ``PRELOAD`` (``threadbook_kernel.preview`` and ``.export``
with what they use), calls each one's ``prepare()`` where it has one (a render of an empty
notebook, a tiny CSV read: trusted input it makes itself, so the templates are compiled and
the lazy imports done once), freezes its heap (``gc.freeze``) and serves.

Protocol. Its standard input is one end of a ``SOCK_SEQPACKET`` socket pair: one message per
process, a JSON object ``{"id", "cwd", "env", "limits", "jail"}`` with three descriptors
attached (``SCM_RIGHTS``): the write ends of the job's standard output and error, and one end
of the job's own socket pair. It answers on its standard output, JSON lines: ``{"id", "pid"}``
(or ``{"id", "error"}``) once the process exists, ``{"exit": pid, "code": n}`` when it ends.
When its standard input closes it kills what it forked and exits.

A job's process: its own session, keyring and OOM score (:func:`jail.isolate`), killed when the
zygote dies (``PR_SET_PDEATHSIG``), the job's rlimits; sandboxed, pid 1 of a pid namespace of
its own in its own mount, net, ipc, uts and cgroup namespaces, with only its scratch folder
(``/workspace``) and run dir bound and the job's uid, no capabilities (:func:`jail.build`,
:func:`jail.drop_privileges`; with ``userns``, a user namespace of its own). It closes every
descriptor but its own and waits, ahead of need, for its job on its socket: ``{"argv",
"input_fd"}`` and, with ``input_fd``, the file the bot opened for it. The bot sends the job
only once the process is in the job's cgroup (nothing of the job runs outside it; moving a
process into a cgroup can take 20 ms, which a process made ahead does not add to a job), and
closing the socket without one ends the process. Then ``python -I -m MODULE ARGS`` or ``-c
CODE`` runs as it would in a fresh interpreter (``runpy``), with the job's environment and
folder, in a process that inherited only what the imports made: a job that changes a module
changes its own copy.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import importlib.util
import json
import os
import random
import resource
import runpy
import select
import signal
import socket
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The most descriptors a message carries (stdout, stderr and the job's socket; a job: its input).
MAX_FDS = 3
#: The largest job message.
MAX_MESSAGE = 1 << 20


def _load(name: str) -> Any:
    """A sibling program file, loaded by path (this program imports nothing of the project)."""
    spec = importlib.util.spec_from_file_location(f"_threadbook_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _preload(modules: list[str]) -> None:
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional library: the job imports it (or not) itself
            if name.startswith("threadbook_kernel"):
                raise
            continue
        prepare = getattr(module, "prepare", None)
        if callable(prepare):
            prepare()


class Server:
    """Forks a process per job (see the module docstring)."""

    def __init__(self, lifeline: int, mode: str | None, jail: Any, zygote: Any) -> None:
        self.lifeline = lifeline
        self.mode = mode
        self.jail = jail
        self.zygote = zygote
        self.pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC) if mode == "jail" else -1
        self.children: set[int] = set()

    def fork(self, request: dict[str, Any], fds: list[int], keep: tuple[int, ...]) -> int:
        """Fork the job's process (for ``userns``, an anchor whose child is the job); its pid."""
        self.zygote._single_threaded()
        pid: int
        if self.mode == "jail":
            pid = self.jail.fork_jailed(self.pid_namespace)
        else:
            pid = os.fork()
        if pid == 0:
            close = (*keep, *([self.pid_namespace] if self.pid_namespace >= 0 else []))
            if self.mode == "userns":
                self.zygote._child(lambda: self._anchor(request, fds, close))
            else:
                _job_child(lambda: self._job(request, fds, close))
        return pid

    def _anchor(self, request: dict[str, Any], fds: list[int], close: tuple[int, ...]) -> int:
        """(User-namespace profile) a new pid namespace whose pid 1 is the job; wait for it
        and exit as it did. The job dies with the anchor (the bot kills the anchor)."""
        jail = self.jail
        self.zygote._detach(close)
        jail.prctl(jail.PR_SET_PDEATHSIG, signal.SIGKILL)
        jail.unshare(jail.CLONE_NEWPID)
        # The bot moves this process into the job's cgroup, then sends the job: only then is
        # the job's process forked (it starts in the cgroup).
        job = _receive(fds[2])
        if job is None:
            return 1
        pid = os.fork()
        if pid == 0:
            _job_child(lambda: self._job(request, fds, (), job=job))
        for fd in [*fds, *job[1]]:
            os.close(fd)
        while True:
            try:
                _, status = os.waitpid(pid, 0)
            except InterruptedError:
                continue
            return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def _job(
        self,
        request: dict[str, Any],
        fds: list[int],
        close: tuple[int, ...],
        *,
        job: tuple[dict[str, Any], list[int]] | None = None,
    ) -> int:
        """(The job's process) confine itself, wait for its job (unless its anchor did), run it."""
        jail, spec = self.jail, request.get("jail")
        stdout, stderr, channel = fds
        self.zygote._detach(close)  # default signals, its own session
        jail.prctl(jail.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1 and self.mode is None:  # the zygote died before the line above
            return 1
        os.dup2(stderr, 2)  # from here on a failure is the job's to report
        jail.isolate(spec or {})
        for limit, value in request.get("limits", []):
            resource.setrlimit(limit, (value, value))
        if spec is not None:
            jail.build(spec)
            jail.take_identity(spec, dumpable=False)
            jail.prctl(jail.PR_SET_PDEATHSIG, signal.SIGKILL)  # a change of credentials cleared it
        null = os.open(os.devnull, os.O_RDONLY)
        if null != 0:
            os.dup2(null, 0)
        os.dup2(stdout, 1)
        if job is None:
            jail.close_fds({0, 1, 2, channel})
            job = _receive(channel)  # the bot sends it once this process is in the job's cgroup
            if job is None:
                return 1
        message, given = job
        global _report_to
        _report_to = channel
        keep = {0, 1, 2, channel}
        if given:
            target = int(message["input_fd"])
            if target <= 2:
                raise RuntimeError(f"input descriptor {target} is taken")
            if given[0] != target:
                os.dup2(given[0], target, inheritable=False)
            keep.add(target)
        jail.close_fds(keep)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        random.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        return _run(message["argv"])

    def reap(self) -> None:
        """Report every child that ended."""
        for pid, code in self.zygote._reaped():
            if pid in self.children:
                self.children.discard(pid)
                if self.mode == "userns" and code > 128:  # the anchor passes a signal on as 128 + N
                    code = 128 - code
                self.zygote._send({"exit": pid, "code": code})


def _receive(channel: int) -> tuple[dict[str, Any], list[int]] | None:
    """The job sent on the socket ``channel`` (kept open: the job reports its end on it): its
    message and the descriptor given with it; None when the bot closed the socket instead."""
    sock = socket.socket(fileno=channel)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
            break
        except InterruptedError:
            continue
    sock.detach()
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    message = json.loads(data)
    if len(fds) != (1 if message.get("input_fd") is not None else 0):
        raise ValueError(f"{len(fds)} descriptors came with the job")
    return message, fds


#: (The job's process) the socket its end is reported on.
_report_to = -1


def _job_child(body: Callable[[], int]) -> None:
    """(The job's process) run ``body``, then say how it ended on the job's socket and close its
    output before the process exits: tearing down a copy of the zygote's memory takes a few
    milliseconds that the job's answer does not wait for. Never returns."""
    code = 1
    try:
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            if _report_to >= 0:
                os.write(_report_to, json.dumps({"exit": code}).encode())
            os.close(1)
            os.close(2)
        finally:
            os._exit(code)


def _run(argv: list[str]) -> int:
    """Run ``python -I ARGV`` (``-m MODULE ...`` or ``-c CODE ...``) in this process."""
    if argv[:1] == ["-m"] and len(argv) >= 2:
        sys.argv = [argv[1], *argv[2:]]
        with warnings.catch_warnings():  # the module was imported before: runpy says so, harmlessly
            warnings.simplefilter("ignore", RuntimeWarning)
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    if argv[:1] == ["-c"] and len(argv) >= 2:
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        return 0
    raise ValueError(f"not a one-shot command line: {argv[:2]!r}")


def main() -> None:
    """Import and prepare, report ready, then serve jobs until standard input closes."""
    modules = json.loads(sys.argv[1])
    lifeline = int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else None
    zygote = _load("zygote")
    server = Server(lifeline, mode, _load("jail"), zygote)
    _preload(modules)
    gc.collect()
    gc.freeze()  # the collector never writes into what the jobs share
    channel = socket.socket(fileno=0)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the bot's to handle
    zygote._send({"ready": os.getpid(), "threads": zygote._thread_count()})
    keep = (wake_r, wake_w, lifeline)
    while True:
        try:
            readable, _, _ = select.select([0, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            server.reap()
        if 0 not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, MAX_FDS)
        except InterruptedError:
            continue
        if not data:
            for fd in fds:
                os.close(fd)
            break
        request: dict[str, Any] = {}
        try:
            request = json.loads(data)
            if len(fds) != 3:
                raise ValueError(f"{len(fds)} descriptors, 3 expected")
            pid = server.fork(request, fds, (*keep, channel.fileno()))
        except Exception as exc:
            zygote._send({"id": request.get("id"), "error": f"{type(exc).__name__}: {exc}"})
        else:
            server.children.add(pid)
            zygote._send({"id": request["id"], "pid": pid})
        finally:
            for fd in fds:
                os.close(fd)
    for pid in server.children:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    main()
