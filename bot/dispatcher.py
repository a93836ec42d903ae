"""Every inbound message, end to end: the admission chain, then the turn it admits.

Adapters call :meth:`Dispatcher.handle` for messages (the one way into the core, for every
platform and the console), :meth:`Dispatcher.may_open` where a platform must decide before any
message exists (a Discord thread opened for a mention, a slash command acknowledged at once),
:meth:`Dispatcher.stop` for a Stop button and :meth:`Dispatcher.feedback` for 👍/👎. The chain
(:mod:`bot.chain`) is one list of rules in order: :mod:`bot.line`'s arrival order, then
:mod:`bot.admission`'s author, mention, access and duplicate rules, :mod:`bot.line`'s queue,
and :mod:`bot.admission`'s command-or-budget rule; a message every rule hands on becomes a turn.

Replicas share no kernels: before a turn, a replica whose kernel of the thread is older than
another replica's turn drops it (the next kernel restores the saved variables), and with a
shared store every turn ends by saving the thread's variables for whichever replica is next.
"""

from __future__ import annotations

import asyncio
import logging

from bot import logs, metrics
from bot.admission import Admission
from bot.chain import Arrival, Next, Rule, run_chain
from bot.commands import Commands
from bot.config import Settings
from bot.events import InboundMessage, Outbox, ThreadKey
from bot.hostpaths import HostPaths
from bot.line import ThreadLine
from bot.outgoing import hiding_paths
from bot.store import Store
from bot.turn import TurnRunner, kernel_options
from kernels import KernelPool

log = logging.getLogger(__name__)

FAILURE_NOTICE = "⚠️ Something went wrong on my side while handling that message. Please try again."
#: How often a running turn looks whether Stop was pressed on another replica.
STOP_POLL_S = 1.0


class Dispatcher:
    """Applies the bot's rules to each message and runs the resulting turn."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        admission: Admission,
        turns: TurnRunner,
        commands: Commands,
        pool: KernelPool,
    ) -> None:
        self._settings = settings
        self._store = store
        self._admission = admission
        self._turns = turns
        self._commands = commands
        self._pool = pool
        self._host_paths = HostPaths.of(settings)
        self._line = ThreadLine(store)
        #: The admission chain, in order (see the module docstring).
        self._chain: list[Rule] = [
            self._line.in_order,
            *admission.screening,
            self._line.queue,
            self.command,
            admission.budget,
        ]

    async def handle(self, message: InboundMessage, outbox: Outbox) -> None:
        """Handle one inbound message end to end. Never raises, except to pass on cancellation."""
        arrival = Arrival(message, hiding_paths(outbox, self._host_paths))  # no host path reaches any platform
        self._line.arrive(arrival)  # before any await: arrival order
        log_context = logs.enter_turn(message.key, message.message_id)  # every line logged for it names it
        try:
            await run_chain(self._chain, arrival, self._run_turn)
        except asyncio.CancelledError:
            raise  # the queue told the thread, if its turn was queued
        except Exception:
            log.exception("turn failed for %s message %s", message.key, message.message_id)
            try:
                await arrival.outbox.notify(FAILURE_NOTICE)
            except Exception:
                log.exception("could not report the failure to %s", message.key)
        finally:
            logs.leave_turn(log_context)
            self._line.leave(arrival)

    async def command(self, arrival: Arrival, proceed: Next) -> None:
        """Rule: once the turn's place came (timed and counted by its outcome from here), an
        in-thread command runs and goes no further; anything else goes on to the budget."""
        message = arrival.message
        with metrics.turn():
            if not message.attachments and await self._commands.try_run(message, arrival.outbox):
                metrics.turn_outcome("command")
                return
            await proceed()

    def waiting_turns(self) -> list[int]:
        """For each thread with messages of this process waiting behind its running turn: how many (metrics)."""
        return self._line.waiting_turns()

    def running(self, key: ThreadKey) -> bool:
        """Whether a turn of the thread runs in this process now."""
        return self._turns.running(key)

    def may_stop(self, key: ThreadKey, user_id: str) -> bool:
        """Whether ``user_id`` may stop turns in ``key``'s thread: whoever the access lists admit
        to its channel (:meth:`bot.admission.Admission.may_open`); anyone else's Stop is logged
        and ignored."""
        if self._admission.may_open(platform=key.platform, channel=key.channel, user_id=user_id):
            return True
        log.warning("ignored Stop from %s in %s: not admitted by access", user_id, key)
        return False

    async def stop(self, key: ThreadKey, *, user_id: str) -> bool:
        """Interrupt the running turn of a thread (the Stop button), on whichever replica runs
        it, when ``user_id`` :meth:`may_stop` it. True if one was running and was stopped."""
        if not self.may_stop(key, user_id):
            return False
        if await self._turns.stop(key):
            return True
        return self._store.shared and await self._store.turns.request_stop(key)

    async def feedback(self, key: ThreadKey, turn_id: str, user_id: str, good: bool) -> None:
        """Store a 👍 (``good``) or 👎 click on the answer to message ``turn_id`` of thread ``key``."""
        try:
            await self._store.feedback.add(key, turn_id, user_id, good=good)
        except Exception:
            log.exception("could not store feedback on %s in %s", turn_id, key)

    async def first_visit(self, *, platform: str, workspace: str, channel: str, user_id: str) -> bool:
        """Whether a person opening the bot's home (Slack's Messages tab, ``channel`` their DM)
        is greeted now: the first time ever, on any replica, and only when access admits them."""
        if not self._admission.may_open(platform=platform, channel=channel, user_id=user_id):
            return False
        return await self._store.greetings.claim(platform, workspace, user_id)

    def may_open(self, *, platform: str, channel: str, user_id: str, is_bot: bool = False) -> bool:
        """Whether a person may open a session here, for a platform that must decide before a
        message exists (:meth:`bot.admission.Admission.may_open`)."""
        return self._admission.may_open(platform=platform, channel=channel, user_id=user_id, is_bot=is_bot)

    async def _run_turn(self, arrival: Arrival) -> None:
        """The handler at the chain's end: run the turn with this replica's kernel up to date, and
        leave the variables saved for the next replica when replicas share the store."""
        message, outbox, allowance = arrival.message, arrival.outbox, arrival.allowance
        assert allowance is not None, "the budget rule comes before the turn"
        await self._take_kernel(message.key)
        if not self._store.shared:
            await self._turns.run(message, outbox, allowance)
            return
        watcher = asyncio.create_task(self._watch_for_stop(message), name=f"stop-watch {message.message_id}")
        try:
            await self._turns.run(message, outbox, allowance)
        finally:
            watcher.cancel()
        kernel_key = str(message.key)  # the kernel layer's name of the thread
        await self._pool.save(kernel_key)
        session = self._pool.get(kernel_key)
        await self._store.kernel_owners.record(message.key, session.remote_id if session is not None else None)

    async def _take_kernel(self, thread: ThreadKey) -> None:
        """Make this replica's kernel of the thread the one that holds its variables: when
        another replica served the thread since, drop ours (out of date); when that replica is
        gone, take over its gateway kernel if it still runs (variables live), else the next
        kernel restores the saved variables."""
        if not self._store.shared:
            return  # one process: any other owner was an earlier process, whose kernels are gone
        owner = await self._store.kernel_owners.claim(thread)
        if owner is None or owner.run == self._store.replicas.run:
            return
        key = str(thread)  # the kernel layer's name of the thread
        if owner.gone and owner.remote_id is not None:
            options = kernel_options(self._settings, await self._turns.policy(thread))
            if await self._pool.take_over(key, owner.remote_id, options):
                log.info("took over the kernel of %s from a replica that is gone", key)
                return
        await self._pool.discard(key)

    async def _watch_for_stop(self, message: InboundMessage) -> None:
        """Stop this turn when Stop was pressed on another replica."""
        while True:
            await asyncio.sleep(STOP_POLL_S)
            try:
                if await self._store.turns.stop_requested(message.key, message.message_id):
                    await self._turns.stop(message.key)
                    return
            except Exception:
                log.exception("could not look for a Stop of %s", message.key)
