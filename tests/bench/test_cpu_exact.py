"""The bench counts the CPU of short-lived new processes in full: ``/proc/PID/stat`` counts
in 10 ms ticks and rounds each process down, which hid about half of a crowd's kernel starts."""

from __future__ import annotations

import os
import signal
import time

import psutil

from bench.cpu import process_cpu

BURN_S = 0.015
CHILDREN = 20


def _burn_and_wait(report: int) -> None:
    started = time.thread_time()
    while time.thread_time() - started < BURN_S:
        pass
    os.write(report, f"{time.thread_time()}\n".encode())
    time.sleep(60)


def test_new_processes_are_counted_with_what_they_burned() -> None:
    read, write = os.pipe()
    children: list[int] = []
    try:
        for _ in range(CHILDREN):
            pid = os.fork()
            if pid == 0:
                try:
                    _burn_and_wait(write)
                finally:
                    os._exit(0)
            children.append(pid)
        reports = b""
        while reports.count(b"\n") < CHILDREN:
            reports += os.read(read, 4096)
        burned = sum(float(line) for line in reports.split())  # what each child's own clock says
        counted = [process_cpu(psutil.Process(pid)) for pid in children]
        assert all(used is not None for used in counted)
        total = sum(sum(used) for used in counted if used is not None)
        assert total >= 0.9 * burned, (total, burned)  # the ticks alone gave about half
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(read)
        os.close(write)
