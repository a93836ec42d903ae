"""An interrupt that arrives as a cell starts interrupts that cell.

ipykernel announces a cell (``execute_input``) and then IPython runs the ``pre_execute`` and
``pre_run_cell`` callbacks before the cell's code. IPython catches a ``KeyboardInterrupt``
raised inside a callback, prints "Error in callback …" and runs the cell anyway: a Stop
pressed (or a timeout reached) in those few hundred microseconds was lost, the cell ran on,
and the bot had to restart the kernel (variables lost). :func:`install` keeps such an
interrupt: the callbacks of those two events run as IPython runs them, and one that was
interrupted makes the cell's first statement a ``raise KeyboardInterrupt`` instead, so the
cell ends exactly as an interrupted cell does (error reply, ``post_execute``, its count).
"""

from __future__ import annotations

import linecache
from collections.abc import Callable
from types import CodeType
from typing import Any

#: The events that run between a cell's announcement and its code.
_BEFORE_THE_CELL = frozenset({"pre_execute", "pre_run_cell"})
#: What runs instead of a cell whose start was interrupted (its name is the traceback's file,
#: its line the one the traceback shows).
_INTERRUPTED_NAME = "<interrupted as the cell started>"
_INTERRUPTED_SOURCE = "raise KeyboardInterrupt\n"
_INTERRUPTED = compile(_INTERRUPTED_SOURCE, _INTERRUPTED_NAME, "exec")


class _HeldInterrupt:
    """Whether an interrupt reached a callback of the cell that is starting."""

    def __init__(self) -> None:
        self.pending = False


def install(shell: Any) -> None:
    """Keep interrupts that reach ``shell``'s pre-cell callbacks for the cell; idempotent."""
    if getattr(shell, "_threadbook_interrupts", False):
        return
    shell._threadbook_interrupts = True
    linecache.cache[_INTERRUPTED_NAME] = (len(_INTERRUPTED_SOURCE), None, [_INTERRUPTED_SOURCE], _INTERRUPTED_NAME)
    held = _HeldInterrupt()
    shell.events.trigger = _trigger(shell.events, shell.events.trigger, held)
    shell.run_code = _run_code(shell.run_code, held)


def _trigger(events: Any, trigger: Callable[..., None], held: _HeldInterrupt) -> Callable[..., None]:
    """``EventManager.trigger`` that notes, instead of swallowing, an interrupted pre-cell callback."""

    def keep_interrupts(event: str, *args: Any, **kwargs: Any) -> None:
        if event not in _BEFORE_THE_CELL:
            trigger(event, *args, **kwargs)
            return
        if event == "pre_execute":
            held.pending = False  # a new cell: nothing held from one that never reached its code
        for callback in events.callbacks[event][:]:
            try:
                callback(*args, **kwargs)
            except KeyboardInterrupt:
                held.pending = True
            except Exception:  # as IPython reports a failing callback; the cell runs
                if events.print_on_error:
                    print(f"Error in callback {callback} (for {event}), with arguments args {args},kwargs {kwargs}:")
                events.shell.showtraceback()

    return keep_interrupts


def _run_code(run_code: Callable[..., Any], held: _HeldInterrupt) -> Callable[..., Any]:
    """``InteractiveShell.run_code`` that runs :data:`_INTERRUPTED` for a cell whose start was
    interrupted (IPython handles it as any exception of the cell's code)."""

    async def interrupted_or_run(code_obj: CodeType, result: Any = None, *, async_: bool = False) -> Any:
        if held.pending:
            held.pending = False
            return await run_code(_INTERRUPTED, result, async_=False)
        return await run_code(code_obj, result, async_=async_)

    return interrupted_or_run
