"""Where a crowd's CPU goes: the bot's by phase of a turn, its kernels' by what they did, the
fork server's, the one-shots' (issue 44).

:class:`CpuMeter` is installed around one burst of a scenario (the bench only; nothing here is
part of the bot):

* **the bot's process**, user + system, split by the phase of a turn that ran it. A phase is a
  context variable (:data:`PHASE`) set by wrappers around the methods that make the phase
  (:data:`PHASE_METHODS`: getting the thread's kernel, thawing, the cell, freezing, the save,
  the status and live edits, posting, the model, the store); every callback of the event loop
  (``asyncio.events.Handle._run``: task steps included) and every job of the default executor
  (``asyncio.to_thread``) is timed with ``time.thread_time()`` and counted to the phase in
  force in its context. The bench's requests to the fakes (Slack, the model: their own
  process, :mod:`bench.world`) run under the phase ``fakes`` and are counted apart. Threads
  of their own are counted by name (the
  store's worker, the quota probe: ``execute``); what the event loop spends outside callbacks
  (``epoll``, scheduling) is ``event loop``.
* **kernels**: the CPU each thread's kernel used while a phase's work held it (the session
  reads its kernel's cgroup counter after every piece of work: that reading is caught), and
  the rest of the kernels' CPU (starting, warming up) as ``kernel starts``;
* **the fork server**, the **kernel warden**, **one-shots** (their server and the processes
  it forks, or fresh processes the bot reaped) and the **fakes** from the process tree.

All figures are CPU seconds over the burst; :meth:`CpuMeter.report` divides them by the turns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import resource
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psutil

#: The phases of a turn that is running, innermost last (empty: none of them).
PHASE: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("bench_phase", default=())

#: The rows of the report, in order.
PHASES = (
    "intake",
    "turn",
    "lease/thaw",
    "execute",
    "freeze",
    "save",
    "live edits",
    "model",
    "posting",
    "store",
    "event loop",
    "other threads",
    "kernel starts",
    "fakes",
)
#: Phases whose kernel CPU is the thread's kernel working for them (the first one of these
#: among the phases in force takes the kernel's CPU: a freeze ends an execution's work).
KERNEL_WORK = ("execute", "save", "lease/thaw")

#: (module, class, method, phase): the methods that make a phase while they run.
PHASE_METHODS = (
    ("bot.turn", "TurnRunner", "run", "turn"),
    ("kernels.pool.pool", "KernelPool", "get_or_start", "lease/thaw"),
    ("kernels.session.process", "KernelProcess", "thaw", "lease/thaw"),
    ("kernels.session.session", "KernelSession", "execute", "execute"),
    ("kernels.session.process", "KernelProcess", "_freeze", "freeze"),
    ("kernels.session.session", "KernelSession", "save_state", "save"),
    ("bot.live", "LiveCell", "step", "live edits"),
    ("bot.live", "LiveCell", "ran", "live edits"),
    ("bot.live", "LiveCell", "_tick", "live edits"),
    ("adapters.slack.outbox", "SlackProgress", "start", "live edits"),
    ("adapters.slack.outbox", "SlackProgress", "update", "live edits"),
    ("adapters.slack.outbox", "SlackProgress", "finish", "posting"),
    ("adapters.slack.outbox", "SlackOutbox", "post", "posting"),
    ("bot.agent.llm", "LLMClient", "complete", "model"),
    ("bot.database", "_SQLite", "read", "store"),
    ("bot.database", "_SQLite", "write", "store"),
    ("bot.database", "_Postgres", "read", "store"),
    ("bot.database", "_Postgres", "write", "store"),
)
#: Threads of the bot's process counted to a phase by their name (prefix → phase).
THREAD_PHASES = (("store", "store"), ("quota-", "execute"), ("kernel-freeze", "freeze"))


def current(phases: tuple[str, ...]) -> str:
    """The phase bot CPU counts to: the innermost one in force, else ``intake``."""
    return phases[-1] if phases else "intake"


def kernel_work(phases: tuple[str, ...]) -> str:
    """The phase a kernel's CPU counts to: the outermost work that held it."""
    return next((phase for phase in phases if phase in KERNEL_WORK), current(phases))


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Run the block in phase ``name`` (within the phases in force)."""
    token = PHASE.set((*PHASE.get(), name))
    try:
        yield
    finally:
        PHASE.reset(token)


def _phased(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(method)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        with phase(name):
            return await method(*args, **kwargs)

    return wrapped


class _PhaseExecutor(concurrent.futures.ThreadPoolExecutor):
    """The default executor, timing each job for the phase it was submitted in."""

    def __init__(self, meter: CpuMeter) -> None:
        super().__init__(thread_name_prefix="bench_executor")
        self._meter = meter

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        context = getattr(getattr(fn, "func", None), "__self__", None)  # asyncio.to_thread: partial(ctx.run, ...)
        phases = context.get(PHASE, ()) if isinstance(context, contextvars.Context) else PHASE.get()
        meter = self._meter

        def timed() -> Any:
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                meter.add_bot(current(phases), time.thread_time() - started, job=True)

        return super().submit(timed)


def process_cpu(proc: psutil.Process) -> tuple[float, float] | None:
    """(Blocking) (user, system) seconds ``proc`` has used; None once it has ended.

    ``/proc/PID/stat`` counts in clock ticks (10 ms) and rounds each process down: 200 new
    processes burning 15 ms each read as 1.6 of their 3.2 s (a crowd's forked kernels lost ~2 s
    that way, once reported as "other programs"). The runtime its threads' ``schedstat`` keep
    is exact (ns): the total comes from it, split as the ticks split it (all system when the
    ticks saw nothing: a start is mostly page faults)."""
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return None
    user, system = times.user, times.system
    exact = _runtime(proc.pid)
    if exact is not None and exact > user + system:
        scale = exact / (user + system) if user + system > 0 else 0.0
        user, system = (user * scale, system * scale) if scale else (0.0, exact)
    return user, system


def _cpu_of(proc: psutil.Process) -> tuple[float, float] | None:
    """(user, system) of a process and what it reaped."""
    try:
        reaped = proc.cpu_times()
    except psutil.Error:
        return None
    if (own := process_cpu(proc)) is None:
        return None
    return own[0] + reaped.children_user, own[1] + reaped.children_system


def _runtime(pid: int) -> float | None:
    """(Blocking) CPU seconds the live threads of ``pid`` have run, exact (``schedstat``, ns);
    None when unreadable. Threads that ended are not in it (their ticks still are)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                total += int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def _role(cmdline: list[str]) -> str | None:
    text = " ".join(cmdline)
    if "oneshot_zygote.py" in text:
        return "one-shots"
    if "zygote.py" in text:
        return "fork server"
    if "warden.py" in text:
        return "warden"
    if "bench.world" in text:
        return "fakes"
    if "threadbook_kernel.oneshot" in text or "threadbook_kernel.preview" in text or "threadbook_kernel.export" in text:
        return "one-shots"
    return None


def _descendants() -> dict[int, tuple[str, float, float]]:
    """(Blocking) every process below this one: pid → (role, user, system), the role as
    :func:`roles` gives it."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return {}
    tree: dict[int, tuple[list[str], list[int]]] = {}
    for proc in children:
        try:
            tree[proc.pid] = (proc.cmdline(), [p.pid for p in proc.parents()])  # parents nearest first
        except psutil.Error:
            continue
    role_of = roles(tree)
    found: dict[int, tuple[str, float, float]] = {}
    for proc in children:
        if proc.pid in role_of and (cpu := _cpu_of(proc)) is not None:
            found[proc.pid] = (role_of[proc.pid], *cpu)
    return found


def roles(tree: dict[int, tuple[list[str], list[int]]]) -> dict[int, str]:
    """The role of every process of ``tree`` (pid → its command line and its ancestors, nearest
    first). A fork server's wrappers (bubblewrap, whose command line names the server) are the
    fork server, what the server forked (the same command line: forked, not exec'ed) kernels;
    what a one-shot server forked, one-shots; any other process, a kernel (spawned)."""
    own = {pid: _role(cmdline) for pid, (cmdline, _) in tree.items()}
    ancestry = {pid: parents for pid, (_, parents) in tree.items()}
    sandboxes = {pid for pid, (cmdline, _) in tree.items() if cmdline and os.path.basename(cmdline[0]) == "bwrap"}
    wrappers = {pid for child, role in own.items() if role is not None for pid in ancestry[child]}
    servers = {pid for pid, role in own.items() if role == "fork server" and pid not in sandboxes}
    for pid in servers:
        if any(p in servers for p in ancestry[pid]):
            own[pid] = "kernels"
    found: dict[int, str] = {}
    for pid, role in own.items():
        if role is None:
            above = next((own[p] for p in ancestry[pid] if own.get(p) is not None), None)
            if pid in wrappers:
                role = next(r for child, r in own.items() if r is not None and pid in ancestry[child])
            elif above == "fork server":
                role = "kernels"
            else:
                role = above or "kernels"
        found[pid] = role
    return found


class CpuMeter:
    """CPU of a burst, by process and by phase (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Bot CPU by phase: in event-loop callbacks, and in jobs of the default executor.
        self.loop: defaultdict[str, float] = defaultdict(float)
        self.jobs: defaultdict[str, float] = defaultdict(float)
        self.kernel: defaultdict[str, float] = defaultdict(float)
        #: Callbacks and jobs timed (each costs ~1.5 µs of the bot's CPU: two clock reads).
        self.timed = 0
        #: CPU of one-shots counted from their cgroups (:meth:`oneshot_cgroups`).
        self.oneshot_cgroup_s = 0.0
        self._patches: list[tuple[Any, str, Any]] = []
        self._start: dict[str, Any] = {}
        self.result: dict[str, Any] = {}

    def add_bot(self, phase_name: str, seconds: float, *, job: bool = False) -> None:
        """Count ``seconds`` of the bot's CPU to ``phase_name`` (``job``: in the default executor)."""
        with self._lock:
            (self.jobs if job else self.loop)[phase_name] += seconds
            self.timed += 1

    @contextmanager
    def installed(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        """Patch the event loop's callbacks, the default executor and the phase methods (undone on exit)."""
        import importlib

        meter = self
        original_run = asyncio.events.Handle._run

        def run(handle: asyncio.events.Handle) -> None:
            started = time.thread_time()
            try:
                original_run(handle)
            finally:
                meter.add_bot(current(handle._context.get(PHASE, ())), time.thread_time() - started)  # type: ignore[attr-defined]

        self._patch(asyncio.events.Handle, "_run", run)
        for module, owner_name, method, name in PHASE_METHODS:
            owner = getattr(importlib.import_module(module), owner_name)
            self._patch(owner, method, _phased(getattr(owner, method), name))
        from kernels.session.process import KernelProcess

        count_cpu = KernelProcess._count_cpu

        async def counted(process: KernelProcess, handle: Any) -> None:
            before = process.cpu.reading
            await count_cpu(process, handle)
            after = process.cpu.reading
            if before is not None and after is not None and after > before:
                with meter._lock:
                    meter.kernel[kernel_work(PHASE.get())] += after - before

        self._patch(KernelProcess, "_count_cpu", counted)
        executor = _PhaseExecutor(self)
        old_executor = getattr(loop, "_default_executor", None)
        loop.set_default_executor(executor)
        try:
            yield
        finally:
            for owner, attribute, original in reversed(self._patches):
                setattr(owner, attribute, original)
            self._patches.clear()
            loop._default_executor = old_executor  # type: ignore[attr-defined]
            executor.shutdown(wait=False)

    @contextmanager
    def oneshot_cgroups(self) -> Iterator[None]:
        """Count the CPU each one-shot's cgroup used, read as it is removed, to ``one-shots``:
        a spawned one-shot's processes end in bubblewrap's pid namespace, whose reaper the bot
        never sees (their time is missing from the bot's reaped children)."""
        from kernels.host.cgroups import KernelCgroup

        remove = KernelCgroup.remove
        meter = self

        def counted(cgroup: KernelCgroup, *args: Any, **kwargs: Any) -> Any:
            if any("oneshot-" in folder.name for folder in cgroup.folders):
                used = cgroup.cpu_seconds()
                if used:
                    with meter._lock:
                        meter.oneshot_cgroup_s += used
            return remove(cgroup, *args, **kwargs)

        self._patch(KernelCgroup, "remove", counted)
        try:
            yield
        finally:
            self._patches.pop()
            KernelCgroup.remove = remove  # type: ignore[method-assign]

    def _patch(self, owner: Any, attribute: str, value: Any) -> None:
        self._patches.append((owner, attribute, getattr(owner, attribute)))
        setattr(owner, attribute, value)

    def begin(self) -> None:
        """(Blocking) the readings the burst starts from; the phase counts restart from zero."""
        with self._lock:
            self.loop.clear()
            self.jobs.clear()
            self.kernel.clear()
            self.timed = 0
            self.oneshot_cgroup_s = 0.0
        self._start = self._readings()

    def end(self) -> None:
        """(Blocking) the readings the burst ends with: :attr:`result` is the CPU in between."""
        start, end = self._start, self._readings()
        own = {k: end["self"][k] - start["self"][k] for k in ("user", "system")}
        reaped = {k: end["reaped"][k] - start["reaped"][k] for k in ("user", "system")}
        by_process: dict[str, dict[str, float]] = {
            "bot": own,
            "kernels": {"user": 0.0, "system": 0.0},
            "fork server": {"user": 0.0, "system": 0.0},
            "warden": {"user": 0.0, "system": 0.0},
            "one-shots": dict(reaped),  # the bot reaps only one-shots (and kernels that stop) in a burst
        }
        with self._lock:
            by_process["one-shots"]["user"] += self.oneshot_cgroup_s  # user + system, from cgroups
        for pid, (role, user, system) in end["tree"].items():
            before = start["tree"].get(pid)
            used_user = user - (before[1] if before else 0.0)
            used_system = system - (before[2] if before else 0.0)
            by_process.setdefault(role, {"user": 0.0, "system": 0.0})
            by_process[role]["user"] += max(used_user, 0.0)
            by_process[role]["system"] += max(used_system, 0.0)
        threads = {name: end["threads"].get(name, 0.0) - start["threads"].get(name, 0.0) for name in end["threads"]}
        with self._lock:
            loop, jobs, kernel = dict(self.loop), dict(self.jobs), dict(self.kernel)
        bot = defaultdict(float, jobs)
        for name, seconds in loop.items():
            bot[name] += seconds
        bot["event loop"] += max(threads.pop("MainThread", 0.0) - sum(loop.values()), 0.0)  # epoll, scheduling
        for name, seconds in threads.items():
            target = next((p for prefix, p in THREAD_PHASES if name.startswith(prefix)), None)
            if target is not None:
                bot[target] += seconds
        # Threads that ended (quota trips, child watchers), the executor's own overhead, rounding.
        bot["other threads"] += max(own["user"] + own["system"] - sum(bot.values()), 0.0)
        kernels_total = by_process["kernels"]["user"] + by_process["kernels"]["system"]
        kernel["kernel starts"] = max(kernels_total - sum(kernel.values()), 0.0)
        machine = end["machine"] - start["machine"]
        ours = sum(v["user"] + v["system"] for v in by_process.values())
        self.result = {
            "machine_busy_s": machine,
            #: CPU the rest of the machine used meanwhile (other programs: their load slows the burst).
            "others_s": max(machine - ours, 0.0),
            "by_process": by_process,
            "bot_by_phase": dict(bot),
            "kernel_by_phase": kernel,
            "timed": self.timed,
        }

    @staticmethod
    def _readings() -> dict[str, Any]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {
            "self": {"user": own.ru_utime, "system": own.ru_stime},
            "reaped": {"user": reaped.ru_utime, "system": reaped.ru_stime},
            "tree": _descendants(),
            "threads": _thread_cpu(),
            "machine": _machine_busy(),
        }

    def report(self, turns: int, cores: int) -> dict[str, Any]:
        """The result per turn in milliseconds: by process (user, system) and by phase (bot,
        kernels, one-shots), the total and the floor (total ÷ cores, in seconds)."""
        result = self.result
        per = 1000.0 / max(turns, 1)
        by_process = {
            name: {"user_ms": v["user"] * per, "system_ms": v["system"] * per}
            for name, v in result["by_process"].items()
        }
        total = sum(v["user"] + v["system"] for v in result["by_process"].values())
        oneshots = sum(result["by_process"].get("one-shots", {}).values())
        fork = sum(result["by_process"].get("fork server", {}).values())
        warden = sum(result["by_process"].get("warden", {}).values())
        by_phase: dict[str, dict[str, float]] = {}
        for name in PHASES:
            row = {
                "bot_ms": result["bot_by_phase"].get(name, 0.0) * per,
                "kernel_ms": result["kernel_by_phase"].get(name, 0.0) * per,
                "oneshot_ms": 0.0,
            }
            if name == "kernel starts":
                row["kernel_ms"] += (fork + warden) * per  # the fork server and the warden start and guard kernels
            if name == "intake":
                row["oneshot_ms"] = oneshots * per  # previews run before the kernel is leased
            by_phase[name] = row
        return {
            "turns": turns,
            "cores": cores,
            "others_s": result["others_s"],
            "total_ms": total * per,
            "floor_s": total / cores,
            "by_process": by_process,
            "by_phase": by_phase,
            "timed_per_turn": result["timed"] / max(turns, 1),
        }


def _machine_busy() -> float:
    """(Blocking) CPU seconds every program on the machine has used (``/proc/stat``: all but idle and iowait)."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(v) for v in handle.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal (guest is in user)
    return busy / os.sysconf("SC_CLK_TCK")


#: The machine counts as quiet once it used less than this share of one core over a window.
QUIET_CORES = 0.15
QUIET_WINDOW_S = 0.25


async def settle(timeout: float = 30.0) -> float:
    """Wait until the machine is quiet (the previous scenario's kernels and processes have
    finished going away), ``timeout`` at most; the seconds waited."""
    started = time.monotonic()
    before = _machine_busy()
    while (waited := time.monotonic() - started) < timeout:
        await asyncio.sleep(QUIET_WINDOW_S)
        now = _machine_busy()
        if now - before < QUIET_CORES * QUIET_WINDOW_S:
            return waited + QUIET_WINDOW_S
        before = now
    return waited


def _thread_cpu() -> dict[str, float]:
    """(Blocking) CPU seconds of each live thread of this process, summed by name."""
    ticks = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    used: dict[str, float] = defaultdict(float)
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), "?")
        used[name] += (int(fields[11]) + int(fields[12])) / ticks
    return dict(used)


def table(report: dict[str, Any]) -> str:
    """One burst's CPU per turn as a Markdown table: phases × (bot, kernels, one-shots)."""
    rows = ["| phase | bot ms | kernels ms | one-shots ms |", "|---|---|---|---|"]
    totals = [0.0, 0.0, 0.0]
    for name, row in report["by_phase"].items():
        values = (row["bot_ms"], row["kernel_ms"], row["oneshot_ms"])
        if not any(values):
            continue
        totals = [a + b for a, b in zip(totals, values, strict=True)]
        rows.append(f"| {name} | {values[0]:.1f} | {values[1]:.1f} | {values[2]:.1f} |")
    rows.append(f"| **all** | **{totals[0]:.1f}** | **{totals[1]:.1f}** | **{totals[2]:.1f}** |")
    processes = ", ".join(
        f"{name} {v['user_ms']:.1f} + {v['system_ms']:.1f}"
        for name, v in report["by_process"].items()
        if v["user_ms"] + v["system_ms"] > 0
    )
    rows += [
        "",
        f"By process, user + system ms per turn: {processes}; total {report['total_ms']:.1f} ms per turn, "
        f"floor {report['floor_s']:.2f} s for {report['turns']} turns on {report['cores']} cores; other programs "
        f"used {report['others_s']:.2f} s of CPU meanwhile.",
    ]
    return "\n".join(rows)
