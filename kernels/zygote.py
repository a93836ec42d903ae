"""The fork server's own program ("zygote"): import once, fork a fresh ipykernel per request.

Run as ``python -P kernels/zygote.py PRELOAD_JSON LIFELINE_FD`` by
:class:`kernels.forkserver.ForkServer`; it imports nothing from this project, so a kernel's
``sys.modules`` holds only what a spawned kernel would have plus the preloaded modules.

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
only in the bot, so when the bot dies every kernel sees EOF and kills its process group,
while a zygote that dies (and is restarted) leaves running kernels alone.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import resource
import select
import signal
import sys
import threading
import traceback
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


def _preload(modules: list[str]) -> None:
    for name in ["ipykernel.kernelapp", "ipykernel.ipkernel", "IPython", *modules]:
        importlib.import_module(name)
    if "matplotlib" in modules:
        importlib.import_module("matplotlib.pyplot")
        importlib.import_module("matplotlib_inline.backend_inline")


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


def _run_child(request: dict[str, Any], lifeline: int, wake_fds: tuple[int, int]) -> int:
    signal.set_wakeup_fd(-1)
    for fd in wake_fds:
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setsid()
    log_fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(null_fd)
    os.close(log_fd)
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
    threading.Thread(target=_watch_lifeline, args=(lifeline,), name="lifeline", daemon=True).start()
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(request["argv"])
    app.start()
    return 0


def _fork(request: dict[str, Any], lifeline: int, wake_fds: tuple[int, int]) -> int:
    threads = _thread_count()
    if threads != 1:
        raise RuntimeError(f"the fork server has {threads} threads; refusing to fork")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = _run_child(request, lifeline, wake_fds)
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
    return 0  # not reached


def _reap(children: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _send({"exit": pid, "code": _exit_code(status)})


def main() -> None:
    """Import, report ready, then serve fork requests until stdin closes."""
    modules = json.loads(sys.argv[1])
    lifeline = int(sys.argv[2])
    _preload(modules)
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
            _reap(children)
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
                pid = _fork(request, lifeline, (wake_r, wake_w))
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
