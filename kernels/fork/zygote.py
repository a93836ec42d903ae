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
(:mod:`kernels.fork.jail`): the zygote forks it into the pid namespace of a small
supervisor that a helper, forked before the zygote's imports, made ahead (:class:`Jailer`),
and the fork is answered only once the kernel process has dropped its privileges, or with
the error that stopped it. In both profiles the zygote then says when
the kernel has bound its sockets: the bot's channels connect at their first try (ZMQ retries
a refused connect only after a while). The zygote never waits on one kernel: it forks the
next meanwhile (:class:`_Server`). In both profiles every child joins a new session keyring
and raises its ``oom_score_adj`` before any user code (:func:`kernels.fork.jail.isolate`);
the bot moves it into the kernel's cgroup once the fork is answered
(:mod:`kernels.host.cgroups`).

Protocol: JSON lines. The zygote writes ``{"ready": pid, "threads": n}`` once its imports
are done, then reads fork requests ``{"id", "argv", "cwd", "env", "log", "limits"}`` from
stdin and answers each ``{"id", "pid"}`` (jailed: ``{"id", "pid", "supervisor"}``, the
host pid of pid 1 of the kernel's namespace) or ``{"id", "error"}`` in the order its kernels
report, then ``{"bound": pid}`` once that kernel's sockets are bound; whenever an answered
child exits it
writes ``{"exit": pid, "code": returncode}`` (``-signal`` when killed, like ``Popen``).
When stdin closes it kills what it forked and exits; when its helper has died it exits
leaving its kernels running (the bot starts a new zygote).

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

import collections
import errno
import gc
import importlib
import importlib.util
import json
import os
import resource
import select
import signal
import socket
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
#: A jailed kernel's pid in its supervisor's namespace (the first process forked into it).
KERNEL_PID = 2
#: Supervisors made ahead of need (each a small process waiting with its pid namespace): in
#: a burst the zygote takes one and forks while the helper makes the next.
SUPERVISORS_AHEAD = 2


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


class HelperGone(Exception):
    """The supervisors' helper has exited: this zygote can jail no more kernels."""


class _Supervisor(NamedTuple):
    """A supervisor made ahead of its kernel, waiting: its pid, an fd of its pid namespace,
    and the write end of its control pipe (the kernel's ``jail`` once the kernel is forked;
    EOF: exit)."""

    pid: int
    namespace: int
    control: int


class Jailer:
    """Forks kernels into their own namespaces and uid (the sandboxed profile, :mod:`kernels.fork.jail`).

    One fork of the zygote's size a kernel. A small *helper*, forked before the zygote's
    imports (:meth:`start_helper`), makes supervisors ahead of need, one at a time: for each it
    forks an anchor that unshares a pid namespace and forks the supervisor, its pid 1, which
    leaves the host's view and waits on its control pipe. For a request the zygote enters the
    waiting supervisor's namespace (``setns``) and forks the kernel there (pid 2), which
    builds its own jail and drops its privileges before any user code; then it sends the
    supervisor the kernel's ``jail`` (the supervisor takes the kernel's uid and reaps the
    namespace's orphans until the kernel exits or the bot is gone, which ends the namespace)
    and asks the helper for the next one. The zygote reaps the kernel itself.

    The zygote's pid namespace for children stays the last kernel's: in the user-namespace
    profile (bot not root) it may not re-enter its own (that needs root on the host), so every
    fork it makes is preceded by entering the namespace the fork is for.
    """

    def __init__(self, jail: Any) -> None:
        self.jail = jail
        self._helper: socket.socket | None = None
        #: The helper's pid (0: not started).
        self.helper_pid = 0
        self._ready: collections.deque[_Supervisor] = collections.deque()
        #: Supervisors asked for and not received yet.
        self.asked = 0

    @property
    def helper_fd(self) -> int:
        """The zygote's end of the helper's socket (readable: a supervisor came)."""
        if self._helper is None:
            raise HelperGone("the supervisors' helper was not started")
        return self._helper.fileno()

    def start_helper(self, lifeline: int) -> None:
        """Fork the supervisors' helper (call before the imports: it stays small) and ask it
        for the first supervisor."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        _single_threaded()
        pid = os.fork()
        if pid == 0:
            mine.close()
            _child(lambda: self._serve_supervisors(theirs, lifeline))
        theirs.close()
        self._helper, self.helper_pid = mine, pid
        self._ask()

    def fork(self, request: dict[str, Any]) -> tuple[int, int, int]:
        """Fork ``request``'s kernel into a waiting supervisor's pid namespace; its pid, the
        status pipe on which the kernel reports (:data:`DROPPED`, then :data:`BOUND`) or the
        error that stopped its start comes, and the supervisor's pid. Raises
        :class:`HelperGone` when the helper is gone."""
        for _ in range(SUPERVISORS_AHEAD + 1):  # each waiting one may have been killed meanwhile
            try:
                return self._fork_into(self._take(), request)
            except _SupervisorGone:
                continue
        raise RuntimeError("the kernels' supervisors died before a kernel was forked")

    def collect(self) -> None:
        """Receive a supervisor asked for (blocks until it comes); an error is logged."""
        try:
            self._ready.append(self._receive())
        except RuntimeError as exc:
            print(f"no supervisor made ahead: {exc}", file=sys.stderr)

    def close(self) -> None:
        """Let the helper and the waiting supervisors go (each exits when its end closes;
        supervisors of running kernels stay)."""
        while self._ready:
            supervisor = self._ready.popleft()
            os.close(supervisor.namespace)
            os.close(supervisor.control)
        if self._helper is not None:
            self._helper.close()
            self._helper = None

    def _ask(self) -> None:
        """Ask the helper for as many supervisors as keep :data:`SUPERVISORS_AHEAD` coming."""
        if self._helper is None:
            raise HelperGone("the supervisors' helper was not started")
        while len(self._ready) + self.asked < SUPERVISORS_AHEAD:
            try:
                self._helper.send(b"supervisor")
            except OSError as exc:
                raise HelperGone(f"the supervisors' helper is gone: {exc}") from exc
            self.asked += 1

    def _take(self) -> _Supervisor:
        """A waiting supervisor (another is asked for at once, to be ready for a later kernel);
        raises what stopped the helper making one."""
        if not self._ready:
            self._ask()
            self._ready.append(self._receive())
        supervisor = self._ready.popleft()
        self._ask()
        return supervisor

    def _receive(self) -> _Supervisor:
        if self._helper is None:
            raise HelperGone("the supervisors' helper was not started")
        self.asked -= 1
        try:
            data, fds, _, _ = socket.recv_fds(self._helper, 65536, 2)
        except OSError as exc:
            raise HelperGone(f"the supervisors' helper is gone: {exc}") from exc
        if not data:
            raise HelperGone("the supervisors' helper is gone")
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise RuntimeError(json.loads(data).get("error", "the supervisors' helper sent no namespace"))
        return _Supervisor(json.loads(data)["supervisor"], *fds)

    def _fork_into(self, supervisor: _Supervisor, request: dict[str, Any]) -> tuple[int, int, int]:
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        try:
            self.jail.setns(supervisor.namespace, self.jail.CLONE_NEWPID)
            _single_threaded()
            pid = os.fork()
        except BaseException as exc:
            for fd in (status_r, status_w, supervisor.control):  # the supervisor exits on EOF
                os.close(fd)
            if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:  # a namespace without its pid 1
                raise _SupervisorGone() from exc
            raise
        finally:
            os.close(supervisor.namespace)
        if pid == 0:
            _child(lambda: self._kernel(request, status_w))
        os.close(status_w)
        try:
            os.write(supervisor.control, (json.dumps(request["jail"]) + "\n").encode())
        except BrokenPipeError:  # it died after the fork: the kernel's namespace ends, the kernel with it
            pass
        os.close(supervisor.control)
        return pid, status_r, supervisor.pid

    def _serve_supervisors(self, sock: socket.socket, lifeline: int) -> int:
        """(Helper) make a supervisor for each message (through an anchor); reap both (the
        helper is their subreaper); exit when the zygote's socket closes."""
        jail = self.jail
        jail.prctl(jail.PR_SET_PDEATHSIG, signal.SIGKILL)
        jail.prctl(jail.PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):  # the zygote's requests and answers are not the helper's to touch
            os.dup2(null, fd)
        os.close(null)
        wake_r, wake_w = jail.wake_on_children()
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        while True:
            try:
                events = dict(poller.poll())
            except InterruptedError:
                continue
            if wake_r in events:
                jail.drain(wake_r)
                for _ in _reaped():
                    pass
            if sock.fileno() not in events:
                continue
            if not sock.recv(65536):
                return 0
            try:
                anchor = os.fork()
            except OSError as exc:
                sock.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
                continue
            if anchor == 0:
                _child(lambda: self._anchor(sock, lifeline, (wake_r, wake_w)))

    def _anchor(self, sock: socket.socket, lifeline: int, close: tuple[int, ...]) -> int:
        """(Helper's child) create a pid namespace, fork its pid 1 (the supervisor), send the
        zygote the namespace and the supervisor's control pipe, exit (the helper adopts the
        supervisor)."""
        jail = self.jail
        try:
            _detach(close)
            jail.unshare(jail.CLONE_NEWPID)
            control_r, control_w = os.pipe2(os.O_CLOEXEC)
            supervisor = os.fork()
        except BaseException as exc:
            sock.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
            raise
        if supervisor == 0:
            _child(lambda: self._supervise(lifeline, control_r))
        os.close(control_r)
        namespace = os.open("/proc/self/ns/pid_for_children", os.O_RDONLY | os.O_CLOEXEC)
        socket.send_fds(sock, [json.dumps({"supervisor": supervisor}).encode()], [namespace, control_w])
        return 0

    def _supervise(self, lifeline: int, control: int) -> int:
        """(Supervisor, pid 1) leave the host's view; once the zygote has forked the kernel
        (pid 2 here) and sent its ``jail``, take the kernel's uid and reap the namespace's
        orphans until the kernel or the bot is gone."""
        jail = self.jail
        _detach(())
        jail.close_fds({lifeline, control})
        jail.leave_host_view()
        data = b""
        while not data.endswith(b"\n"):
            if not (chunk := os.read(control, 65536)):  # not needed after all
                return 0
            data += chunk
        os.close(control)
        spec = json.loads(data)
        jail.isolate(spec)
        jail.take_identity(spec, dumpable=False)
        try:
            kernel = os.pidfd_open(KERNEL_PID)
        except ProcessLookupError:  # already gone
            return 0
        jail.supervise(kernel, lifeline)
        return 0

    def _kernel(self, request: dict[str, Any], status: int) -> int:
        """(Kernel process, root, pid 2 of its supervisor's namespace) close every descriptor
        of the zygote's (the lifeline too: the supervisor watches it, user code never holds
        it), build the jail, drop privileges, say so on ``status``, become the kernel."""
        jail, spec = self.jail, request["jail"]
        try:
            _detach(())
            jail.close_fds({status})
            jail.isolate(spec)  # own session keyring, high OOM score
            jail.build(spec)
            _log_output(request)
            jail.take_identity(spec, dumpable=True)
        except BaseException as exc:
            os.write(status, f"{type(exc).__name__}: {exc}".encode())
            raise
        os.write(status, DROPPED)
        return _run_kernel(request, None, status)


class _SupervisorGone(Exception):
    """The waiting supervisor died before its kernel was forked."""


class _Start:
    """A kernel whose sockets are not bound yet: its reports are still to come on ``status``."""

    __slots__ = ("request_id", "pid", "status", "supervisor", "deadline", "data", "answered", "exit_code")

    def __init__(self, request_id: Any, pid: int, status: int, supervisor: int, *, answered: bool) -> None:
        self.request_id, self.pid, self.status = request_id, pid, status
        self.supervisor = supervisor  # jailed: pid 1 of the kernel's pid namespace (else 0)
        self.deadline = time.monotonic() + JAIL_TIMEOUT_S
        self.data = b""
        self.answered = answered  # the bot has its pid
        self.exit_code: int | None = None  # reaped before it was answered


class _Server:
    """The zygote's loop: fork on request; answer each fork once its kernel has dropped its
    privileges and say when it has bound its sockets (forks overlap: the loop never waits on
    one kernel); report every answered child's exit."""

    def __init__(self, lifeline: int, jail: Any, jailer: Jailer | None) -> None:
        self.lifeline, self.jail, self.jailer = lifeline, jail, jailer
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.children: set[int] = set()  # answered, running
        self.starts: dict[int, _Start] = {}  # by status pipe

    def serve(self) -> None:
        """Serve fork requests from stdin until it closes, then kill what was forked."""
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        buffer = b""
        while True:
            deadlines = [start.deadline for start in self.starts.values() if not start.answered]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            waiting = [self.jailer.helper_fd] if self.jailer is not None and self.jailer.asked > 0 else []
            try:
                readable, _, _ = select.select([0, self.wake_r, *self.starts, *waiting], [], [], timeout)
            except InterruptedError:
                continue
            if waiting and waiting[0] in readable:
                assert self.jailer is not None
                self.jailer.collect()
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
        try:
            if self.jailer is not None:
                pid, status, supervisor = self.jailer.fork(request)
            else:
                pid, status = _fork(request, self.lifeline, (self.wake_r, self.wake_w), self.jail)
                supervisor = 0
        except Exception as exc:
            _send({"id": request["id"], "error": f"{type(exc).__name__}: {exc}"})
            if isinstance(exc, HelperGone):
                raise
            return
        start = _Start(request["id"], pid, status, supervisor, answered=self.jailer is None)
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
            _send({"id": start.request_id, "pid": start.pid, "supervisor": start.supervisor})
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
            if pid in self.children:
                self.children.discard(pid)
                _send({"exit": pid, "code": code})
            elif pid in unanswered:  # its report (read next) says how the start went
                unanswered[pid].exit_code = code
            elif self.jailer is not None and pid == self.jailer.helper_pid:
                raise HelperGone(f"the supervisors' helper exited ({code})")


def main() -> None:
    """Import, report ready, then serve fork requests until stdin closes."""
    modules = json.loads(sys.argv[1])
    lifeline = int(sys.argv[2])
    kernel_argv = json.loads(sys.argv[3])
    jail = _load_forkjail()
    jailer = Jailer(jail) if sys.argv[4:] in (["jail"], ["userns"]) else None
    if jailer is not None:
        jailer.start_helper(lifeline)  # before the imports: the helper stays small
    _preload(modules)
    _prepare_app(kernel_argv, inline="matplotlib" in modules)
    _prime()
    _share_module_names()
    # What the imports made stays shared with every kernel: the collector no longer writes
    # to those objects' headers (each write would copy a page into the child).
    gc.collect()
    gc.freeze()
    server = _Server(lifeline, jail, jailer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the bot's to handle
    _send({"ready": os.getpid(), "threads": _thread_count()})
    try:
        server.serve()
    except HelperGone as exc:  # the kernels it forked run on; the bot starts a new zygote
        print(f"{exc}: the fork server exits", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
