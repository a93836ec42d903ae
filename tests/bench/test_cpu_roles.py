"""The bench's CPU report names each process by what it is: the fork server's CPU (its own and
the jails it reaped) is the fork server's, wrapped in bubblewrap or not, and what it forked
is the kernels'."""

from __future__ import annotations

from bench.cpu import roles

PY = "/srv/.venv-kernel/bin/python"
ZYGOTE = [PY, "-P", "/srv/kernels/fork/zygote.py", '["pandas"]', "5", "[]"]
BWRAP = ["/srv/bwrap", "--unshare-net", "--", *ZYGOTE]
BOT = 1


def test_a_sandboxed_fork_server_is_the_fork_server_and_its_forks_are_kernels() -> None:
    # The tree as `ps --forest` showed it with --sandbox bwrap: bwrap → zygote → supervisor → kernel.
    tree = {
        10: (["/srv/.venv/bin/python", "-I", "-S", "/srv/kernels/host/warden.py"], [BOT]),
        11: (BWRAP, [BOT]),
        12: (ZYGOTE, [11, BOT]),
        13: (ZYGOTE, [12, 11, BOT]),
        14: (ZYGOTE, [13, 12, 11, BOT]),
    }
    assert roles(tree) == {10: "warden", 11: "fork server", 12: "fork server", 13: "kernels", 14: "kernels"}


def test_an_unsandboxed_fork_server_and_spawned_and_one_shot_processes() -> None:
    tree = {
        20: (ZYGOTE, [BOT]),
        21: (ZYGOTE, [20, BOT]),
        30: ([PY, "-m", "ipykernel_launcher", "-f", "k.json"], [BOT]),
        40: (["/srv/bwrap", "--", PY, "-I", "-m", "threadbook_kernel.preview"], [BOT]),
        41: ([PY, "-I", "-m", "threadbook_kernel.preview"], [40, BOT]),
    }
    assert roles(tree) == {20: "fork server", 21: "kernels", 30: "kernels", 40: "one-shots", 41: "one-shots"}
