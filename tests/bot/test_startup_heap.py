"""After the start, a full collection walks only what was made since: the start's objects
(modules, settings, the core) are frozen, so a crowd's turns never wait on a walk of them."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.bot.test_console import REPO

# A bot process's start, as far as the heap is concerned: the core's and a platform's modules.
START = """
import gc, json
import bot.app, adapters.slack
before = len(gc.get_objects())
bot.app.freeze_startup_heap()
gc.collect()
print(json.dumps({"before": before, "walked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}))
"""


def test_the_start_s_objects_are_left_out_of_later_collections() -> None:
    out = subprocess.run(
        [sys.executable, "-c", START], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    heap = json.loads(out)
    assert heap["before"] > 100_000  # what a full collection walked before
    assert heap["frozen"] >= heap["before"] * 0.9
    assert heap["walked"] < heap["before"] / 20
