"""``python -m bench.world --api chat|responses [--reasoning]``: the world a Slack bench turn
meets (the fake Slack, a zero-latency model and the people who post), in a process of its own.

In production Slack and the model run elsewhere; in the bot's process the fakes took about a
fifth of its event loop's time in a crowd of turns (bench.cpu's ``fakes`` row), and a turn's
time was partly theirs. Here they run beside the bot as those services do, and the bench
counts their CPU apart (:mod:`bench.cpu`).

The protocol is JSON lines. At start the world prints where it listens::

    {"slack_api_url": ..., "bot_token": ..., "signing_secret": ..., "llm_base_url": ...}

then answers each request line, until its standard input closes::

    {"events_url": URL, "timeout": S, "turns": [{"channel": C, "text": T, "thread_ts": TS or null}]}
    {"turns": [[seconds, ok, ts], ...]}

Each request's turns are posted at once; a turn's time runs from its event's delivery (the
HTTP Events API) to its message's final ✅ or ❌, which the adapter adds after the reply is
posted; ``ok`` means ✅ on an event Slack delivered (HTTP 200).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from tests.fakes.openai_server import ScriptedOpenAI, answer, last_tool_output, tool_call
from tests.fakes.slack_server import FakeSlack

DONE = frozenset({"white_check_mark", "x"})


class BenchSlack(FakeSlack):
    """The fake Slack, telling each turn's waiter when its message got its last reaction: a
    crowd's waiters do not all wake on every call (``FakeSlack.wait_for``), which cost the
    process more than the bot's own work for the turns."""

    def __init__(self) -> None:
        super().__init__()
        self._done: dict[tuple[str, str], asyncio.Future[None]] = {}

    def _notify(self) -> None:
        super()._notify()
        for key, done in list(self._done.items()):
            if DONE & self.reactions.get(key, set()) and not done.done():
                done.set_result(None)

    async def until_done(self, key: tuple[str, str], timeout: float) -> None:
        """Wait until the message ``key`` (channel, ts) has ✅ or ❌."""
        if DONE & self.reactions.get(key, set()):
            return
        self._done[key] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self._done[key], timeout)
        finally:
            del self._done[key]

    async def turn(self, url: str, event: dict[str, Any], timeout: float) -> tuple[float, bool]:
        """Deliver ``event`` to the bot at ``url``; (seconds until its ✅ or ❌, whether ✅)."""
        key = (event["channel"], event["ts"])
        started = time.perf_counter()
        status, _ = await self.post_event(url, event)
        await self.until_done(key, timeout)
        elapsed = time.perf_counter() - started
        return elapsed, status == 200 and self.reactions[key] & DONE == {"white_check_mark"}


def plain_model(request: dict[str, Any]) -> Any:
    """print(1) first, then the answer (whatever order concurrent threads ask in)."""
    if last_tool_output(request) is not None:
        return answer("It printed 1.")
    return tool_call("print(1)")


def reasoning_model(request: dict[str, Any]) -> Any:
    """:func:`plain_model` as a reasoning model answers: its thinking first, on either API."""
    if last_tool_output(request) is not None:
        return answer("It printed 1.", reasoning="The code printed 1, so the answer is 1.")
    return tool_call("print(1)", reasoning="Run print(1) to see what it prints.")


async def _answer(slack: BenchSlack, request: dict[str, Any]) -> list[tuple[float, bool, str]]:
    events = [
        slack.message_event(t["channel"], t["text"], thread_ts=t["thread_ts"])
        if t.get("thread_ts")
        else slack.mention(t["channel"], t["text"])
        for t in request["turns"]
    ]
    outcomes = await asyncio.gather(
        *(slack.turn(request["events_url"], e, request["timeout"]) for e in events), return_exceptions=True
    )
    return [
        (o[0], o[1], e["ts"]) if isinstance(o, tuple) else (0.0, False, e["ts"])
        for o, e in zip(outcomes, events, strict=True)
    ]


async def serve(api: str, reasoning: bool) -> None:
    """Run the fakes and answer requests from standard input until it closes."""
    loop = asyncio.get_running_loop()
    requests = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(requests), sys.stdin)
    slack = BenchSlack()
    async with slack, ScriptedOpenAI(apis=(api,)) as llm:
        llm.script(*[reasoning_model if reasoning else plain_model] * 100_000)
        where = {
            "slack_api_url": slack.api_url,
            "bot_token": slack.bot_token,
            "signing_secret": slack.signing_secret,
            "llm_base_url": llm.base_url,
        }
        print(json.dumps(where), flush=True)
        while line := await requests.readline():
            print(json.dumps({"turns": await _answer(slack, json.loads(line))}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=("chat", "responses"), default="chat")
    parser.add_argument("--reasoning", action="store_true", help="the model thinks aloud first")
    args = parser.parse_args()
    asyncio.run(serve(args.api, args.reasoning))


if __name__ == "__main__":
    main()
