"""``warm_pool: auto``: the target's arithmetic on a fake clock, memory readings, the config key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.config import ConfigError, parse_settings
from kernels.warm.target import MiB, WarmTarget, available_memory


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def target(clock: Clock, **overrides: Any) -> WarmTarget:
    values: dict[str, Any] = {"max_kernels": 100, "clock": clock}
    values.update(overrides)
    return WarmTarget(**values)


def test_quiet_bot_keeps_one_and_a_burst_raises_the_target() -> None:
    clock = Clock()
    clock.now = 60.0 * 100  # at the start of a minute
    t = target(clock)
    assert t.size(sessions=0) == 1  # nobody came yet: one ready for the next new thread
    for _ in range(3):
        t.record()
        clock.now += 90  # a trickle: one new thread every minute and a half
    assert t.demand() == 1
    t.record()
    clock.now += 20
    t.record()  # two in one minute
    assert t.demand() == 2
    for _ in range(20):
        t.record()  # a burst
    assert t.size(sessions=0) == 22  # this minute: 2 + the burst of 20


def test_the_peak_minute_lasts_an_hour_then_decays() -> None:
    clock = Clock()
    clock.now = 60.0 * 100  # at the start of a minute
    t = target(clock)
    for _ in range(12):
        t.record()
    clock.now += 60 * 30
    t.record()  # a trickle later on
    clock.now += 60 * 29 + 59  # the burst's minute is still within the hour
    assert t.demand() == 12
    clock.now += 1  # the 61st minute: the burst's has left the window
    assert t.demand() == 1
    clock.now += 60 * 60
    assert t.demand() == 1  # the floor, with nothing left in the window


def test_max_kernels_less_the_threads_caps_the_target_below_the_floor() -> None:
    clock = Clock()
    t = target(clock, max_kernels=10)
    for _ in range(8):
        t.record()
    assert t.size(sessions=0) == 8
    assert t.size(sessions=4) == 6
    assert t.size(sessions=10) == 0  # no room at all: not even the floor


def test_available_memory_caps_the_target() -> None:
    clock = Clock()
    free = [2048 * MiB]
    reads: list[int] = []

    def memory() -> int:
        reads.append(1)
        return free[0]

    t = target(clock, memory=memory, reserve_bytes=512 * MiB, kernel_bytes=128 * MiB, memory_every_s=5)
    for _ in range(30):
        t.record()
    assert t.memory_stale and t.size(sessions=0) == 30  # no reading yet: no memory cap
    t.read_memory(kernels=3)  # 3 kernels run, and (2048 - 512) / 128 = 12 more fit
    assert t.memory_cap() == 15 and t.size(sessions=2) == 13
    assert not t.memory_stale
    clock.now += 5
    assert t.memory_stale
    free[0] = 256 * MiB  # below the reserve: the kernels running are already too many
    t.read_memory(kernels=15)
    assert t.memory_cap() == 13 and t.size(sessions=5) == 8
    t.note_kernel_bytes(32 * MiB)  # a warm kernel measured: the estimate it gives
    free[0] = 1024 * MiB
    t.read_memory(kernels=0)
    assert t.memory_cap() == 16
    assert len(reads) == 3


def test_no_memory_reader_means_no_memory_cap() -> None:
    t = WarmTarget(max_kernels=5, memory=None)
    assert not t.memory_stale
    t.read_memory(kernels=5)
    assert t.memory_cap() is None


def test_extra_ready_kernels_go_only_after_a_quiet_minute() -> None:
    clock = Clock()
    t = target(clock, quiet_s=60)
    assert t.surplus(ready=5, size=2) == 0  # the target just fell: wait
    clock.now += 30
    assert t.surplus(ready=5, size=3) == 0
    clock.now += 29
    assert t.surplus(ready=5, size=2) == 0
    clock.now += 1
    assert t.surplus(ready=5, size=2) == 3  # lower for a minute: the extra three go
    assert t.surplus(ready=2, size=2) == 0
    clock.now += 120
    assert t.surplus(ready=3, size=2) == 0  # a new dip starts a new quiet minute
    clock.now += 30
    assert t.surplus(ready=2, size=4) == 0  # the target rose meanwhile: the dip is over
    clock.now += 30
    assert t.surplus(ready=3, size=2) == 0
    clock.now += 60
    assert t.surplus(ready=3, size=2) == 1


def test_available_memory_reads_meminfo_and_a_cgroup_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684096 kB\nMemFree:  100 kB\nMemAvailable:    4194304 kB\n")
    proc_cgroup = tmp_path / "cgroup"
    root = tmp_path / "sys"
    proc_cgroup.write_text("0::/\n")
    assert available_memory(meminfo, proc_cgroup, root) == 4 * 1024 * MiB  # no cgroup files

    # cgroup v2: the bot's leaf has no limit, its parent (the container) has 3 GiB.
    (root / "pod" / "bot").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("memory pids\n")
    proc_cgroup.write_text("0::/pod/bot\n")
    (root / "pod" / "bot" / "memory.max").write_text("max\n")
    (root / "pod" / "memory.max").write_text(f"{3 * 1024 * MiB}\n")
    (root / "pod" / "memory.current").write_text(f"{1024 * MiB}\n")
    (root / "pod" / "memory.stat").write_text(f"anon 1\ninactive_file {512 * MiB}\n")
    assert available_memory(meminfo, proc_cgroup, root) == (3 * 1024 - 1024 + 512) * MiB

    # cgroup v1 (a hybrid host): the memory hierarchy's "no limit" is a huge number.
    (root / "cgroup.controllers").unlink()
    (root / "memory" / "bot").mkdir(parents=True)
    proc_cgroup.write_text("4:memory:/bot\n0::/\n")
    (root / "memory" / "bot" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert available_memory(meminfo, proc_cgroup, root) == 4 * 1024 * MiB
    (root / "memory" / "bot" / "memory.limit_in_bytes").write_text(f"{1024 * MiB}\n")
    (root / "memory" / "bot" / "memory.usage_in_bytes").write_text(f"{800 * MiB}\n")
    (root / "memory" / "bot" / "memory.stat").write_text(f"cache 5\ntotal_inactive_file {100 * MiB}\n")
    assert available_memory(meminfo, proc_cgroup, root) == 324 * MiB

    assert available_memory(tmp_path / "none", tmp_path / "none", root) is None
    assert isinstance(available_memory(), int | None)  # this machine's: reads without failing


@pytest.mark.parametrize(("value", "expected"), [(0, 0), (3, 3), ("2", 2), ("auto", "auto"), ("${WARM:-auto}", "auto")])
def test_warm_pool_takes_a_number_or_auto(value: object, expected: object) -> None:
    settings = parse_settings({"llm": {"base_url": "http://127.0.0.1:1/v1"}, "kernels": {"warm_pool": value}}, env={})
    assert settings.kernels.warm_pool == expected


@pytest.mark.parametrize("value", ["lots", -1, "Auto", 1.5])
def test_a_bad_warm_pool_names_the_key_in_one_clear_line(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({"llm": {"base_url": "http://127.0.0.1:1/v1"}, "kernels": {"warm_pool": value}}, env={})
    message = str(caught.value)
    assert message.startswith("config: kernels.warm_pool: expected a whole number of kernels"), message
    assert "'auto'" in message and repr(value) in message and "\n" not in message and "more]" not in message
