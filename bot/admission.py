"""Whether a message becomes a turn: one chain of rules every adapter's messages pass the same way.

The chain (:mod:`bot.chain`, rules in bolt's middleware style, put in order by
:mod:`bot.dispatcher`), for each message any platform or the console hands the core:

1. **in order** (:meth:`bot.line.ThreadLine.in_order`): a thread's messages enter one at a time,
   in the order they arrived;
2. **author**: messages of bots (this one included) are ignored;
3. **mention**: a message is for the bot when it mentions it, is a direct message, or continues
   a thread the bot already has a session in, where the platform answers without a mention
   (Slack: ``slack.reply_without_mention``; every other platform always does);
4. **access**: ``access.allow_channels`` and ``access.allow_users``;
5. **duplicate**: a platform message id is handled once, whichever replica got it (the claim
   is in the store);
6. **queue** (:meth:`bot.line.ThreadLine.queue`): one turn at a time per thread, in order;
7. **command** (:meth:`bot.dispatcher.Dispatcher.command`): when the turn's place comes, an
   in-thread command runs (uncounted) and goes no further;
8. **budget**: an agent turn starts only within its channel's budgets (``limits``). The budget
   is read this late so that a burst of messages queued in one thread cannot all pass before
   the first one is counted.

Rules 2–5 are :meth:`Admission.author` … :meth:`Admission.duplicate` (:attr:`Admission.screening`
lists them); rule 8 is :meth:`Admission.budget`. A platform that must decide
before any message exists (Discord opens a thread for a mention, and acknowledges a slash
command at once) asks :meth:`Admission.may_open`, rules 2 and 4 alone, so a person the
allow-list keeps out gets no thread either.
"""

from __future__ import annotations

import logging

from bot import metrics
from bot.budgets import Budgets
from bot.chain import Arrival, Next, Rule
from bot.config import Settings
from bot.events import InboundMessage, Reply
from bot.store import Store

log = logging.getLogger(__name__)


class Admission:
    """The bot's own rules of the chain (see the module docstring)."""

    def __init__(self, settings: Settings, store: Store, budgets: Budgets) -> None:
        self._settings = settings
        self._store = store
        self._budgets = budgets

    def may_open(self, *, platform: str, channel: str, user_id: str, is_bot: bool = False) -> bool:
        """Rules 2 and 4 alone, for a platform that must decide before a message exists."""
        if is_bot:
            return False
        access = self._settings.access
        if (
            access.allow_channels
            and f"{platform}:{channel}" not in access.allow_channels
            and channel not in access.allow_channels
        ):
            log.info("ignored message in channel %s:%s: not in access.allow_channels", platform, channel)
            return False
        if access.allow_users and user_id not in access.allow_users:
            log.info("ignored message from user %s: not in access.allow_users", user_id)
            return False
        return True

    @property
    def screening(self) -> list[Rule]:
        """Rules 2–5, in order: whether a message is for the bot, allowed, and new."""
        return [self.author, self.mention, self.access, self.duplicate]

    async def author(self, arrival: Arrival, proceed: Next) -> None:
        """Rule 2: bots' messages (this bot's included) go no further."""
        if not arrival.message.is_bot:
            await proceed()

    async def mention(self, arrival: Arrival, proceed: Next) -> None:
        """Rule 3: a mention, a direct message, or a thread the bot follows without one."""
        message = arrival.message
        if message.mentioned or message.is_dm or await self._continues_session(message):
            await proceed()

    async def access(self, arrival: Arrival, proceed: Next) -> None:
        """Rule 4: ``access.allow_channels`` and ``access.allow_users``."""
        key = arrival.message.key
        if self.may_open(platform=key.platform, channel=key.channel, user_id=arrival.message.user_id):
            await proceed()

    async def duplicate(self, arrival: Arrival, proceed: Next) -> None:
        """Rule 5: a platform message id goes on once (the claim is in the store, for every replica)."""
        message = arrival.message
        if await self._store.processed.claim(f"{message.key.platform}:{message.message_id}"):
            await proceed()  # the thread's row is made (or marked active) when its turn is queued
        else:
            log.info("dropped duplicate delivery of %s in %s", message.message_id, message.key)

    async def budget(self, arrival: Arrival, proceed: Next) -> None:
        """Rule 8, once the turn's place came and it is no command: an agent turn goes on within
        its channel's budgets, else the person gets one sentence saying what ran out."""
        refusal, allowance = await self._budgets.admit(arrival.message)
        if refusal is not None:
            metrics.turn_outcome("refused")
            await arrival.outbox.post(Reply(text=refusal, ok=False))
            return
        arrival.allowance = allowance
        await proceed()

    async def _continues_session(self, message: InboundMessage) -> bool:
        """An unmentioned message in a thread: for the bot when the platform follows threads
        without a mention and the bot has a session in this one."""
        # Only Slack makes it a setting: elsewhere each session is a thread the bot opened itself.
        follows = message.key.platform != "slack" or self._settings.slack.reply_without_mention
        return follows and await self._store.threads.exists(message.key)
