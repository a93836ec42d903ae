"""The fork server's own program ("zygote"): import once, fork a fresh ipykernel per request.

Run as ``python -P kernels/fork/zygote.py PRELOAD_JSON LIFELINE_FD [jail]`` by
:class:`kernels.fork.server.ForkServer`; it imports nothing from this project but its sibling
``jail.py`` (standard library only), so a kernel's ``sys.modules`` holds only what a
spawned kernel would have plus the preloaded modules. Before it serves it imports what
every kernel imports while it starts (:data:`KERNEL_IMPORTS`), resolves matplotlib's inline
backend, and freezes its heap (``gc.freeze``): a child then only binds its sockets, builds
its shell and takes its identity.

With ``jail`` (the sandboxed profile; the zygote then runs inside bubblewrap, see
:func:`kernels.sandbox.args.zygote_args`) every request carries a ``"jail"`` object (uid, gid,
host paths of the workspace, run dir and data dir, tmpfs sizes) and the child enters its own
namespaces and uid before any user code (:mod:`kernels.fork.jail`); the fork is answered only
once the kernel process has dropped its privileges, or with the error that stopped it.
In both profiles every child joins a new session keyring and raises its ``oom_score_adj``
before any user code (:func:`kernels.fork.jail.isolate`); the bot moves it into the kernel's
cgroup once the fork is answered (:mod:`kernels.launch.cgroups`).

Protocol: JSON lines. The zygote writes ``{"ready": pid, "threads": n}`` once its imports
are done, then reads fork requests ``{"id", "argv", "cwd", "env", "log", "limits"}`` from
stdin and answers ``{"id", "pid"}`` (or ``{"id", "error"}``); whenever a child exits it
writes ``{"exit": pid, "code": returncode}`` (``-signal`` when killed, like ``Popen``).
When stdin closes it kills what it forked and exits.

Fork safety (KERNELS.md pitfall 7): BLAS threads are pinned to one by the environment and
the zygote checks it is single-threaded before every fork; no ZMQ context or event loop
exists before fork (the child's ``IPKernelApp`` makes its own); the child resets signal
handlers, starts its own session, reseeds ``random`` and numpy, redirects its output to the
kernel log (a traceback of a failed start lands there, since ``os._exit`` would hide it),
and runs ``%matplotlib inline`` through the ``exec_lines`` it is given.

A forked kernel is tied to the bot, not to the zygote: the lifeline pipe's write end lives
only in the bot, so when the bot dies every kernel sees EOF and kills its process group (a
jailed kernel's supervisor exits, which ends its pid namespace), while a zygote that dies
(and is restarted) leaves running kernels alone. A kernel frozen between turns reads nothing:
the bot's kernel warden (``kernels/launch/warden.py``) kills and thaws it instead.
"""

from __future__ import annotations

import errno
import gc
import importlib
import importlib.util
import json
import os
import resource
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _send(message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


#: What every kernel imports while it starts, whatever the preload: ipykernel's application
#: and kernel, what ``IPKernelApp.initialize`` imports besides (the debugger class trait
#: pulls in debugpy; pdb, sqlite3 for the history, psutil for usage replies, IPython's
#: magics) and Threadbook's kernel code (``setup()``, the snapshot restore). Measured (bench
#: ``fork_path``): a child's ``initialize`` went from ~107 to ~49 ms. None of them starts a
#: thread (checked before every fork).
KERNEL_IMPORTS = (
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "ipykernel.debugger",
    "IPython",
    "pdb",
    "sqlite3",
    "psutil",
    "faulthandler",
    "tornado.platform.asyncio",
    "IPython.core.completerlib",
    "IPython.core.debugger",
    "IPython.core.logger",
    "IPython.core.magic_arguments",
    "IPython.core.magics.ast_mod",
    "IPython.core.magics.execution",
    "IPython.core.magics.pylab",
    "IPython.core.oinspect",
    "IPython.extensions.storemagic",
    "IPython.utils.module_paths",
    "IPython.utils.wildcard",
    "threadbook_kernel",
    "threadbook_kernel.display",
    "threadbook_kernel.snapshot",
)
#: When the last fork began (this process's clock), kept by the child in its trace.
_forking_at = 0.0


def _preload(modules: list[str]) -> None:
    for name in KERNEL_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # a kernel environment without it imports it (or not) after the fork
            pass
    for name in modules:
        importlib.import_module(name)
    if "matplotlib" in modules:
        importlib.import_module("matplotlib.pyplot")
        importlib.import_module("matplotlib_inline.backend_inline")
        # ``%matplotlib inline`` resolves the backend through matplotlib's registry, which
        # reads every installed package's entry points the first time: once, here.
        pylabtools: Any = importlib.import_module("IPython.core.pylabtools")
        pylabtools.find_gui_and_backend("inline")


#: How long the zygote waits for a jailed child to report that its kernel dropped privileges.
JAIL_TIMEOUT_S = 10.0


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _watch_lifeline(fd: int) -> None:
    """Kill this kernel's process group when the bot is gone (the pipe reports EOF)."""
    while True:
        try:
            if not os.read(fd, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _child(body: Callable[[], int]) -> None:
    """(Child) run ``body`` and exit with its code; never return into the zygote's loop."""
    code = 1
    try:
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _detach(close: tuple[int, ...]) -> None:
    """(Child) leave the zygote: default signals, own session."""
    signal.set_wakeup_fd(-1)
    for fd in close:
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setsid()


def _log_output(request: dict[str, Any]) -> None:
    """(Child) stdin from /dev/null, stdout and stderr to the kernel log."""
    log_fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(null_fd)
    os.close(log_fd)


def _run_kernel(request: dict[str, Any], lifeline: int | None) -> int:
    """(Child) become the requested ipykernel; ``lifeline``: watch it here (unsandboxed profile)."""
    entered = time.time()
    for limit, value in request.get("limits", []):
        resource.setrlimit(limit, (value, value))
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = ["ipykernel_launcher", *request["argv"]]
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    if lifeline is not None:
        threading.Thread(target=_watch_lifeline, args=(lifeline,), name="lifeline", daemon=True).start()
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(request["argv"])  # type: ignore[no-untyped-call]  # ipykernel is untyped
    # Wall-clock moments of this start, for the benchmark's fork-path breakdown.
    sys._threadbook_fork_trace = {"fork": _forking_at, "kernel": entered, "initialized": time.time()}  # type: ignore[attr-defined]
    app.start()  # type: ignore[no-untyped-call]
    return 0


def _single_threaded() -> None:
    """Refuse to fork with a second thread (it would be missing in the child, its locks held); stamp the fork."""
    global _forking_at
    threads = _thread_count()
    if threads != 1:
        raise RuntimeError(f"the fork server has {threads} threads; refusing to fork")
    sys.stdout.flush()
    sys.stderr.flush()
    _forking_at = time.time()


def _load_forkjail() -> Any:
    """``jail.py`` next to this file, loaded by path (this program imports nothing of the project)."""
    spec = importlib.util.spec_from_file_location("_threadbook_forkjail", Path(__file__).with_name("jail.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fork(request: dict[str, Any], lifeline: int, wake_fds: tuple[int, int], jail: Any) -> int:
    _single_threaded()
    pid = os.fork()
    if pid:
        return pid

    def body() -> int:
        _detach(wake_fds)
        jail.isolate({})  # own session keyring, high OOM score
        _log_output(request)
        return _run_kernel(request, lifeline)

    _child(body)
    return 0  # not reached


class Jailer:
    """Forks kernels into their own namespaces and uid (the sandboxed profile, :mod:`kernels.fork.jail`)."""

    def __init__(self, jail: Any) -> None:
        self.jail = jail
        self.pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def fork(self, request: dict[str, Any], lifeline: int, wake_fds: tuple[int, int]) -> int:
        """Fork a supervisor (pid 1 of a new pid namespace) that builds the jail and forks the
        kernel; return once the kernel has dropped its privileges, or raise with the reason.

        User-namespace profile (bot not root): the zygote may not re-enter its own pid
        namespace after creating one (that needs root on the host), so an *anchor* child
        creates it and forks the supervisor; the anchor is what the bot sees and signals.
        """
        _single_threaded()
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        close = (*wake_fds, status_r, self.pid_namespace)
        userns = bool(request["jail"].get("userns"))
        try:
            pid: int = os.fork() if userns else self.jail.fork_jailed(self.pid_namespace)
        except BaseException:
            os.close(status_r)
            os.close(status_w)
            raise
        if pid == 0:
            body = self._anchor if userns else self._supervisor
            _child(lambda: body(request, lifeline, close, status_w))
        os.close(status_w)
        try:
            answer = _read_all(status_r, JAIL_TIMEOUT_S)
        finally:
            os.close(status_r)
        if answer != b"ok":
            os.kill(pid, signal.SIGKILL)  # reaped (and reported) like any other child
            raise RuntimeError(answer.decode(errors="replace") or "the jailed kernel exited during set-up")
        return pid

    def _anchor(self, request: dict[str, Any], lifeline: int, close: tuple[int, ...], status: int) -> int:
        """(User-namespace profile) own session, a new pid namespace whose pid 1 is the
        supervisor; wait for it and exit as it did. The supervisor dies with the anchor."""
        jail = self.jail
        try:
            _detach(close)
            jail.unshare(jail.CLONE_NEWPID)
            supervisor = os.fork()
        except BaseException as exc:
            os.write(status, f"{type(exc).__name__}: {exc}".encode())
            raise
        if supervisor == 0:
            jail.prctl(jail.PR_SET_PDEATHSIG, signal.SIGKILL)
            _child(lambda: self._supervisor(request, lifeline, (), status))
        os.close(status)
        os.close(lifeline)
        while True:
            try:
                _, code = os.waitpid(supervisor, 0)
            except InterruptedError:
                continue
            return jail.SIGNAL_BASE + os.WTERMSIG(code) if os.WIFSIGNALED(code) else os.WEXITSTATUS(code)

    def _supervisor(self, request: dict[str, Any], lifeline: int, close: tuple[int, ...], status: int) -> int:
        jail, spec = self.jail, request["jail"]
        try:
            _detach(close)
            jail.isolate(spec)  # own session keyring, high OOM score (the kernel inherits both)
            jail.build(spec)
            _log_output(request)
            if spec.get("userns"):
                jail.enter_user_namespace(spec["uid"], spec["gid"], dumpable=False)
            else:
                jail.drop_privileges(spec["uid"], spec["gid"], dumpable=False)
            jail.close_fds({lifeline, status})
            _single_threaded()
            kernel = os.fork()
        except BaseException as exc:
            os.write(status, f"{type(exc).__name__}: {exc}".encode())
            raise
        if kernel == 0:
            _child(lambda: self._kernel(request, lifeline, status))
        os.close(status)
        return int(jail.supervise(kernel, lifeline))

    def _kernel(self, request: dict[str, Any], lifeline: int, status: int) -> int:
        os.close(lifeline)  # the supervisor watches it; user code never holds it
        os.setsid()
        self.jail.prctl(self.jail.PR_SET_DUMPABLE, 1)
        os.write(status, b"ok")
        os.close(status)
        return _run_kernel(request, None)

    def exit_code(self, code: int) -> int:
        """A supervisor's exit code as ``Popen`` would give the kernel's (``-N`` for signal N)."""
        return -(code - self.jail.SIGNAL_BASE) if code > self.jail.SIGNAL_BASE else code


def _read_all(fd: int, timeout: float) -> bytes:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    data = b""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        if not poller.poll(remaining * 1000):
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data


def _reap(children: set[int], jailer: Jailer | None) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in children:  # not a jailed child whose set-up failed (that fork was answered with an error)
            children.discard(pid)
            code = _exit_code(status)
            _send({"exit": pid, "code": code if jailer is None else jailer.exit_code(code)})


def main() -> None:
    """Import, report ready, then serve fork requests until stdin closes."""
    modules = json.loads(sys.argv[1])
    lifeline = int(sys.argv[2])
    jail = _load_forkjail()
    jailer = Jailer(jail) if sys.argv[3:] == ["jail"] else None
    _preload(modules)
    # What the imports made stays shared with every kernel: the collector no longer writes
    # to those objects' headers (each write would copy a page into the child).
    gc.collect()
    gc.freeze()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the bot's to handle
    _send({"ready": os.getpid(), "threads": _thread_count()})
    children: set[int] = set()
    buffer = b""
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
            _reap(children, jailer)
        if 0 not in readable:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            try:
                if jailer is not None:
                    pid = jailer.fork(request, lifeline, (wake_r, wake_w))
                else:
                    pid = _fork(request, lifeline, (wake_r, wake_w), jail)
            except Exception as exc:
                _send({"id": request["id"], "error": f"{type(exc).__name__}: {exc}"})
                continue
            children.add(pid)
            _send({"id": request["id"], "pid": pid})
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                raise


if __name__ == "__main__":
    main()
