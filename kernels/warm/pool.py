"""Warm pool: kernels started ahead so a new thread's first execution does not wait.

The problem: a kernel's working directory (and, under the sandbox, its ``/workspace`` bind
mount) is fixed when it starts, before anyone knows which thread will use it.

The mechanism ("adopt"): each warm kernel starts in its own fresh, empty folder
``<workspace_root>/.warm/<id>``. On hand-out the files already in the thread's workspace
(uploads of the first message) are moved into that folder, and the folder is renamed onto
the thread's workspace path. A rename keeps the inode, so the kernel's cwd and any bind
mount follow it, and every ``Workspace`` object the bot holds stays valid because it
addresses the folder by the same path. ``rename(2)`` replaces the (now empty) old
workspace folder atomically; if a file appeared in it meanwhile the rename fails with
``ENOTEMPTY`` and the move is repeated. Uploads to a thread happen only inside that
thread's turn (the dispatcher runs one turn per thread at a time) and before the kernel is
requested, so no upload is in flight while its workspace is adopted.

Warm kernels count toward ``max_kernels``: the pool refills only while there is room, and a
new thread that finds no warm kernel ready first shrinks the warm pool before it evicts
another thread's idle kernel. Refills run one at a time, and each waits (a bounded time)
until no thread's code is executing, so warming never competes with a running turn.

The pool's size is fixed (``warm_pool: N``) or follows a :class:`~kernels.warm.target.WarmTarget`
(``warm_pool: auto``): then every new thread is an arrival, and the refill loop looks at the
target whenever it is kicked and every few seconds, starting kernels up to it and, once it
has stayed lower for a minute, discarding the oldest ready ones above it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from kernels.host import safefs
from kernels.seam.options import KernelOptions
from kernels.seam.plan import KernelHandle, Launcher, LaunchPlan
from kernels.seam.result import KernelStartError
from kernels.seam.wire import run_silently, warm_up_code
from kernels.warm.target import WarmTarget

log = logging.getLogger(__name__)

WARM_DIR = ".warm"
#: How long a refill defers to running executions before it goes ahead anyway.
MAX_DEFER_S = 5.0
#: How long a refill waits, after a hand-out, for the thread's first cell to begin (then it
#: defers to that cell like any other): a kernel start beside a first cell on 2 cores made
#: that cell ~7 ms slower. A model that takes longer to write the cell finds the refill going.
HANDOUT_GRACE_S = 0.5
#: Pause after a failed warm start before the next try.
RETRY_DELAY_S = 5.0
#: After this many failed warm starts in a row the refill waits for the next kick (an arrival,
#: a kernel that stopped) instead of retrying on its own.
MAX_FAILED_STARTS = 5


def _follow_rename_code(folder: Path) -> str:
    # Without a sandbox HOME is the workspace: it named the warm folder's old path.
    return (
        "def _threadbook_adopt(old):\n"
        "    import os\n"
        "    if os.environ.get('HOME') == old:\n"
        "        os.environ['HOME'] = os.getcwd()\n"
        f"_threadbook_adopt({str(folder)!r})\n"
        "del _threadbook_adopt\n"
    )


class WarmKernel:
    """A ready kernel waiting in its own empty folder for a thread."""

    def __init__(
        self, handle: KernelHandle, folder: Path, owner: tuple[int, int] | None = None, *, home_follows: bool = True
    ) -> None:
        """``owner``: the host (uid, gid) the kernel's files belong to (a root bot's sandbox), else
        None; ``home_follows``: the kernel's ``HOME`` names the folder (unsandboxed), and must
        follow its rename (sandboxed it is ``/workspace``, which the rename keeps)."""
        self.handle = handle
        self.folder = folder
        self.owner = owner
        self.home_follows = home_follows

    async def adopt(self, workspace: Path) -> KernelHandle:
        """Give the kernel ``workspace``: move its files in, rename the folder onto it."""
        await asyncio.to_thread(adopt_folder, self.folder, workspace, self.owner)
        if self.home_follows:  # a round trip to the kernel only where its HOME named the old path
            await run_silently(self.handle, _follow_rename_code(self.folder))
        return self.handle

    async def discard(self) -> None:
        """Stop the kernel and remove its folder."""
        try:
            await self.handle.shutdown()
        finally:
            await asyncio.to_thread(shutil.rmtree, self.folder, True)


def adopt_folder(folder: Path, workspace: Path, owner: tuple[int, int] | None = None) -> None:
    """(Blocking) move ``workspace``'s entries into ``folder``, then rename ``folder`` to ``workspace``.

    ``owner``: the warm kernel's host uid and gid (a root bot gives every workspace its own
    uid): what the thread's earlier kernels wrote (its files, its variable snapshot) is
    handed to it, without following a link, or the kernel could not read its own thread.
    """
    if not folder.is_dir():
        raise KernelStartError(f"the warm kernel's folder {folder} is gone")
    for entry in list(os.scandir(folder)):  # a warm folder should be empty; never mix leftovers in
        shutil.rmtree(entry.path) if entry.is_dir(follow_symlinks=False) else os.unlink(entry.path)
    workspace.mkdir(parents=True, exist_ok=True, mode=0o700)
    for _ in range(100):
        for entry in list(os.scandir(workspace)):
            os.rename(entry.path, folder / entry.name)
        if owner is not None:
            safefs.chown_tree(folder, *owner)
        try:
            os.rename(folder, workspace)  # replaces the now empty folder atomically
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    raise KernelStartError(f"{workspace} kept changing while a warm kernel was handed over")


class HandOff:
    """A one-shot :class:`~kernels.seam.plan.Launcher` for one session: its first start adopts a
    warm kernel.

    Later starts of the same session (after a death or a restart) go to ``fallback``, as
    does the first one when the warm kernel turns out to be unusable. Plans are
    ``fallback``'s: only a plan's workspace matters to an adoption.
    """

    def __init__(self, warm: WarmKernel, fallback: Launcher) -> None:
        self._warm: WarmKernel | None = warm
        self.fallback = fallback

    @property
    def isolation(self) -> str:
        """The fallback's isolation (the warm kernel was started by it)."""
        return self.fallback.isolation

    def kernel_view(self, options: KernelOptions) -> KernelOptions:
        """``options`` as the fallback's kernels see them."""
        return self.fallback.kernel_view(options)

    def plan(self, workspace: Path, options: KernelOptions) -> LaunchPlan:
        """The fallback's plan."""
        return self.fallback.plan(workspace, options)

    async def start(self, plan: LaunchPlan) -> KernelHandle:
        """The warm kernel, now in ``plan.workspace``; a fresh one from ``fallback`` after that."""
        warm, self._warm = self._warm, None
        if warm is not None:
            try:
                return await warm.adopt(plan.workspace)
            except Exception:
                log.warning("a warm kernel could not be handed over; starting one", exc_info=True)
                await warm.discard()
        return await self.fallback.start(plan)

    async def attach(self, remote_id: str) -> KernelHandle | None:
        """The fallback's."""
        return await self.fallback.attach(remote_id)

    async def open(self) -> None:
        """Nothing to start: the fallback's background work belongs to the pool."""

    async def close(self) -> None:
        """Nothing to stop."""


class WarmPool:
    """Keeps up to ``size`` ready kernels, refilling one at a time in the background; ``size``
    is fixed or follows a :class:`WarmTarget`."""

    def __init__(
        self,
        launcher: Launcher,
        *,
        root: Path,
        size: int | WarmTarget,
        preload: tuple[str, ...] = (),
        options: KernelOptions = KernelOptions(),
        has_room: Callable[[], bool] = lambda: True,
        busy: Callable[[], bool] = lambda: False,
        sessions: Callable[[], int] = lambda: 0,
    ) -> None:
        """``size``: how many kernels to keep ready, or the target that says so (``auto``);
        ``preload``: the modules a warm kernel imports before it is handed out;
        ``has_room()``: may one more kernel start (the ``max_kernels`` cap);
        ``busy()``: is some thread's code running (refills wait for it, at most ``MAX_DEFER_S``);
        ``sessions()``: how many threads have kernels (the target's caps)."""
        self.launcher = launcher
        self.warm_up = warm_up_code(preload)
        self.folder_root = Path(root) / WARM_DIR
        #: The adaptive target (``warm_pool: auto``), or None for a fixed size.
        self.target = size if isinstance(size, WarmTarget) else None
        #: How many kernels to keep now (with a target: its last answer).
        self.size = size.size(sessions=0) if isinstance(size, WarmTarget) else size
        #: New threads (that a warm kernel could serve) that got one, and that did not.
        self.hits = 0
        self.misses = 0
        self.options = options
        self._has_room = has_room
        self._busy = busy
        self._sessions = sessions
        self._ready: list[WarmKernel] = []
        self._starting = 0
        #: Starts in flight whose kernel is to be thrown away on arrival (room was needed).
        self._doomed = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: asyncio.Task[bool] | None = None
        #: Discards of warm kernels that died while waiting (kept so they finish; awaited by stop()).
        self._discards: set[asyncio.Task[None]] = set()
        self._closed = False
        #: When the last warm kernel was handed out (``time.monotonic()``).
        self._handed_out_at = -HANDOUT_GRACE_S

    @property
    def count(self) -> int:
        """Warm kernels that are ready or starting (what counts toward ``max_kernels``)."""
        return len(self._ready) + self._starting - self._doomed

    def start(self) -> None:
        """Begin filling the pool in the background."""
        if self._task is None and (self.size > 0 or self.target is not None):
            self._closed = False
            self._task = asyncio.create_task(self._refill_loop(), name="warm-pool-refill")

    def kick(self) -> None:
        """Look again whether a refill is due (after a hand-out or a kernel stopped)."""
        self._wake.set()

    def fits(self, options: KernelOptions) -> bool:
        """Whether a kernel for ``options`` may come from this pool."""
        return options.for_launch() == self.options

    def arrived(self, *, hit: bool) -> None:
        """A new thread that fits this pool got its kernel: a warm one (``hit``) or not. Counts
        it, and with a target records the arrival (the refill loop looks again)."""
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        if self.target is not None:
            self.target.record()
            self.kick()

    async def take(self) -> WarmKernel | None:
        """A ready, live warm kernel, or None. The pool refills behind it."""
        while self._ready:
            warm = self._ready.pop(0)
            self.kick()
            if await warm.handle.is_alive():
                self._handed_out_at = time.monotonic()
                return warm
            log.warning("a warm kernel died while waiting; discarding it")
            self._discard_in_background(warm)
        return None

    def _discard_in_background(self, warm: WarmKernel) -> None:
        """Discard ``warm`` in a task of its own (:meth:`stop` waits for it: no process is left)."""
        task = asyncio.create_task(self._discard_quietly(warm), name="warm-kernel-discard")
        self._discards.add(task)
        task.add_done_callback(self._discards.discard)

    async def shrink(self) -> bool:
        """Give up one warm kernel to make room for a thread. False when there is none."""
        if self._ready:
            await self._ready.pop().discard()
            return True
        if self._starting - self._doomed > 0:
            self._doomed += 1
            return True
        return False

    async def wait_ready(self, count: int | None = None, timeout: float = 60.0) -> None:
        """Wait until ``count`` (default: ``size``) kernels are ready (tests, benchmarks)."""
        want = self.size if count is None else count
        deadline = time.monotonic() + timeout
        while len(self._ready) < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self._ready)} of {want} warm kernels ready after {timeout:g} s")
            await asyncio.sleep(0.02)

    async def _discard_quietly(self, warm: WarmKernel) -> None:
        try:
            await warm.discard()
        except Exception:
            log.exception("discarding a warm kernel failed")

    async def stop(self) -> None:
        """Stop refilling and shut down every warm kernel; no process outlives this call."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._inflight is not None:
            await asyncio.gather(self._inflight, return_exceptions=True)
        ready, self._ready = self._ready, []
        outcomes = await asyncio.gather(*(w.discard() for w in ready), *self._discards, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                log.error("stopping a warm kernel failed: %r", outcome)
        await asyncio.to_thread(shutil.rmtree, self.folder_root, True)

    def touch(self) -> None:
        """(Blocking) mark the warm folders as used now, so workspace retention spares them."""
        for folder in [self.folder_root, *(warm.folder for warm in self._ready)]:
            try:
                os.utime(folder)
            except OSError:
                pass

    async def _refill_loop(self) -> None:
        failures = 0
        while not self._closed:
            self._wake.clear()
            if self.target is not None:
                await self._follow(self.target)
            if self._due():
                await self._defer_to_running_code()
                if self._due():
                    # Shielded: stopping the loop must not cancel a launch half-way (its
                    # process would be left behind); stop() waits for it instead.
                    self._inflight = asyncio.create_task(self._add_one())
                    if await asyncio.shield(self._inflight):
                        failures = 0
                    else:
                        failures += 1
                        if failures < MAX_FAILED_STARTS:
                            await asyncio.sleep(RETRY_DELAY_S)
                            continue
                        log.error(
                            "%d warm kernels failed to start in a row: refilling waits for the next thread", failures
                        )
                        failures = 0
                        await self._wake.wait()
                continue
            if self.target is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.target.evaluate_every_s)

    async def _follow(self, target: WarmTarget) -> None:
        """Ask ``target`` for the size now (memory read off the event loop when due), and
        discard the oldest ready kernels it has wanted fewer of for its quiet time."""
        if target.memory_stale:
            await asyncio.to_thread(target.read_memory, self.count + self._sessions())
        size = target.size(sessions=self._sessions())
        if size != self.size:
            log.info("warm pool target %d (was %d)", size, self.size)
        self.size = size
        for _ in range(target.surplus(ready=len(self._ready), size=size)):
            self._discard_in_background(self._ready.pop(0))

    def _due(self) -> bool:
        return not self._closed and self.count < self.size and self._has_room()

    async def _defer_to_running_code(self) -> None:
        """Wait while threads' code runs (at most :data:`MAX_DEFER_S`), and first, right after a
        hand-out, for the thread's first cell to begin (at most :data:`HANDOUT_GRACE_S`)."""
        deadline = time.monotonic() + MAX_DEFER_S
        while not self._busy() and time.monotonic() < self._handed_out_at + HANDOUT_GRACE_S:
            await asyncio.sleep(0.02)
        while self._busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def _add_one(self) -> bool:
        folder = self.folder_root / uuid.uuid4().hex[:12]
        self._starting += 1
        warm: WarmKernel | None = None
        failed = False
        try:
            await asyncio.to_thread(folder.mkdir, parents=True, mode=0o700)
            plan = self.launcher.plan(folder, self.options)
            owner = plan.identity.host_owner if plan.identity is not None else None
            home_follows = plan.environment.get("HOME") == str(folder)
            warm = WarmKernel(await self.launcher.start(plan), folder, owner, home_follows=home_follows)
            await run_silently(warm.handle, self.warm_up)
            if self.target is not None and (footprint := await warm.handle.memory_bytes()):
                self.target.note_kernel_bytes(footprint)
        except Exception:
            log.warning("starting a warm kernel failed", exc_info=True)
            failed = True
        self._starting -= 1
        keep = not failed and not self._closed and not self._doomed
        if self._doomed:
            self._doomed -= 1
        if keep:
            assert warm is not None
            self._ready.append(warm)
            return True
        if warm is not None:
            await warm.discard()
        else:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        return not failed
