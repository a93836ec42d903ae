"""The model's ``sql`` tool for one turn: a read query on a granted source, its rows into
the thread's kernel as a pandas DataFrame.

A call goes: arguments checked (the source must be granted to the channel) → the query
parsed and refused unless it is one read (:mod:`bot.sources.guard`) → the status shows it →
the rows streamed from the database into a Parquet file of the workspace
(:mod:`bot.sources.parquet`, within the quota) → one line of code in the thread's kernel reads
the file into the variable (the cell lands in the thread's notebook) → the file is deleted.
The model gets back the variable, the row count (and whether ``max_rows`` or a size cap cut it), the
columns with their types and the first rows; every text it gets is scrubbed of credentials.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from bot.sources.budget import ROW_CAP, megabytes
from bot.sources.cell import SQL_TOOL, arguments_of, code_span, loader_code, parquet_file, valid_name, variable_of
from bot.sources.engine import Fetched, QueryFailed, Source
from bot.sources.guard import QueryRefused, check_query
from bot.sources.parquet import MixedTypes, ParquetSink, ResultTooLarge, SinkFailed
from bot.sources.registry import Sources
from kernels import STATE_DIR, ExecutionResult, Outcome, UnsafePathError, Workspace

log = logging.getLogger(__name__)

#: Shows a status line in the thread (the turn's progress message).
Status = Callable[[str], Awaitable[None]]


class Kernel(Protocol):
    """Runs code in the thread's kernel (and records the cell)."""

    async def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
        """Run ``code`` and report what it produced."""
        ...


class SqlTool:
    """The ``sql`` tool of one turn in a channel granted ``granted`` sources."""

    name = SQL_TOOL

    def __init__(
        self,
        *,
        sources: Sources,
        granted: Sequence[str],
        kernel: Kernel,
        workspace: Workspace,
        status: Status | None = None,
        schema: str = "",
        leave: asyncio.Event | None = None,
    ) -> None:
        """``leave``: set by Stop (a query then running is cancelled, no later one starts)."""
        self._sources = sources
        self._granted = list(granted)
        self._kernel = kernel
        self._workspace = workspace
        self._status = status
        self._leave = leave
        #: The OpenAI function tool offered to the model (its description lists the tables).
        self.spec = _spec(self._granted, schema)
        #: Seconds spent in queries this turn (counted with the turn's kernel seconds).
        self.seconds = 0.0

    @classmethod
    async def open(
        cls,
        *,
        sources: Sources,
        granted: Sequence[str],
        kernel: Kernel,
        workspace: Workspace,
        status: Status | None = None,
        leave: asyncio.Event | None = None,
    ) -> SqlTool:
        """The tool, its description holding each granted source's tables (cached listings)."""
        described = await asyncio.gather(*(sources.catalogue.describe(sources.get(name)) for name in granted))
        schema = "\n\n".join(described)
        return cls(
            sources=sources,
            granted=granted,
            kernel=kernel,
            workspace=workspace,
            status=status,
            schema=schema,
            leave=leave,
        )

    @property
    def _stopped(self) -> bool:
        return self._leave is not None and self._leave.is_set()

    async def call(self, arguments: str) -> str:
        """Run one call; the text is the tool result the model reads."""
        if self._stopped:
            return _STOPPED
        args = arguments_of(arguments)
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            return 'Error: the sql tool needs a non-empty string argument "query"; nothing ran.'
        name = variable_of(args)
        if not valid_name(name):
            return f'Error: {name!r} cannot be a Python variable name; pass a plain identifier as "name". Nothing ran.'
        source, problem = self._source(args.get("source"))
        if source is None:
            return problem
        prefix = ""
        if args.get("refresh_schema") is True:
            prefix = await self._sources.catalogue.describe(source, refresh=True) + "\n\n"
        try:
            await asyncio.to_thread(check_query, query, source.sql_dialect)
        except QueryRefused as exc:
            return (
                prefix
                + f"Refused: nothing was sent to the database, because {exc}. Only one SELECT query per call is run."
            )
        if self._status is not None:
            try:
                await self._status(f"🗄️ Querying `{source.name}`: {_first_line(query)}")
            except Exception:  # the status is cosmetic
                log.exception("could not show the query's status")
        return prefix + source.scrub(await self._run(source, query, name))

    def _source(self, asked: object) -> tuple[Source | None, str]:
        listed = ", ".join(f"`{n}`" for n in self._granted)
        if asked is None or asked == "":
            if len(self._granted) == 1:
                return self._sources.get(self._granted[0]), ""
            return None, f'Error: this channel has several sources ({listed}); pass one as "source". Nothing ran.'
        if not isinstance(asked, str) or asked not in self._granted:
            return (
                None,
                f"Error: there is no source {str(asked)[:80]!r} in this channel; its sources: {listed}. Nothing ran.",
            )
        return self._sources.get(asked), ""

    async def _run(self, source: Source, query: str, name: str) -> str:
        room = self._workspace.quota_bytes - await self._workspace.usage_bytes()
        if room <= 0:
            return "Not run: the thread's workspace is full (its quota is used up); delete files there first."
        try:
            state = await asyncio.to_thread(self._workspace.open_state_dir)
        except (OSError, UnsafePathError) as exc:
            log.warning("no folder for query results in %s: %s", self._workspace.path, exc)
            return "Not run: the workspace has no usable folder for query results."
        sink = ParquetSink(state, parquet_file(name), limit_bytes=room)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            try:
                fetched = await self._fetch(source, query, sink)
                await asyncio.to_thread(sink.finish)
            except BaseException as exc:
                told = _not_loaded(exc, name)
                if told is None:
                    raise
                if isinstance(exc, SinkFailed):
                    log.warning("could not write a query's rows into %s: %s", self._workspace.path, exc)
                return told
            finally:
                self.seconds += loop.time() - started
            loaded = await self._kernel.execute(loader_code(name))
        finally:
            # Every way out (rows loaded, an error, a cancel even during finish): one thread drops
            # the file, whichever name it has, and closes the folder; shielded, so it runs whole.
            await asyncio.shield(asyncio.to_thread(_drop, sink, state))
        if loaded.outcome is not Outcome.OK:
            why = loaded.error.evalue if loaded.error is not None else (loaded.notice or loaded.outcome.value)
            return f"The rows were fetched but not loaded into the kernel: {why[:300]}"
        return _summary(source, name, fetched, sink)

    async def _fetch(self, source: Source, query: str, sink: ParquetSink) -> Fetched:
        """The query, cancelled (on the server too) when Stop is pressed meanwhile."""
        if self._leave is None:
            return await source.fetch(query, sink)
        fetching = asyncio.ensure_future(source.fetch(query, sink))
        stopping = asyncio.ensure_future(self._leave.wait())
        try:
            await asyncio.wait({fetching, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not fetching.done():
            fetching.cancel()
            try:
                await fetching
            except (asyncio.CancelledError, QueryFailed):
                pass
            raise _Stopped
        return fetching.result()


class _Stopped(Exception):
    """Stop was pressed while the query ran."""


def _not_loaded(exc: BaseException, name: str) -> str | None:
    """What the model is told when fetching into ``name`` failed with ``exc``; None: not ours to tell (raise it)."""
    if isinstance(exc, QueryFailed):
        return f"The database refused or failed the query: {exc}. Nothing was loaded; `{name}` is unchanged."
    if isinstance(exc, _Stopped):
        return _STOPPED
    if isinstance(exc, SinkFailed):
        return f"Not loaded: the rows could not be written into the workspace. `{name}` is unchanged."
    if isinstance(exc, (ResultTooLarge, MixedTypes)):
        return f"Not loaded: {exc}. Select fewer rows or columns, or aggregate in SQL. `{name}` is unchanged."
    return None


_STOPPED = "Not run: the user pressed Stop; no query runs any more in this turn."


def _summary(source: Source, name: str, fetched: Fetched, sink: ParquetSink) -> str:
    assert sink.schema is not None
    lines = [
        f"Ran on `{source.name}` in {fetched.seconds:.2f} s. `{name}` is now a pandas DataFrame in the kernel: "
        f"{fetched.rows:,} row{'' if fetched.rows == 1 else 's'} × {len(sink.columns)} columns."
    ]
    if fetched.stopped:
        lines.append(
            f"The result was CUT by size: {fetched.stopped}. Select fewer or narrower columns "
            "(substr(), length()), filter, or aggregate in SQL."
        )
    elif fetched.cut:
        lines.append(
            f"The result was CUT at max_rows = {source.settings.max_rows:,}: the query returned more rows. "
            "Aggregate or filter in SQL if you need all of them."
        )
    columns = ", ".join(f"{f.name} ({f.type})" for f in sink.schema)
    if len(columns) > _MAX_COLUMNS_CHARS:
        columns = columns[: _MAX_COLUMNS_CHARS - 1] + f"… ({len(sink.columns)} columns in all: see `{name}.dtypes`)"
    lines.append("Columns: " + columns)
    if sink.preview:
        shown = sink.columns[:_PREVIEW_COLUMNS]
        more = f" | … {len(sink.columns) - len(shown)} more columns" if len(sink.columns) > len(shown) else ""
        lines.append("First rows:")
        lines.append(" | ".join(shown) + more)
        lines.extend(" | ".join(row[: len(shown)]) for row in sink.preview)
    return "\n".join(lines)


#: The tool result stays short whatever the width of the result.
_MAX_COLUMNS_CHARS = 2_000
_PREVIEW_COLUMNS = 12


def _spec(granted: Sequence[str], schema: str) -> dict[str, Any]:
    several = len(granted) > 1
    description = (
        "Run one read-only SQL query (a SELECT) on a database of this channel. The rows are loaded into this "
        "thread's Python kernel as a pandas DataFrame (variable `name`, default `result`) for the python tool; "
        "you get back the row count, the columns with types and the first rows. Aggregate and filter in SQL "
        "where you can; a result is cut at the source's max_rows, and by size (one row at most "
        f"{megabytes(ROW_CAP)}). Only SELECT runs, calling the usual side-effect-free functions (aggregates, window, "
        "maths, string, date/time, JSON, casts): anything that writes, locks, calls a function off that list or holds "
        "several statements is refused.\n\n" + schema
    )
    properties: dict[str, Any] = {
        "query": {"type": "string", "description": "One SELECT query in the source's SQL dialect."},
        "source": {
            "type": "string",
            "enum": list(granted),
            "description": "Which source to query." + ("" if several else " Optional: there is one."),
        },
        "name": {"type": "string", "description": "The DataFrame's variable name in the kernel (default: result)."},
        "refresh_schema": {
            "type": "boolean",
            "description": "List the source's tables and columns again before running (after they changed).",
        },
    }
    return {
        "type": "function",
        "function": {
            "name": SQL_TOOL,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": ["query", "source"] if several else ["query"],
            },
        },
    }


def _drop(sink: ParquetSink, dir_fd: int) -> None:
    """(Blocking) drop the rows' file, temporary or final, and close its folder (``unlink``
    follows no link)."""
    try:
        try:
            sink.abort()
        except OSError as exc:
            log.warning("could not drop the unfinished %s/%s: %s", STATE_DIR, sink.name, exc)
        try:
            os.unlink(sink.name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not delete %s/%s: %s", STATE_DIR, sink.name, exc)
    finally:
        os.close(dir_fd)


def _first_line(query: str, limit: int = 80) -> str:
    """The query's first non-empty line as a code span for the status line."""
    return code_span(next((ln.strip() for ln in query.splitlines() if ln.strip()), ""), limit)
