"""The fork server's own program ("zygote"): import once, fork a fresh ipykernel per request.

Run as ``python -P kernels/fork/zygote.py PRELOAD_JSON LIFELINE_FD KERNEL_ARGV_JSON [jail|userns]`` by
:class:`kernels.forking.launcher.ForkServer`; it imports nothing from this project but its sibling
``jail.py`` (standard library only), so a kernel's ``sys.modules`` holds only what a
spawned kernel would have plus the preloaded modules. Before it serves it imports what
every kernel imports while it starts (:data:`KERNEL_IMPORTS`), resolves matplotlib's inline
backend, and freezes its heap (``gc.freeze``). With the ipykernel release it knows it also
makes the kernel application (configuration from ``KERNEL_ARGV_JSON``, the kernels' command
line but ``-f``) and its shell, matplotlib's inline backend turned on
(:func:`_prepare_app`): a child then only opens its sockets, makes its kernel object and
takes its identity (:func:`_start_prepared`).

With ``jail`` or ``userns`` (the sandboxed profile, the bot root or not; the zygote then runs
inside bubblewrap, see :func:`kernels.sandbox.args.zygote_args`) every request carries a
``"jail"`` object (uid, gid, host paths of the workspace, run dir and data dir, tmpfs sizes)
and the child enters its own namespaces and uid before any user code
(:mod:`kernels.fork.jail`); the request goes to a supervisor forked before it came
(:class:`Jailer`), and the fork is answered only once the kernel process has dropped its
privileges, or with the error that stopped it. In both profiles the zygote then says when
the kernel has bound its sockets: the bot's channels connect at their first try (ZMQ retries
a refused connect only after a while). The zygote never waits on one kernel: it forks the
next meanwhile (:class:`_Server`). In both profiles every child joins a new session keyring
and raises its ``oom_score_adj`` before any user code (:func:`kernels.fork.jail.isolate`);
the bot moves it into the kernel's cgroup once the fork is answered
(:mod:`kernels.host.cgroups`).

Protocol: JSON lines. The zygote writes ``{"ready": pid, "threads": n}`` once its imports
are done, then reads fork requests ``{"id", "argv", "cwd", "env", "log", "limits"}`` from
stdin and answers each ``{"id", "pid"}`` (or ``{"id", "error"}``) in the order its kernels
report, then ``{"bound": pid}`` once that kernel's sockets are bound; whenever an answered
child exits it
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
the bot's kernel warden (``kernels/host/warden.py``) kills and thaws it instead.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, NoReturn


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
#: and kernel, what ``IPKernelApp.initialize`` imports besides (pdb, sqlite3 for the history,
#: psutil for usage replies, IPython's magics; not the debugger's backend:
#: :func:`_without_debugger`) and Threadbook's kernel code (``setup()``, the snapshot
#: restore). Measured (bench ``fork_path``): a child's ``initialize`` went from ~107 to
#: ~49 ms. None of them starts a thread (checked before every fork).
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
    "threadbook_kernel.charts",
    "threadbook_kernel.frames",
    "threadbook_kernel.interrupts",
)
#: ipykernel's debugger backend: never imported by the zygote (:func:`_without_debugger`).
DEBUGGER_BACKEND = "debugpy"
#: When the last fork began (this process's clock), kept by the child in its trace.
_forking_at = 0.0


def _without_debugger() -> None:
    """Import ipykernel's debugger module with its backend (debugpy) blocked: ipykernel then
    decides, once, that it has no debugger. The backend serves a notebook front end's debug
    requests, and the bot sends none; imported, it is ~130 modules and ~7 MiB of the zygote's
    memory, whose page tables every fork copies (measured: ~160 fewer page faults and ~2 ms
    less CPU a forked kernel in a crowd). Unblocked afterwards: a cell may still import it."""
    if DEBUGGER_BACKEND in sys.modules:
        return
    sys.modules[DEBUGGER_BACKEND] = None  # type: ignore[assignment]  # an import raises ImportError
    try:
        importlib.import_module("ipykernel.debugger")
    except ImportError:  # no ipykernel, or a release that needs debugpy: imported as before below
        pass
    finally:
        if sys.modules.get(DEBUGGER_BACKEND, False) is None:
            del sys.modules[DEBUGGER_BACKEND]


def _preload(modules: list[str]) -> None:
    _without_debugger()
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


#: The kernel application made before any fork (:func:`_prepare_app`), and the ipykernel
#: command line (after ``-f``) it was made for; None: each child makes its own.
_prepared: Any = None
_prepared_argv: list[str] = []
#: The ipykernel release whose start :func:`_prepare_app` and :func:`_start_prepared` split.
PREPARED_IPYKERNEL = "7."


class _ModuleFiles:
    """A module as ``IPythonKernel.__init__`` looks at it: its file only."""

    __slots__ = ("__file__",)

    def __init__(self, path: str) -> None:
        self.__file__ = path


class _KernelInitSys:
    """``sys`` as ipykernel's kernel module sees it while a forked kernel is made: ``modules``
    is the zygote's list of module files, made once before any fork (a few pages), instead of
    ``sys.modules``, whose every module object the kernel's ``__init__`` touches (its
    reference count), copying ~1,700 pages of the zygote into each kernel (~7 MiB, ~10 ms)."""

    def __init__(self, modules: dict[str, _ModuleFiles]) -> None:
        self.modules = modules

    def __getattr__(self, name: str) -> Any:
        return getattr(sys, name)


def _prepare_app(kernel_argv: list[str], inline: bool) -> None:
    """(Zygote) make the kernel application, its configuration and its shell once, before any
    fork: a forked kernel then only opens its sockets and makes its kernel object
    (:func:`_start_prepared`). ``kernel_argv``: the ipykernel command line every kernel gets
    (but ``-f``); ``inline``: set up matplotlib's inline backend on that shell here too (the
    kernels' ``%matplotlib inline``, but the event loop, which needs the kernel). Only for the
    ipykernel release the split was written for; where making them fails, every child makes
    its own."""
    global _prepared, _prepared_argv, _inline_gui
    try:
        ipykernel: Any = importlib.import_module("ipykernel")
        if not ipykernel.__version__.startswith(PREPARED_IPYKERNEL):
            return
        application: Any = importlib.import_module("IPython.core.application")
        compiler: Any = importlib.import_module("ipykernel.compiler")
        kernelapp: Any = importlib.import_module("ipykernel.kernelapp")
        zmqshell: Any = importlib.import_module("ipykernel.zmqshell")
        app = kernelapp.IPKernelApp.instance()
        application.BaseIPythonApplication.initialize(app, kernel_argv)  # command line, profile, config files
        app.init_pdb()
        shell = zmqshell.ZMQInteractiveShell.instance(
            parent=app, profile_dir=app.profile_dir, compiler_class=compiler.XCachingCompiler
        )
    except Exception:
        traceback.print_exc()  # the zygote's log; every child starts the usual way
        for module, name in (("ipykernel.kernelapp", "IPKernelApp"), ("ipykernel.zmqshell", "ZMQInteractiveShell")):
            cls = getattr(sys.modules.get(module), name, None)
            if cls is not None:
                cls.clear_instance()
        return
    if inline and "%matplotlib inline" in app.exec_lines:
        try:
            _inline_gui = _enable_inline(shell)
            app.exec_lines = [line for line in app.exec_lines if line != "%matplotlib inline"]
        except Exception:
            traceback.print_exc()  # the exec line still runs it, in each child
    display = sys.modules.get("threadbook_kernel.display")
    if display is not None:
        display.install()  # idempotent: the kernel's own set-up finds it done
    _prepared, _prepared_argv = app, list(kernel_argv)


def _share_module_names() -> None:
    """(Zygote, after the last import) give ``sys.modules`` keys that lie together, and make
    the module list a forked kernel's ``IPythonKernel.__init__`` reads (:class:`_KernelInitSys`).

    A module's name string sits wherever its import put it, next to the module's other
    objects. Each kernel copies ``sys.modules`` or its keys once while it starts (ipykernel's
    list of module files, IPython's ``set(sys.modules.keys())``), and each copy raises every
    key's reference count: with the imports' names that wrote to ~470 pages spread over the
    zygote's heap, copied into every kernel (~1.5 ms a start). Copies of the names made one
    after another fill a few dozen pages instead. Nothing looks a module up by its key's
    identity, only by its value."""
    for name in list(sys.modules):
        sys.modules[_new_copy(name)] = sys.modules.pop(name)
    if _prepared is None:
        return
    files = {
        name: _ModuleFiles(_new_copy(path))  # the paths lie together too
        for name, module in list(sys.modules.items())
        if isinstance(path := getattr(module, "__file__", None), str) and path
    }
    _kernel_module_sys[0] = _KernelInitSys(files)


def _new_copy(text: str) -> str:
    """A new string object equal to ``text``, made now (next to the others made now), not
    ``text`` itself (slicing all of a string or joining one part gives back the same object;
    a one-character one stays the interpreter's shared one)."""
    return "".join([text[:1], text[1:]])


def _prime() -> None:
    """(Zygote) the first cell's first-time work, done once for every kernel forked from here
    (``threadbook_kernel.prime``; nothing without the prepared shell)."""
    runtime = sys.modules.get("threadbook_kernel")
    if _prepared is None or runtime is None:
        return
    try:
        runtime.prime()
    except Exception:
        traceback.print_exc()  # each kernel does it in its first cell instead


def _enable_inline(shell: Any) -> Any:
    """``shell.enable_matplotlib("inline")`` (IPython 9) without its last step, the event loop,
    which needs a kernel (the child turns it on, :func:`_start_prepared`); the GUI it names."""
    pylabtools: Any = importlib.import_module("IPython.core.pylabtools")
    backend_inline: Any = importlib.import_module("matplotlib_inline.backend_inline")
    gui, backend = pylabtools.find_gui_and_backend("inline", shell.pylab_gui_select)
    if gui is not None and shell.pylab_gui_select is None:
        shell.pylab_gui_select = gui
    pylabtools.activate_matplotlib(backend)
    backend_inline.configure_inline_support(shell, backend)
    shell.magics_manager.registry["ExecutionMagics"].default_runner = pylabtools.mpl_runner(shell.safe_execfile)
    return gui


#: The GUI of the inline backend set up before the fork (its event loop is turned on in each child).
_inline_gui: Any = None


#: The ``sys`` a forked kernel's ``IPythonKernel.__init__`` sees (:class:`_KernelInitSys`).
_kernel_module_sys: list[Any] = [None]


def _start_prepared(connection_file: str, bound: Callable[[], None]) -> Any:
    """(Child) the rest of ``IPKernelApp.initialize`` (ipykernel 7) for the application the
    zygote made: sockets (then ``bound()``), streams, signals, the kernel object (the shell it
    finds is the one made before the fork), the exec lines. Returns the application."""
    ipkernel: Any = importlib.import_module("ipykernel.ipkernel")
    app = _prepared
    app.connection_file = connection_file
    app.init_blackhole()
    app.init_connection_file()
    app.init_poller()
    app.init_sockets()
    bound()
    app.init_heartbeat()
    app.write_connection_file()
    app.log_connection_info()
    app.init_io()
    try:
        app.init_signal()
    except Exception:
        traceback.print_exc()
    ipkernel.sys = _kernel_module_sys[0] or sys
    try:
        app.init_kernel()
    finally:
        ipkernel.sys = sys
    shell = app.kernel.shell
    if shell is not type(shell).instance():
        raise RuntimeError("the kernel did not take the shell made before the fork")
    shell.kernel = app.kernel  # what the kernel would have passed to a shell it made
    shell.init_environment()  # the environment was replaced after the fork
    if _inline_gui is not None:
        shell.enable_gui(_inline_gui)
    app.init_path()
    app.init_shell()
    app.init_gui_pylab()
    app.init_extensions()
    app.init_code()
    sys.stdout.flush()
    sys.stderr.flush()
    return app


#: How long the zygote waits for a jailed child to report that its kernel dropped privileges.
JAIL_TIMEOUT_S = 10.0
#: What a kernel writes on its status pipe: privileges dropped (jailed: the fork's answer),
#: sockets bound (then it closes the pipe).
DROPPED, BOUND = b"ok\n", b"bound\n"


def _await_request(request_fd: int, lifeline: int) -> dict[str, Any] | None:
    """(Spare supervisor) the fork request, one JSON line; None when its pipe closes first
    or the bot's lifeline reports EOF."""
    poller = select.poll()
    poller.register(request_fd, select.POLLIN)
    poller.register(lifeline, select.POLLIN)
    data = b""
    while not data.endswith(b"\n"):
        try:
            events = dict(poller.poll())
        except InterruptedError:
            continue
        if lifeline in events:
            return None
        if not (chunk := os.read(request_fd, 65536)):
            return None
        data += chunk
    os.close(request_fd)
    request: dict[str, Any] = json.loads(data)
    return request


def _reaped() -> Iterator[tuple[int, int]]:
    """Every child that has ended, reaped now: (pid, exit code as ``Popen`` gives it)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, _exit_code(status)


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


def _child(body: Callable[[], int]) -> NoReturn:
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


def _run_kernel(request: dict[str, Any], lifeline: int | None, status: int) -> int:
    """(Child) become the requested ipykernel; ``lifeline``: watch it here (unsandboxed
    profile); ``status``: the pipe on which to say :data:`BOUND` (then closed)."""

    def bound() -> None:
        nonlocal status
        if status >= 0:
            os.write(status, BOUND)
            os.close(status)
            status = -1

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
    argv = request["argv"]
    prepared = _prepared is not None and argv[:1] == ["-f"] and argv[2:] == _prepared_argv
    if prepared:
        app = _start_prepared(argv[1], bound)
    else:
        if _prepared is not None:  # the bot asks for kernels of one command line only
            raise RuntimeError(f"a kernel command line other than the one prepared: {argv[2:]!r}")
        from ipykernel.kernelapp import IPKernelApp

        app = IPKernelApp.instance()
        app.initialize(argv)  # type: ignore[no-untyped-call]  # ipykernel is untyped
        bound()
    # Wall-clock moments of this start, for the benchmark's fork-path breakdown.
    sys._threadbook_fork_trace = {  # type: ignore[attr-defined]
        "fork": _forking_at,
        "kernel": entered,
        "initialized": time.time(),
        "prepared": float(prepared),
    }
    app.start()
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


def _fork(request: dict[str, Any], lifeline: int, wake_fds: tuple[int, int], jail: Any) -> tuple[int, int]:
    """Fork a kernel (unsandboxed profile: answered at once); its pid and the status pipe on
    which it reports its sockets bound."""
    _single_threaded()
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except BaseException:
        os.close(status_r)
        os.close(status_w)
        raise
    if pid:
        os.close(status_w)
        return pid, status_r

    def body() -> int:
        _detach((*wake_fds, status_r))
        jail.isolate({})  # own session keyring, high OOM score
        _log_output(request)
        return _run_kernel(request, lifeline, status_w)

    _child(body)


class _Spare(NamedTuple):
    """A supervisor forked ahead of its request (:meth:`Jailer.fork`): it waits for the
    request on ``request`` (the zygote's write end); its reports come on ``status``."""

    pid: int
    request: int
    status: int


class Jailer:
    """Forks kernels into their own namespaces and uid (the sandboxed profile, :mod:`kernels.fork.jail`).

    A request goes to a *spare* supervisor, forked (and waiting) before the request came: a
    new kernel does not wait for the fork of a process the zygote's size (~5 ms). The zygote
    forks the next spare once it has been quiet a while (:data:`SPARE_IDLE_S`); in a burst
    each request forks its own supervisor, as it would without spares."""

    def __init__(self, jail: Any, *, userns: bool) -> None:
        """``userns``: the user-namespace profile (bot not root), as every request's jail says."""
        self.jail = jail
        self.userns = userns
        self.pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self._spare: _Spare | None = None
        #: Off once forking a spare failed or :data:`SPARES_LOST` in a row died unused.
        self._spares = True
        self._spares_lost = 0

    def fork(self, request: dict[str, Any], lifeline: int, wake_fds: tuple[int, int]) -> tuple[int, int]:
        """Hand ``request`` to a supervisor (pid 1 of a new pid namespace: a spare one, else
        forked now) that builds the jail and forks the kernel; its pid and the status pipe on
        which the kernel reports (:data:`DROPPED`, then :data:`BOUND`), or the error that
        stopped the start comes.

        User-namespace profile (bot not root): the zygote may not re-enter its own pid
        namespace after creating one (that needs root on the host), so an *anchor* child
        creates it and forks the supervisor; the anchor is what the bot sees and signals.
        """
        spare, self._spare = self._spare, None
        self._spares_lost = 0
        if spare is not None and self._hand_over(spare, request):
            return spare.pid, spare.status
        spare = self._fork_spare(lifeline, wake_fds)
        if not self._hand_over(spare, request):
            raise RuntimeError("the jail's supervisor exited before its request came")
        return spare.pid, spare.status

    @property
    def wants_spare(self) -> bool:
        """Whether a spare supervisor should be forked (none waits, spares not given up)."""
        return self._spares and self._spare is None

    def refill(self, lifeline: int, wake_fds: tuple[int, int]) -> None:
        """Fork the next spare supervisor if one is wanted; after a failure (logged) there are
        no more spares: every request forks its own supervisor."""
        if not self.wants_spare:
            return
        try:
            self._spare = self._fork_spare(lifeline, wake_fds)
        except Exception:
            traceback.print_exc()
            self._spares = False

    def lost(self, pid: int) -> None:
        """Child ``pid`` was reaped: if it was the spare, there is none now; after
        :data:`SPARES_LOST` in a row died unused no more are forked (something kills them)."""
        if self._spare is None or self._spare.pid != pid:
            return
        self.close()
        self._spares_lost += 1
        if self._spares_lost >= SPARES_LOST:
            print(f"{SPARES_LOST} spare supervisors died unused: no more spares", file=sys.stderr)
            self._spares = False

    def close(self) -> None:
        """Let the spare go (it exits when its request pipe closes)."""
        if self._spare is not None:
            os.close(self._spare.request)
            os.close(self._spare.status)
            self._spare = None

    @staticmethod
    def _hand_over(spare: _Spare, request: dict[str, Any]) -> bool:
        """Write ``request`` to ``spare``; False when it has exited (its pipes are closed then;
        its exit is reaped, not reported)."""
        data = (json.dumps(request) + "\n").encode()
        try:
            while data:
                data = data[os.write(spare.request, data) :]
        except OSError:
            os.close(spare.status)
            return False
        finally:
            os.close(spare.request)
        return True

    def _fork_spare(self, lifeline: int, wake_fds: tuple[int, int]) -> _Spare:
        _single_threaded()
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        request_r, request_w = os.pipe2(os.O_CLOEXEC)
        close = (*wake_fds, status_r, request_w, self.pid_namespace)
        try:
            pid: int = os.fork() if self.userns else self.jail.fork_jailed(self.pid_namespace)
        except BaseException:
            for fd in (status_r, status_w, request_r, request_w):
                os.close(fd)
            raise
        if pid == 0:
            body = self._anchor if self.userns else self._supervisor
            _child(lambda: body(request_r, lifeline, close, status_w))
        os.close(status_w)
        os.close(request_r)
        return _Spare(pid, request_w, status_r)

    def _anchor(self, request: int, lifeline: int, close: tuple[int, ...], status: int) -> int:
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
        os.close(request)
        os.close(status)
        os.close(lifeline)
        while True:
            try:
                _, code = os.waitpid(supervisor, 0)
            except InterruptedError:
                continue
            return jail.SIGNAL_BASE + os.WTERMSIG(code) if os.WIFSIGNALED(code) else os.WEXITSTATUS(code)

    def _supervisor(self, request_fd: int, lifeline: int, close: tuple[int, ...], status: int) -> int:
        jail = self.jail
        try:
            _detach(close)
        except BaseException as exc:
            os.write(status, f"{type(exc).__name__}: {exc}".encode())
            raise
        request = _await_request(request_fd, lifeline)
        if request is None:  # not needed after all (the zygote or the bot is gone)
            return 0
        spec = request["jail"]
        try:
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
        os.write(status, DROPPED)
        return _run_kernel(request, None, status)

    def exit_code(self, code: int) -> int:
        """A supervisor's exit code as ``Popen`` would give the kernel's (``-N`` for signal N)."""
        return -(code - self.jail.SIGNAL_BASE) if code > self.jail.SIGNAL_BASE else code


class _Start:
    """A kernel whose sockets are not bound yet: its reports are still to come on ``status``."""

    __slots__ = ("request_id", "pid", "status", "deadline", "data", "answered", "exit_code")

    def __init__(self, request_id: Any, pid: int, status: int, *, answered: bool) -> None:
        self.request_id, self.pid, self.status = request_id, pid, status
        self.deadline = time.monotonic() + JAIL_TIMEOUT_S
        self.data = b""
        self.answered = answered  # the bot has its pid
        self.exit_code: int | None = None  # reaped before it was answered


#: How long the zygote must have had nothing to do before it forks a spare supervisor: not
#: while kernels start (the fork would take CPU from them), and not while turns come one
#: after another; in a burst every request forks its own.
SPARE_IDLE_S = 0.05
#: Spare supervisors that may die unused in a row before the zygote stops forking them.
SPARES_LOST = 3


class _Server:
    """The zygote's loop: fork on request; answer each fork once its kernel has dropped its
    privileges and say when it has bound its sockets (forks overlap: the loop never waits on
    one kernel); report every answered child's exit."""

    def __init__(self, lifeline: int, jail: Any, jailer: Jailer | None) -> None:
        self.lifeline, self.jail, self.jailer = lifeline, jail, jailer
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.children: set[int] = set()  # answered, running
        self.starts: dict[int, _Start] = {}  # by status pipe
        #: When the loop last had something to do (a spare is forked only after a quiet while).
        self.busy_until = 0.0

    def serve(self) -> None:
        """Serve fork requests from stdin until it closes, then kill what was forked."""
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        buffer = b""
        while True:
            deadlines = [start.deadline for start in self.starts.values() if not start.answered]
            if self.jailer is not None and self.jailer.wants_spare and not self.starts:
                deadlines.append(self.busy_until + SPARE_IDLE_S)
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            try:
                readable, _, _ = select.select([0, self.wake_r, *self.starts], [], [], timeout)
            except InterruptedError:
                continue
            if self.wake_r in readable:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                self._reap()
            for fd in readable:
                if fd in self.starts:
                    self._read_report(self.starts[fd])
            self._expire()
            if self.starts or readable:
                self.busy_until = time.monotonic()
            elif self.jailer is not None and time.monotonic() >= self.busy_until + SPARE_IDLE_S:
                self.jailer.refill(self.lifeline, (self.wake_r, self.wake_w))
            if 0 not in readable:
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self._fork(json.loads(line))
        if self.jailer is not None:
            self.jailer.close()
        for pid in (*self.children, *(start.pid for start in self.starts.values())):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError as exc:
                if exc.errno != errno.ESRCH:
                    raise

    def _fork(self, request: dict[str, Any]) -> None:
        wake_fds = (self.wake_r, self.wake_w)
        try:
            if self.jailer is not None:
                pid, status = self.jailer.fork(request, self.lifeline, wake_fds)
            else:
                pid, status = _fork(request, self.lifeline, wake_fds, self.jail)
        except Exception as exc:
            _send({"id": request["id"], "error": f"{type(exc).__name__}: {exc}"})
            return
        start = _Start(request["id"], pid, status, answered=self.jailer is None)
        self.starts[status] = start
        if start.answered:
            self.children.add(pid)
            _send({"id": start.request_id, "pid": pid})

    def _read_report(self, start: _Start) -> None:
        chunk = os.read(start.status, 4096)
        if not chunk:  # closed: the kernel (or its set-up) ended before its sockets were bound
            self._close(start)
            if not start.answered:
                self._refuse(start, start.data.decode(errors="replace") or "the jailed kernel exited during set-up")
            return
        start.data += chunk
        if not start.answered and start.data.startswith(DROPPED):
            start.data = start.data[len(DROPPED) :]
            start.answered = True
            _send({"id": start.request_id, "pid": start.pid})
            if start.exit_code is None:
                self.children.add(start.pid)
            else:
                _send({"exit": start.pid, "code": start.exit_code})
        if start.answered and start.data.startswith(BOUND):
            self._close(start)
            _send({"bound": start.pid})

    def _expire(self) -> None:
        now = time.monotonic()
        for start in [start for start in self.starts.values() if not start.answered and start.deadline <= now]:
            self._close(start)
            self._refuse(start, f"the jailed kernel did not drop its privileges within {JAIL_TIMEOUT_S:.0f} s")

    def _close(self, start: _Start) -> None:
        del self.starts[start.status]
        os.close(start.status)

    def _refuse(self, start: _Start, error: str) -> None:
        if start.exit_code is None:
            os.kill(start.pid, signal.SIGKILL)  # reaped later, not reported: the bot never had it
        _send({"id": start.request_id, "error": error})

    def _reap(self) -> None:
        unanswered = {start.pid: start for start in self.starts.values() if not start.answered}
        for pid, code in _reaped():
            if self.jailer is not None:
                code = self.jailer.exit_code(code)
            if pid in self.children:
                self.children.discard(pid)
                _send({"exit": pid, "code": code})
            elif pid in unanswered:  # its report (read next) says how the start went
                unanswered[pid].exit_code = code
            elif self.jailer is not None:
                self.jailer.lost(pid)


def main() -> None:
    """Import, report ready, then serve fork requests until stdin closes."""
    modules = json.loads(sys.argv[1])
    lifeline = int(sys.argv[2])
    kernel_argv = json.loads(sys.argv[3])
    jail = _load_forkjail()
    jailer = Jailer(jail, userns=sys.argv[4] == "userns") if sys.argv[4:] in (["jail"], ["userns"]) else None
    _preload(modules)
    _prepare_app(kernel_argv, inline="matplotlib" in modules)
    _prime()
    _share_module_names()
    # What the imports made stays shared with every kernel: the collector no longer writes
    # to those objects' headers (each write would copy a page into the child).
    gc.collect()
    gc.freeze()
    server = _Server(lifeline, jail, jailer)
    if jailer is not None:
        jailer.refill(lifeline, (server.wake_r, server.wake_w))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the bot's to handle
    _send({"ready": os.getpid(), "threads": _thread_count()})
    server.serve()


if __name__ == "__main__":
    main()
