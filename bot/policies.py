"""The channel policy in force for a thread.

A thread takes its channel's policy (``channels."platform:channel"``). A direct-message thread
that started while its author viewed a channel they are a member of takes that channel's
system prompt, data folder, sources and MCP servers over the DM's own
(:meth:`~bot.config.ChannelPolicy.in_view_of`): decided once, as the thread starts, and said in
the thread. Membership is asked again (the platform caches it briefly) on every later turn: a
person no longer a member gets the DM's own policy from then on, and one the platform cannot
say about gets it for that turn; either way the thread's kernel, which saw the channel's data
folder, is stopped (its variables saved) so the next one sees only what the thread may.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.config import ChannelPolicy, Settings
from bot.events import InboundMessage, Outbox, ThreadKey
from bot.store import Threads

VIEWED_CHANNEL_NOTICE = "Using #{name}'s sources and files in this thread."
NOT_A_MEMBER_NOTICE = (
    "You are not a member of #{name}, so this thread does not use its sources and files (only members get them)."
)
NO_LONGER_A_MEMBER_NOTICE = (
    "You are no longer a member of the channel whose sources and files this thread used, "
    "so it uses this conversation's own from now on."
)
MEMBERSHIP_UNKNOWN_NOTICE = (
    "I could not check that you are still a member of the channel whose sources and files this thread uses, "
    "so this answer goes without them."
)


@dataclass(frozen=True, slots=True)
class InForce:
    """A turn's policy, and whether the thread's kernel must stop first (it saw a channel's
    data folder the thread may no longer see)."""

    policy: ChannelPolicy
    stop_kernel: bool = False


class ThreadPolicies:
    """The policy in force for each thread (see the module docstring)."""

    def __init__(self, settings: Settings, threads: Threads) -> None:
        self._settings = settings
        self._threads = threads

    async def of(self, key: ThreadKey) -> ChannelPolicy:
        """The thread's policy as decided (``status``, a kernel taken over): no membership asked."""
        own = self._settings.policy_for(key.channel_key)
        viewed = await self._viewed(key)
        return own if viewed is None else own.in_view_of(self._settings.channels[viewed])

    async def for_turn(self, message: InboundMessage, outbox: Outbox) -> InForce:
        """The policy for ``message``'s turn: decided on a DM thread's first turn, membership
        asked again on its later ones; what the person should know is said in the thread."""
        key = message.key
        own = self._settings.policy_for(key.channel_key)
        if not message.is_dm or not self._settings.channels:
            return InForce(own)
        if (decided := await self._decide(message, outbox)) is not None:
            return InForce(own.in_view_of(self._settings.channels[decided]) if decided else own)
        viewed = await self._viewed(key)
        if viewed is None:
            return InForce(own)
        member = await message.member_of(viewed) if message.member_of is not None else None
        if member:
            return InForce(own.in_view_of(self._settings.channels[viewed]))
        if member is None:
            await outbox.notify(MEMBERSHIP_UNKNOWN_NOTICE)
        else:
            await self._threads.forget_viewed_channel(key)
            await outbox.notify(NO_LONGER_A_MEMBER_NOTICE)
        return InForce(own, stop_kernel=True)

    async def _viewed(self, key: ThreadKey) -> str | None:
        """The channel the thread took its policy from, if it still has one configured."""
        viewed = await self._threads.viewed_channel(key) if self._settings.channels else None
        return viewed if viewed and viewed in self._settings.channels else None

    async def _decide(self, message: InboundMessage, outbox: Outbox) -> str | None:
        """On a DM thread's first turn written while viewing a channel with a policy: decide,
        once, whether that channel lends the thread its policy (members only) and say so; the
        channel's key, or ``""`` for the DM's own. None when there is nothing to decide."""
        viewing = message.viewing
        if viewing is None or viewing.key not in self._settings.channels:
            return None
        if await self._threads.viewed_channel(message.key) is not None:
            return None  # decided by an earlier turn of the thread
        decided = await self._threads.decide_viewed_channel(message.key, viewing.key if viewing.member else "")
        if decided == viewing.key:
            await outbox.notify(VIEWED_CHANNEL_NOTICE.format(name=viewing.name))
        elif not viewing.member and decided == "":
            await outbox.notify(NOT_A_MEMBER_NOTICE.format(name=viewing.name))
        return decided
