"""The shape of the admission chain: rules in bolt's middleware style.

A rule is an async function of the message on its way (:class:`Arrival`) and ``proceed``: it
returns without calling ``proceed`` to stop the message there (nothing more happens to it), or
awaits ``proceed()`` to hand it on to the next rule, and at the end to the handler. A rule may
do work around ``proceed()`` (hold a lock, mark a turn in the store, time it). The rules are
:mod:`bot.admission`'s and :mod:`bot.line`'s; :mod:`bot.dispatcher` puts them in order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from bot.budgets import TokenAllowance
from bot.events import InboundMessage, Outbox

#: Hands the message on to the next rule (and, after the last, to the handler).
Next = Callable[[], Awaitable[None]]


@dataclass
class Arrival:
    """One message on its way through the chain, and what the rules found out about it."""

    message: InboundMessage
    #: Where anything said about it goes (already wrapped by the outbound rewrite).
    outbox: Outbox
    #: The token budget the turn runs within, once the budget rule admitted it.
    allowance: TokenAllowance | None = None
    #: Whether this message holds its thread's intake (:meth:`bot.line.ThreadLine.in_order`).
    intake_held: bool = False


Rule = Callable[[Arrival, Next], Awaitable[None]]
Handler = Callable[[Arrival], Awaitable[None]]


async def run_chain(rules: Sequence[Rule], arrival: Arrival, handler: Handler) -> None:
    """Pass ``arrival`` through ``rules`` in order; the handler gets it if every rule hands it on."""

    async def step(index: int) -> None:
        if index == len(rules):
            await handler(arrival)
        else:
            await rules[index](arrival, lambda: step(index + 1))

    await step(0)
