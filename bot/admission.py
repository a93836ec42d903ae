"""Whether a message becomes a turn: one chain of rules every adapter's messages pass the same way.

In order, for each message the dispatcher handles:

1. **author**: messages of bots (this one included) are ignored;
2. **mention**: a message is for the bot when it mentions it, is a direct message, or continues
   a thread the bot already has a session in, where the platform answers without a mention
   (Slack: ``slack.reply_without_mention``; every other platform always does);
3. **access**: ``access.allow_channels`` and ``access.allow_users``;
4. **duplicate**: a platform message id is handled once, whichever replica got it (the claim
   is in the store);
5. **queue**: one turn at a time per thread, in order (the dispatcher's line in the store);
6. **budget**: when the turn's place comes, an agent turn starts only within its channel's
   budgets (``limits``); commands are not counted. The budget is read this late so that a
   burst of messages queued in one thread cannot all pass before the first one is counted.

Rules 1–4 are :meth:`Admission.screen`; rule 6 is :meth:`Admission.budget`. A platform that must
decide before any message exists (Discord opens a thread for a mention, and acknowledges a
slash command at once) asks :meth:`Admission.may_open`, which is rules 1 and 3 alone, so a
person the allow-list keeps out gets no thread either.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bot.budgets import Budgets, TokenAllowance
from bot.config import Settings
from bot.events import InboundMessage
from bot.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BudgetCheck:
    """The budget rule's verdict: ``refusal`` (the sentence to post) when a budget is spent,
    and what the turn's tokens are checked against as it goes."""

    refusal: str | None
    allowance: TokenAllowance


class Admission:
    """The chain of rules (see the module docstring)."""

    def __init__(self, settings: Settings, store: Store, budgets: Budgets) -> None:
        self._settings = settings
        self._store = store
        self._budgets = budgets

    def may_open(self, *, platform: str, channel: str, user_id: str, is_bot: bool = False) -> bool:
        """Rules 1 and 3 alone, for a platform that must decide before a message exists."""
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

    async def screen(self, message: InboundMessage) -> bool:
        """Rules 1–4: whether ``message`` is for the bot, allowed, and new. Nothing is posted
        for a message screened out (it was not for the bot, or it was answered already)."""
        key = message.key
        if not self.may_open(
            platform=key.platform, channel=key.channel, user_id=message.user_id, is_bot=message.is_bot
        ):
            return False
        if not (message.mentioned or message.is_dm) and not await self._continues_session(message):
            return False
        if not await self._store.processed.claim(f"{key.platform}:{message.message_id}"):
            log.info("dropped duplicate delivery of %s in %s", message.message_id, key)
            return False
        return True  # the thread's row is made (or marked active) when its turn is queued

    async def budget(self, message: InboundMessage) -> BudgetCheck:
        """Rule 6, once the message's turn may start."""
        refusal, allowance = await self._budgets.admit(message)
        return BudgetCheck(refusal, allowance)

    async def _continues_session(self, message: InboundMessage) -> bool:
        """An unmentioned message in a thread: for the bot when the platform follows threads
        without a mention and the bot has a session in this one."""
        # Only Slack makes it a setting: elsewhere each session is a thread the bot opened itself.
        follows = message.key.platform != "slack" or self._settings.slack.reply_without_mention
        return follows and await self._store.threads.exists(message.key)
