"""What the core says to any platform passes here first: host paths hidden (:mod:`bot.hostpaths`).

:func:`hiding_paths` wraps the :class:`~bot.events.Outbox` an adapter hands the dispatcher, so
notices, replies, status lines and streamed drafts reach the platform's own renderer (Slack's
:mod:`adapters.slack.render`, Discord's messages, the console) without them; :func:`hiding_reach`
does the same for the outboxes the core asks an adapter for when no message came in (scheduled
runs, notices after a restart).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from bot.events import Cell, CellProgress, Chart, Number, Outbox, Progress, Reply, Table, ThreadKey, ThreadReach
from bot.hostpaths import HostPaths

Hide = Callable[[str], str]


def hiding_paths(outbox: Outbox, paths: HostPaths) -> Outbox:
    """``outbox`` with every text it is given rewritten by ``paths.hide``."""
    return outbox if isinstance(outbox, _HidingOutbox) else _HidingOutbox(outbox, paths.hide)


def hiding_reach(reach: ThreadReach, paths: HostPaths) -> ThreadReach:
    """``reach`` whose every outbox hides host paths (:func:`hiding_paths`)."""
    return _HidingReach(reach, paths)


class _HidingReach:
    def __init__(self, reach: ThreadReach, paths: HostPaths) -> None:
        self._reach = reach
        self._paths = paths

    def outbox_for(self, key: ThreadKey) -> Outbox | None:
        outbox = self._reach.outbox_for(key)
        return None if outbox is None else hiding_paths(outbox, self._paths)

    async def thread_open(self, key: ThreadKey) -> bool:
        return await self._reach.thread_open(key)


class _HidingOutbox:
    def __init__(self, outbox: Outbox, hide: Hide) -> None:
        self._outbox = outbox
        self._hide = hide

    async def notify(self, text: str) -> None:
        await self._outbox.notify(self._hide(text))

    async def post(self, reply: Reply) -> None:
        await self._outbox.post(hidden_reply(reply, self._hide))

    def progress(self) -> Progress:
        return _HidingProgress(self._outbox.progress(), self._hide)


def hidden_reply(reply: Reply, hide: Hide) -> Reply:
    """``reply`` with ``hide`` applied to its text and to every text in its tables and charts
    (cells, captions, titles, labels, series names: they come from the kernel too)."""
    images = tuple(
        dataclasses.replace(image, chart=_hidden_chart(image.chart, hide)) if image.chart is not None else image
        for image in reply.images
    )
    return dataclasses.replace(
        reply, text=hide(reply.text), images=images, tables=tuple(_hidden_table(t, hide) for t in reply.tables)
    )


def _hidden_table(table: Table, hide: Hide) -> Table:
    def cell(value: Cell) -> Cell:
        return value if isinstance(value, Number) else hide(value)

    return dataclasses.replace(
        table,
        caption=hide(table.caption),
        header=tuple(hide(h) for h in table.header),
        rows=tuple(tuple(cell(c) for c in row) for row in table.rows),
    )


def _hidden_chart(chart: Chart, hide: Hide) -> Chart:
    return dataclasses.replace(
        chart,
        title=hide(chart.title),
        x_label=hide(chart.x_label),
        y_label=hide(chart.y_label),
        categories=tuple(hide(c) for c in chart.categories),
        series=tuple(dataclasses.replace(s, name=hide(s.name)) for s in chart.series),
    )


class _HidingProgress:
    def __init__(self, progress: Progress, hide: Hide) -> None:
        self._progress = progress
        self._hide = hide

    @property
    def shows_drafts(self) -> bool:
        return self._progress.shows_drafts

    async def start(self, status: str) -> None:
        await self._progress.start(self._hide(status))

    async def update(self, status: str) -> None:
        await self._progress.update(self._hide(status))

    async def cell(self, cell: CellProgress) -> None:
        hide = self._hide
        await self._progress.cell(
            dataclasses.replace(
                cell, label=hide(cell.label), code=hide(cell.code), lines=tuple(hide(line) for line in cell.lines)
            )
        )

    async def finish(self, ok: bool) -> None:
        await self._progress.finish(ok)

    async def draft(self, text: str) -> None:
        await self._progress.draft(self._hide(text))

    async def drop_draft(self) -> None:
        await self._progress.drop_draft()
