"""kernels.host.safefs against real files: links, FIFOs, devices and races are refused, reads bounded.

Every test runs twice: with ``openat2`` (where the kernel has it) and with the per-component
``O_NOFOLLOW`` walk that replaces it elsewhere.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernels.host import safefs
from kernels.seam.result import UnsafePathError

SECRET = b"TB-SECRET-do-not-read"


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "openat2":
        if not safefs.HAS_OPENAT2:
            pytest.skip("openat2 is not available on this kernel")
    else:
        monkeypatch.setattr(safefs, "HAS_OPENAT2", False)
    yield request.param


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A workspace with a file, a sub folder, and a secret outside it."""
    (tmp_path / "secret.txt").write_bytes(SECRET)
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "data.csv").write_bytes(b"a,b\n1,2\n")
    (root / "sub" / "r.txt").write_bytes(b"hello")
    return root


def read(root: Path, relative: str, max_bytes: int) -> bytes:
    with safefs.open_file(root, relative) as pinned:
        return pinned.read(max_bytes)


def test_reads_regular_files_beneath(resolver: str, tree: Path) -> None:
    assert read(tree, "data.csv", 100) == b"a,b\n1,2\n"
    assert read(tree, "sub/r.txt", 100) == b"hello"
    assert read(tree, "./sub//r.txt", 3) == b"hel"


@pytest.mark.parametrize("name", ["link", "sub/link", "linkdir/secret.txt"])
def test_links_anywhere_in_the_name_are_refused(resolver: str, tree: Path, name: str) -> None:
    os.symlink(tree.parent / "secret.txt", tree / "link")
    os.symlink(tree.parent / "secret.txt", tree / "sub" / "link")
    os.symlink(tree.parent, tree / "linkdir")
    with pytest.raises(UnsafePathError):
        read(tree, name, 100)


@pytest.mark.parametrize("name", ["../secret.txt", "/etc/passwd", "sub/../../secret.txt", "a\x00b", ""])
def test_escapes_are_refused(resolver: str, tree: Path, name: str) -> None:
    with pytest.raises(UnsafePathError):
        read(tree, name, 100)


def test_fifo_is_refused_without_blocking(resolver: str, tree: Path) -> None:
    os.mkfifo(tree / "kernel.log")
    started = time.monotonic()
    with pytest.raises(UnsafePathError):
        read(tree, "kernel.log", 100)
    assert safefs.tail_file(tree, "kernel.log", 100) == b""
    assert time.monotonic() - started < 1


def test_devices_and_folders_are_refused(resolver: str, tree: Path) -> None:
    os.symlink("/dev/zero", tree / "zero")
    with pytest.raises(UnsafePathError):
        read(tree, "zero", 100)
    with pytest.raises(UnsafePathError):
        read(tree, "sub", 100)
    assert safefs.tail_file(tree, "zero", 100) == b""


def test_a_pinned_file_stays_the_file_that_was_checked(resolver: str, tree: Path) -> None:
    pinned = safefs.open_file(tree, "data.csv")
    # The kernel swaps the name for a link to the secret after the check.
    os.rename(tree / "data.csv", tree / "old.csv")
    os.symlink(tree.parent / "secret.txt", tree / "data.csv")
    with pinned:
        assert pinned.read() == b"a,b\n1,2\n"
        with pinned.reader() as reader:
            assert reader.read() == b"a,b\n1,2\n"
            assert reader.seek(0, os.SEEK_END) == pinned.size


def test_reads_stop_at_the_size_seen_at_open(resolver: str, tree: Path) -> None:
    pinned = safefs.open_file(tree, "sub/r.txt")
    with open(tree / "sub" / "r.txt", "ab") as grow:
        grow.write(b"x" * 10_000)
    with pinned:
        assert pinned.read() == b"hello"
        assert pinned.tail(3) == b"llo"
        assert pinned.reader().read() == b"hello"


def test_walk_lists_regular_files_and_never_enters_a_linked_folder(resolver: str, tree: Path) -> None:
    os.symlink(tree.parent, tree / "up")
    os.symlink(tree.parent / "secret.txt", tree / "s")
    os.mkfifo(tree / "fifo")
    assert sorted(rel for rel, _ in safefs.walk(tree)) == ["data.csv", "sub/r.txt"]


def test_walk_and_usage_are_bounded(tree: Path) -> None:
    for i in range(50):
        (tree / f"f{i}").write_bytes(b"xx")
    assert len(list(safefs.walk(tree, limit=10))) <= 10
    assert safefs.scan(tree, limit=10).entries == 11  # "more than 10"
    whole = safefs.scan(tree)
    assert whole.bytes == 8 + 5 + 50 * 2 and sorted(whole.files)[:2] == ["data.csv", "f0"]


def test_walk_survives_a_folder_swapped_for_a_link_while_walking(resolver: str, tree: Path) -> None:
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            try:
                os.rename(tree / "sub", tree / "sub.real")
                os.symlink(tree.parent, tree / "sub")
                os.unlink(tree / "sub")
                os.rename(tree / "sub.real", tree / "sub")
            except OSError:
                pass

    worker = threading.Thread(target=swap)
    worker.start()
    try:
        for _ in range(300):
            for rel, _ in safefs.walk(tree):
                assert rel in {"data.csv", "sub/r.txt", "sub.real/r.txt"}, rel
    finally:
        stop.set()
        worker.join()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_chown_tree_changes_links_never_their_targets(tree: Path) -> None:
    secret = tree.parent / "secret.txt"
    os.symlink(secret, tree / "sub" / "link")
    safefs.chown_tree(tree, 12345, 12345)
    assert os.stat(tree / "sub" / "r.txt").st_uid == 12345
    assert os.lstat(tree / "sub" / "link").st_uid == 12345
    assert os.stat(secret).st_uid == 0


def test_create_never_follows_or_replaces(tree: Path) -> None:
    os.symlink(tree.parent / "secret.txt", tree / "taken")
    dir_fd = safefs.open_dir(tree)
    try:
        with pytest.raises(FileExistsError):
            safefs.create_file_at(dir_fd, "taken")
        with pytest.raises(UnsafePathError):
            safefs.create_file_at(dir_fd, "../x")
        fd = safefs.create_file_at(dir_fd, "new.txt")
        os.write(fd, b"ok")
        os.close(fd)
    finally:
        os.close(dir_fd)
    assert (tree.parent / "secret.txt").read_bytes() == SECRET
    assert (tree / "new.txt").read_bytes() == b"ok"


def test_open_dir_refuses_a_link(tmp_path: Path, tree: Path) -> None:
    os.symlink(tree, tmp_path / "alias")
    with pytest.raises(UnsafePathError):
        safefs.open_dir(tmp_path / "alias")
