"""``python -m bench.bot_work [--sandbox none|bwrap] [-n N]``: what the bot's own work costs a thread.

Two measures, through the whole bot (the real dispatcher, real kernels, the scripted model):

* ``export html`` of a thread with one matplotlib chart, from the message to the reply;
* an upload's preview: a turn with a small CSV attached minus the same turn without it
  (the model answers at once, so the difference is what the preview adds).

Prints medians (and min–max) in milliseconds as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from bot.app import Core
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat, bytes_attachment
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

CSV = b"region,units,price\n" + b"".join(b"north,%d,%d.5\n" % (i, i) for i in range(200))


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(samples) * 1000, 1),
        "min_ms": round(min(samples) * 1000, 1),
        "max_ms": round(max(samples) * 1000, 1),
    }


async def measure(sandbox: str, n: int) -> dict[str, object]:
    """Median latencies of ``export html`` and of one upload preview under ``sandbox``."""
    with tempfile.TemporaryDirectory(prefix="bench-bot-work-") as folder:
        root = Path(folder)
        async with ScriptedOpenAI() as llm:
            settings = make_settings(root, llm_url=llm.base_url, kernels={"sandbox": sandbox})
            async with Core.open(settings) as core:
                chat = MemoryChat(core.dispatcher)
                llm.script(
                    tool_call("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.show()"),
                    answer("Here is the chart."),
                )
                await chat.say("bar chart please")
                exports: list[float] = []
                for _ in range(n + 1):
                    started = time.perf_counter()
                    reply = (await chat.say("export html", mentioned=False)).reply
                    exports.append(time.perf_counter() - started)
                    assert reply.ok, reply.text
                plain: list[float] = []
                with_upload: list[float] = []
                for i in range(n + 1):
                    llm.script(answer("ok"))
                    started = time.perf_counter()
                    await chat.say("hello")
                    plain.append(time.perf_counter() - started)
                    llm.script(answer("ok"))
                    attachment = bytes_attachment(f"sales{i}.csv", CSV)
                    started = time.perf_counter()
                    await chat.say("hello", attachments=[attachment])
                    with_upload.append(time.perf_counter() - started)
                    assert "CSV, 200 rows" in json.dumps(llm.requests[-1]), "no preview reached the model"
    # The first of each is a warm-up (imports, caches).
    previews = [u - p for u, p in zip(with_upload[1:], plain[1:])]
    return {
        "sandbox": sandbox,
        "export_html": _summary(exports[1:]),
        "preview_added": _summary(previews),
        "turn_without_upload": _summary(plain[1:]),
    }


def main() -> None:
    """Run the measures and print them."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sandbox", default="none", choices=("none", "bwrap"))
    parser.add_argument("-n", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.sandbox, args.n)), indent=2))


if __name__ == "__main__":
    main()
