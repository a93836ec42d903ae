"""Prometheus metrics of one bot process, served on ``/metrics`` (bot/health.py).

Every metric is defined here, in a registry of our own (:data:`REGISTRY`, not
prometheus_client's global one), and moved by small functions the core calls in one line
(:func:`turn_outcome`, :func:`execution`, :func:`package_install`; the model client's
``observe_llm`` decorator in :mod:`bot.agent.llm` moves the LLM ones). What is a state rather than an event (kernels, queues) is read from the pool
and the dispatcher when Prometheus scrapes (:func:`watch`). docs/operations.md lists every
metric and its labels.

Labels are bounded sets only: outcomes and kinds named here, and the configured model
names. Nothing is labelled by thread, user or channel (one series per thread would grow
without end); the per-thread queues are summed up as the number of threads with a line and
the longest line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from kernels import KernelPool


class TurnQueues(Protocol):
    """What the scrape reads of a dispatcher: the messages waiting per thread."""

    def waiting_turns(self) -> list[int]:
        """How many messages wait behind the running turn, for each thread with a line."""
        ...


log = logging.getLogger(__name__)

#: Every metric of the bot (served by ``/metrics``); never prometheus_client's global registry.
REGISTRY = CollectorRegistry(auto_describe=True)

#: How a turn ends: the agent loop's stop reasons, then what ends a turn before or around it.
TURN_OUTCOMES = (
    "answer",
    "max_rounds",
    "llm_error",
    "interrupted",
    "kernel_error",
    "budget",  # the agent loop
    "command",  # an in-thread command (help, reset, status…) instead of a turn
    "refused",  # a spent budget (limits)
    "empty",  # nothing to do (no text, no upload saved)
    "queue_full",
    "queue_timeout",
    "queue_left",  # no kernel came free (the kernel queue)
    "kernel_unavailable",
    "kernel_start_failed",  # the kernel could not be had
    "failed",
    "cancelled",  # an unexpected exception; cut off by shutdown
)
#: Outcomes that are also counted as errors, and the kind they count as.
_OUTCOME_ERRORS = {
    "kernel_unavailable": "kernel_unavailable",
    "kernel_start_failed": "kernel_start",
    "failed": "turn_exception",
}
#: How executions end: kernels.result.Outcome's values.
EXECUTION_OUTCOMES = ("ok", "error", "timeout_interrupted", "timeout_restarted", "interrupted", "died")
#: What became of a missing module: kernels.packages.Verdict's values.
INSTALL_OUTCOMES = ("installed", "available", "in_environment", "not_allowed", "failed")
#: Why an LLM request failed (after the client's retries).
LLM_ERROR_KINDS = (
    "timeout",
    "connection",
    "auth",
    "not_found",
    "rate_limited",
    "server_error",
    "context_length",
    "refused",
    "unreadable",
    "other",
)
ERROR_KINDS = (*(f"llm_{kind}" for kind in LLM_ERROR_KINDS), *_OUTCOME_ERRORS.values())

TURNS = Counter("threadbook_turns", "Messages handled, by how their turn ended.", ["outcome"], registry=REGISTRY)
TURN_SECONDS = Histogram(
    "threadbook_turn_duration_seconds",
    "How long a turn ran, from its start (after any wait behind an earlier turn of its thread) to its reply.",
    buckets=(0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
LLM_SECONDS = Histogram(
    "threadbook_llm_request_duration_seconds",
    "How long one model request took, retries included, by model.",
    ["model"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
    registry=REGISTRY,
)
LLM_TOKENS = Counter(
    "threadbook_llm_tokens",
    "Tokens spent, by model and kind (prompt, completion; reasoning: the part of completion a reasoning model spent thinking).",
    ["model", "kind"],
    registry=REGISTRY,
)
EXECUTIONS = Counter("threadbook_executions", "Code executions in kernels, by outcome.", ["outcome"], registry=REGISTRY)
EXECUTION_SECONDS = Histogram(
    "threadbook_execution_duration_seconds",
    "How long one code execution ran in its kernel.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
    registry=REGISTRY,
)
PACKAGE_INSTALLS = Counter(
    "threadbook_package_installs",
    "Missing modules met by code, by what became of them.",
    ["outcome"],
    registry=REGISTRY,
)
ERRORS = Counter("threadbook_errors", "Failures, by kind.", ["kind"], registry=REGISTRY)
#: What became of a due scheduled run this process claimed.
SCHEDULED_OUTCOMES = ("started", "thread_gone", "failed")
SCHEDULED_RUNS = Counter(
    "threadbook_scheduled_runs",
    "Scheduled runs claimed by this process, by what became of them.",
    ["outcome"],
    registry=REGISTRY,
)
EVENT_LOOP_STALLS = Counter(
    "threadbook_event_loop_stalls",
    "Times the event loop did not turn for over a second (bot/loopwatch.py; each is logged with its stack).",
    registry=REGISTRY,
)
#: How an MCP tool call ends (bot.mcp.connection.Outcome's values).
MCP_OUTCOMES = ("ok", "tool_error", "timeout", "failed", "unreachable", "stopped")
MCP_CALLS = Counter(
    "threadbook_mcp_calls",
    "MCP tool calls, by configured server and how they ended (every outcome but ok and stopped is an error).",
    ["server", "outcome"],
    registry=REGISTRY,
)
MCP_CALL_SECONDS = Histogram(
    "threadbook_mcp_call_duration_seconds",
    "How long one MCP tool call took (the wall time counted in the person's budget), by configured server.",
    ["server"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)

# Every known label value at 0 from the start, so rates and absent() work before the first event.
for _outcome in TURN_OUTCOMES:
    TURNS.labels(_outcome)
for _outcome in EXECUTION_OUTCOMES:
    EXECUTIONS.labels(_outcome)
for _outcome in INSTALL_OUTCOMES:
    PACKAGE_INSTALLS.labels(_outcome)
for _kind in ERROR_KINDS:
    ERRORS.labels(_kind)
for _outcome in SCHEDULED_OUTCOMES:
    SCHEDULED_RUNS.labels(_outcome)


# --- turns -----------------------------------------------------------------------------------


@dataclass
class _TurnRecord:
    outcome: str | None = None


_current_turn: ContextVar[_TurnRecord | None] = ContextVar("threadbook_metrics_turn", default=None)


def turn_finished(outcome: str, seconds: float) -> None:
    """Count one turn that ended with ``outcome`` after ``seconds``."""
    TURNS.labels(outcome).inc()
    TURN_SECONDS.observe(seconds)
    if (kind := _OUTCOME_ERRORS.get(outcome)) is not None:
        ERRORS.labels(kind).inc()


@contextmanager
def turn() -> Iterator[None]:
    """Time the turn run inside the block; :func:`turn_outcome` inside it names how it ended
    (an exception: ``failed``; cancellation: ``cancelled``)."""
    record = _TurnRecord()
    token = _current_turn.set(record)
    started = time.monotonic()
    outcome = "failed"
    try:
        yield
        outcome = record.outcome or "answer"
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        _current_turn.reset(token)
        turn_finished(outcome, time.monotonic() - started)


def turn_outcome(outcome: str) -> None:
    """Name how the turn running in this context ends (the last call wins); no-op outside one."""
    if (record := _current_turn.get()) is not None:
        record.outcome = outcome


# --- kernels ---------------------------------------------------------------------------------


def execution(outcome: str, seconds: float) -> None:
    """Count one code execution (``outcome``: a :class:`kernels.result.Outcome` value)."""
    EXECUTIONS.labels(outcome).inc()
    EXECUTION_SECONDS.observe(max(0.0, seconds))


def package_install(outcome: str) -> None:
    """Count one missing module and what became of it (a :class:`kernels.packages.Verdict` value)."""
    PACKAGE_INSTALLS.labels(outcome).inc()


def scheduled_run(outcome: str) -> None:
    """Count one claimed scheduled run (``outcome``: one of :data:`SCHEDULED_OUTCOMES`)."""
    SCHEDULED_RUNS.labels(outcome).inc()


def event_loop_stalled() -> None:
    """Count one stall of the event loop (called from the watchdog's thread)."""
    EVENT_LOOP_STALLS.inc()


def mcp_servers(names: Iterable[str]) -> None:
    """Every configured MCP server's series at 0, so rates and alerts work before its first call."""
    for name in names:
        for outcome in MCP_OUTCOMES:
            MCP_CALLS.labels(name, outcome)
        MCP_CALL_SECONDS.labels(name)


def mcp_call(server: str, outcome: str, seconds: float) -> None:
    """Count one MCP tool call of the configured ``server`` (``outcome``: one of :data:`MCP_OUTCOMES`)."""
    MCP_CALLS.labels(server, outcome).inc()
    MCP_CALL_SECONDS.labels(server).observe(max(0.0, seconds))


def error(kind: str) -> None:
    """Count one failure of ``kind`` (keep kinds to a fixed set)."""
    ERRORS.labels(kind).inc()


# --- the model -------------------------------------------------------------------------------


@dataclass
class EndpointSeen:
    """When an LLM endpoint last answered a request, and when a request to it last failed
    (``time.monotonic()``; None: never, in this process)."""

    last_ok: float | None = None
    last_failure: float | None = None


#: By ``llm.base_url``: what the bot's own requests saw (readiness reads it).
_endpoints: dict[str, EndpointSeen] = {}


def endpoint_seen(base_url: str) -> EndpointSeen:
    """What requests to ``base_url`` saw lately."""
    return _endpoints.setdefault(base_url, EndpointSeen())


# --- states read at scrape time --------------------------------------------------------------


class _LiveCollector(Collector):
    """Kernels and queues of the pools and dispatchers being watched, read when scraped."""

    def __init__(self) -> None:
        self.watched: list[tuple[KernelPool, TurnQueues | None]] = []

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        try:
            return list(self._families(self.watched))
        except Exception:  # a scrape must never fail the whole page
            log.exception("reading the kernel and queue gauges failed")
            return list(self._families())

    @staticmethod
    def _families(watched: Iterable[tuple[KernelPool, TurnQueues | None]] = ()) -> Iterator[Metric]:
        kernels = GaugeMetricFamily(
            "threadbook_kernels",
            "Kernel sessions of this process by state (starting, idle, busy, dead).",
            labels=["state"],
        )
        warm = GaugeMetricFamily(
            "threadbook_kernels_warm", "Warm kernels (ready or starting) waiting for a new thread."
        )
        warm_target = GaugeMetricFamily(
            "threadbook_kernels_warm_target", "Warm kernels the pool keeps now (kernels.warm_pool, or its auto target)."
        )
        new_threads = CounterMetricFamily(
            "threadbook_new_thread_kernels",
            "New threads' kernels by whether a warm kernel was ready (hit) or not (miss).",
            labels=["warm"],
        )
        limit = GaugeMetricFamily(
            "threadbook_kernels_max", "kernels.max_kernels: kernels at most (warm ones included)."
        )
        kernel_queue = GaugeMetricFamily(
            "threadbook_kernel_queue_waiting", "New threads waiting for a kernel to come free."
        )
        threads = GaugeMetricFamily(
            "threadbook_threads_queued", "Threads with messages waiting behind a running turn of the same thread."
        )
        longest = GaugeMetricFamily(
            "threadbook_thread_queue_longest", "Messages waiting behind the running turn, in the longest line."
        )
        states = dict.fromkeys(("starting", "idle", "busy", "dead"), 0)
        warm_count = warm_size = max_kernels = waiting = queued = line = hits = misses = 0
        for pool, dispatcher in watched:
            for session in pool.sessions():
                state = {"new": "starting", "stopped": "dead"}.get(session.state, session.state)
                states[state] = states.get(state, 0) + 1
            if pool.warm is not None:
                warm_count += pool.warm.count
                warm_size += pool.warm.size
                hits += pool.warm.hits
                misses += pool.warm.misses
            max_kernels += pool.settings.max_kernels
            waiting += pool.queue_stats().waiting
            if dispatcher is not None:
                lines = dispatcher.waiting_turns()
                queued += len(lines)
                line = max(line, *lines, 0)
        for state, count in states.items():
            kernels.add_metric([state], count)
        new_threads.add_metric(["hit"], hits)
        new_threads.add_metric(["miss"], misses)
        yield new_threads
        for family, value in (
            (warm, warm_count),
            (warm_target, warm_size),
            (limit, max_kernels),
            (kernel_queue, waiting),
            (threads, queued),
            (longest, line),
        ):
            family.add_metric([], value)
            yield family
        yield kernels


_live = _LiveCollector()
REGISTRY.register(_live)


def watch(pool: KernelPool, dispatcher: TurnQueues | None = None) -> Callable[[], None]:
    """Report ``pool``'s kernels and ``dispatcher``'s queues on every scrape until the
    returned function is called."""
    entry = (pool, dispatcher)
    _live.watched.append(entry)

    def unwatch() -> None:
        if entry in _live.watched:
            _live.watched.remove(entry)

    return unwatch
