"""Feedback on answers in the store: one vote per person and answer, counted per thread and overall."""

from __future__ import annotations

from pathlib import Path

from bot.events import ThreadKey
from bot.store import FeedbackCounts, Store

THREAD = ThreadKey.parse("slack:T1:C1:1700000000.000100")
OTHER = ThreadKey.parse("discord:G1:C2:99")


async def test_votes_are_counted_and_a_second_click_replaces_the_first(store_target: Path | str) -> None:
    async with await Store.open(store_target) as store:
        assert await store.feedback.counts(THREAD) == FeedbackCounts(0, 0)
        await store.feedback.add(THREAD, "C1:1.1", "U1", good=True)
        await store.feedback.add(THREAD, "C1:1.1", "U2", good=False)
        await store.feedback.add(THREAD, "C1:1.2", "U1", good=True)
        await store.feedback.add(OTHER, "5", "U1", good=False)
        await store.feedback.add(THREAD, "C1:1.1", "U2", good=True)  # U2 changed their mind
        assert await store.feedback.counts(THREAD) == FeedbackCounts(3, 0)
        assert await store.feedback.counts(OTHER) == FeedbackCounts(0, 1)
        assert await store.feedback.counts() == FeedbackCounts(3, 1)
    async with await Store.open(store_target) as store:  # kept across a restart
        assert await store.feedback.counts() == FeedbackCounts(3, 1)
