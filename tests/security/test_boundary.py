"""Attacks on the boundary between the bot and what a kernel writes (issue 10, findings 1-3, 8-10).

The kernel is hostile and fast: it swaps files for links while the bot reads them, plants
FIFOs and device links where the bot looks, sends outputs far over every budget and fills
its workspace. Each attack runs against spawned and forked sandboxed kernels with a
neighbour thread that must keep answering, and checks what the bot would send or store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from bot.agent.observation import format_observation
from bot.attachments import add_previews, ingest
from bot.events import Attachment
from bot.turn import Outputs, collect_outputs
from kernels import ExecutionResult, KernelPool, KernelSession, Outcome
from kernels.build import oneshot_for
from tests.fakes.outputs import PeakRss
from tests.security.conftest import CANARY, HostFiles, Outcomes
from tests.security.test_attacks import attack, report

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: Code that keeps replacing ``names`` (regular files the kernel made, or uploads) with links.
SWAPPER = """
import os, threading, time
def _swap(names, target, seconds, stop):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end and not stop.is_set():
        for name in list(names()):
            try:
                os.symlink(target, f'.l{n}')
                os.replace(f'.l{n}', name)
                n += 1
                with open(f'.f{n}', 'w') as f:
                    f.write('plain data\\n')
                os.replace(f'.f{n}', name)
            except OSError:
                pass
    return n
"""


async def _drain(pinned_outputs: Outputs) -> list[bytes]:
    """What an adapter would upload: every file's bytes, through the readers it gets."""

    def read_all() -> list[bytes]:
        data = []
        for file in pinned_outputs.files:
            with file.open_reader() as reader:
                data.append(reader.read())
        return data

    return [*(image.data for image in pinned_outputs.images), *await asyncio.to_thread(read_all)]


async def test_changed_file_swapped_for_a_link_after_the_check(
    attacker: KernelSession, neighbour: KernelSession, host_files: HostFiles, outcomes: Outcomes
) -> None:
    started = report(
        await attack(
            attacker,
            neighbour,
            SWAPPER
            + f"""
stop = threading.Event()
for name in ('report.csv', 'chart.png'):
    open(name, 'w').write('plain data\\n')
threading.Thread(target=_swap, args=(lambda: ['report.csv', 'chart.png'], {str(host_files.config)!r}, 30, stop),
                 daemon=True).start()
print(json.dumps({{'swapping': True}}))
""",
        )
    )
    assert started == {"swapping": True}
    changed = ExecutionResult(changed_files=["report.csv", "chart.png"])
    sent = refused = 0
    # Between turns the kernel is frozen and the swapper with it, so no turn ever meets this
    # race; thawed here, the bot's reader itself is what is tested.
    await attacker._kernel.thaw()
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        outputs = Outputs()
        try:
            await collect_outputs([changed], attacker.workspace, outputs)
            for data in await _drain(outputs):
                assert CANARY.encode() not in data, "the bot read the bot's config through a swapped link"
                assert data == b"plain data\n", data[:100]
                sent += 1
            refused += 2 - len(outputs.files) - len(outputs.images)
        finally:
            outputs.close()
    await attacker.execute("stop.set()")
    assert sent > 0 and refused > 0, (sent, refused)  # both states were seen: the race really ran
    outcomes.record(
        "swap a file the turn changed for a symlink to the bot's config after the check, before the upload",
        "contained: each read got the kernel's own file or found a link and sent nothing; "
        "the bot reads from the descriptor it checked (openat2, no links)",
    )


async def test_upload_renamed_over_by_a_link_while_the_bot_writes_it(
    attacker: KernelSession,
    neighbour: KernelSession,
    host_files: HostFiles,
    outcomes: Outcomes,
    sandbox_pool: KernelPool,
) -> None:
    report(
        await attack(
            attacker,
            neighbour,
            SWAPPER
            + f"""
stop = threading.Event()
uploads = lambda: [n for n in os.listdir('.') if n.startswith('upload')]
threading.Thread(target=_swap, args=(uploads, {str(host_files.config)!r}, 30, stop), daemon=True).start()
print(json.dumps({{'watching': True}}))
""",
        )
    )
    csv = b"region,amount\n" + b"".join(b"north,%d\n" % i for i in range(2000))

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(csv), 4096):
            yield csv[start : start + 4096]
            await asyncio.sleep(0)  # give the kernel every chance to act mid-write

    previews = []
    for _ in range(15):
        intake = await ingest(
            [Attachment(name="upload.csv", size=len(csv), mime="text/csv", fetch=chunks)],
            attacker.workspace,
            max_bytes=2**20,
        )
        assert [upload.size for upload in intake.saved] == [len(csv)]  # written whole, through its own descriptor
        # The preview is a one-shot's (sandboxed) reading of the file the bot opened (no link
        # followed): whatever the swap left there, never the host file.
        oneshot = oneshot_for(sandbox_pool.settings, sandbox_pool.launcher)
        previews.extend(upload.preview for upload in await add_previews(intake.saved, attacker.workspace, oneshot))
    await attacker.execute("stop.set()")
    assert len(previews) == 15
    assert host_files.config.read_text() == f"slack:\n  bot_token: {CANARY}\n"  # nothing written through the link
    for text in previews:
        assert CANARY not in text, text[:200]
    outcomes.record(
        "rename a symlink to the bot's config over a fresh upload while the bot writes it and the kernel previews it",
        "contained: every upload written whole through its own descriptor; previews are computed in a "
        "sandboxed one-shot from the file the bot opened (a link is not followed), which cannot see the bot's config",
    )


async def test_kernel_log_replaced_by_fifo_or_device_link_then_suicide(
    sandbox_pool: KernelPool, attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes
) -> None:
    plants = {
        "fifo": "os.mkfifo(log)",
        "/dev/zero link": "os.symlink('/dev/zero', log)",
        "folder": "os.mkdir(log)",
    }
    extra = [await sandbox_pool.get_or_start(f"slack:C9:log-{i}") for i in range(len(plants) - 1)]
    sessions = [attacker, *extra]
    try:
        codes = [
            f"""
import os, sys
log = os.path.join(os.path.dirname(sys.argv[sys.argv.index('-f') + 1]), 'kernel.log')
os.unlink(log)
{plant}
os.kill(os.getpid(), 9)
"""
            for plant in plants.values()
        ]
        started = time.monotonic()
        results = await asyncio.gather(
            *(session.execute(code, timeout=20) for session, code in zip(sessions, codes, strict=True)),
            neighbour.execute("1+1", timeout=20),
        )
        elapsed = time.monotonic() - started
        *died, answer = results
        assert answer.ok and answer.result == "2"
        for result in died:
            assert result.outcome is Outcome.DIED, (result.error, result.stdout)
            assert "The kernel died during this execution" in (result.notice or "")
        assert elapsed < 10, f"death notices took {elapsed:.1f} s"
        again = await attacker.execute("1+1")
        assert again.result == "2"
    finally:
        for session in extra:
            await sandbox_pool.shutdown(session.key)
    outcomes.record(
        "replace kernel.log with a FIFO, a link to /dev/zero or a folder, then kill the kernel (three threads at once)",
        "contained: each thread got its death notice within seconds, the neighbour answered; the log is "
        "read through safefs (no FIFO, no link, last 2 KB only)",
    )


async def test_huge_display_output_is_refused_at_the_socket(
    attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes
) -> None:
    code = """
from IPython.display import display
payload = 'A' * (120 * 2**20)
display({'image/png': payload}, raw=True)
del payload
print('after')
"""
    with PeakRss() as rss:
        result = await attacker.execute(code, timeout=30)
    assert result.outcome is Outcome.OK, result
    assert result.images == [] and "output of this execution was lost" in (result.notice or "")
    growth = rss.growth / 2**20
    print(f"bot peak RSS growth receiving a 120 MiB output: {growth:.1f} MiB")
    assert growth < 60, f"the bot grew by {growth:.0f} MiB receiving a 120 MiB output"
    again = await attacker.execute("print(40 + 2)")
    assert again.stdout == "42\n", again  # iopub was renewed: output flows again
    answer = await neighbour.execute("1+1")
    assert answer.result == "2"
    outcomes.record(
        "one 120 MiB display_data message",
        "refused by the socket (ZMQ MAXMSGSIZE) before decoding, bot peak under +60 MiB; "
        "the model is told output was lost; the next cell's output arrives",
    )


async def test_writing_past_the_workspace_quota_stops_the_kernel(
    attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes
) -> None:
    quota = attacker.workspace.quota_bytes
    attempted = 3000 * 2**20
    result = await attack(
        attacker,
        neighbour,
        """
import os
for i in range(3000):
    with open(f'fill-{i}.bin', 'wb') as f:
        f.write(b'x' * 2**20)
""",
        timeout=60,
        overlap=True,
    )
    used = await attacker.workspace.usage_bytes()
    assert result.outcome is Outcome.DIED, result
    assert "workspace quota" in (result.notice or "") and "the kernel was stopped" in (result.notice or "")
    print(f"workspace quota {quota >> 20} MiB: stopped at {used >> 20} MiB")
    assert quota < used < attempted, used  # stopped while writing, not after
    cleanup = await attacker.execute("import glob, os\nfor f in glob.glob('fill-*'): os.remove(f)\nprint('ok')")
    assert cleanup.stdout.endswith("ok\n"), cleanup  # shrinking an over-full workspace is allowed
    outcomes.record(
        "write 3 GiB into a workspace with a 64 MiB quota",
        "stopped while still writing, with a clear notice (usage checked every 0.25 s while code runs); "
        "deleting files afterwards works",
    )


async def test_control_and_bidi_characters_in_file_names_are_shown_escaped(
    attacker: KernelSession, neighbour: KernelSession, outcomes: Outcomes
) -> None:
    result = await attack(
        attacker,
        neighbour,
        """
for name in ('a\\nsaved: passwd.csv', 'report\\u202egpj.exe', 'bell\\x07\\x1b[31m.txt'):
    open(name, 'w').write('x')
print(json.dumps({}))
""",
    )
    report(result)
    outputs = Outputs()
    try:
        await collect_outputs([result], attacker.workspace, outputs)
        names = [file.name for file in outputs.files]
    finally:
        outputs.close()
    observation = format_observation(result)
    assert sorted(names) == ["a\\nsaved: passwd.csv", "bell\\x07\\x1b[31m.txt", "report\\u202egpj.exe"], names
    for text in [*names, observation]:
        assert "\u202e" not in text and "\x1b" not in text and "\x07" not in text
    assert "\nsaved:" not in observation
    outcomes.record(
        "file names with a newline, a bidi override and terminal escapes",
        "shown escaped (\\n, \\u202e, \\x1b) in uploads, notices and what the model reads",
    )
