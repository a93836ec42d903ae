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


def install(shell: Any) -> None:
    """Keep interrupts that reach ``shell``'s pre-cell callbacks for the cell; idempotent."""
    if getattr(shell, "_threadbook_interrupts", False):
        return
    shell._threadbook_interrupts = True
    linecache.cache[_INTERRUPTED_NAME] = (len(_INTERRUPTED_SOURCE), None, [_INTERRUPTED_SOURCE], _INTERRUPTED_NAME)
    keeper = _InterruptKeeper(shell)
    shell.events.trigger = keeper.trigger
    shell.run_code = keeper.run_code


class _InterruptKeeper:
    """Stands in for the shell's ``events.trigger`` and ``run_code`` (calling IPython's own)."""

    def __init__(self, shell: Any) -> None:
        self._events = shell.events
        self._trigger: Callable[..., None] = shell.events.trigger
        self._run_code: Callable[..., Any] = shell.run_code
        #: An interrupt reached a callback of the cell that is starting.
        self.pending = False

    def trigger(self, event: str, *args: Any, **kwargs: Any) -> None:
        """``EventManager.trigger`` that notes, instead of swallowing, an interrupted pre-cell callback."""
        if event not in _BEFORE_THE_CELL:
            self._trigger(event, *args, **kwargs)
            return
        if event == "pre_execute":
            self.pending = False  # a new cell: nothing held from one that never reached its code
        for callback in self._events.callbacks[event][:]:
            try:
                callback(*args, **kwargs)
            except KeyboardInterrupt:
                self.pending = True
            except Exception:  # as IPython reports a failing callback; the cell runs
                if self._events.print_on_error:
                    print(f"Error in callback {callback} (for {event}), with arguments args {args},kwargs {kwargs}:")
                self._events.shell.showtraceback()

    async def run_code(self, code_obj: CodeType, result: Any = None, *, async_: bool = False) -> Any:
        """``InteractiveShell.run_code`` that runs :data:`_INTERRUPTED` for a cell whose start was
        interrupted (IPython handles it as any exception of the cell's code)."""
        if self.pending:
            self.pending = False
            return await self._run_code(_INTERRUPTED, result, async_=False)
        return await self._run_code(code_obj, result, async_=async_)
