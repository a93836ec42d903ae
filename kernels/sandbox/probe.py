"""Start-up probes: does a sandboxed Python (and, for ``network: true``, slirp4netns) work here?

Each probe carries out a real :class:`~kernels.seam.plan.LaunchPlan` in throw-away folders, the
way a kernel would be started, and raises :class:`KernelStartError` saying what failed.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kernels.host.interpreter import KernelPython
from kernels.sandbox.args import TMP_INODES, sandbox_args
from kernels.sandbox.identity import identity_for, prepare_run_dir
from kernels.sandbox.slirp import TAP, SlirpSupport, attach
from kernels.sandbox.support import PROBE_TIMEOUT_S, BwrapSupport
from kernels.seam.plan import LaunchPlan, ResourceLimits
from kernels.seam.result import KernelStartError


@contextlib.contextmanager
def _probe_plan(support: BwrapSupport, limits: ResourceLimits, *, network: bool) -> Iterator[LaunchPlan]:
    """(Blocking) a throw-away workspace and run dir, prepared as for a real kernel."""
    with tempfile.TemporaryDirectory(prefix="threadbook-probe-") as tmp:
        workspace, run_dir = Path(tmp) / "workspace", Path(tmp) / "run"
        workspace.mkdir()
        run_dir.mkdir()
        plan = LaunchPlan(
            kernel_id="probe",
            workspace=workspace,
            run_dir=run_dir,
            environment={},
            limits=limits,
            data_dir=None,
            network=network,
            packages_dir=None,
            identity=identity_for(workspace, as_root=support.as_root),
        )
        prepare_run_dir(plan)
        yield plan


def probe(support: BwrapSupport, python: KernelPython, limits: ResourceLimits) -> None:
    """(Blocking) start a tiny sandboxed Python as the kernel would be started; raise
    :class:`KernelStartError` saying what is missing when it fails."""
    with _probe_plan(support, limits, network=False) as plan:
        check = (
            "import os, importlib.util as u; assert os.getuid() != 0, 'still root'; "
            "assert u.find_spec('ipykernel'), 'ipykernel not importable'; open('ok', 'w').write('ok')"
        )
        if support.mount is not None:
            check += f"; assert os.statvfs('/tmp').f_files == {TMP_INODES}, 'no inode cap on /tmp'"
        cmd = [*sandbox_args(support, plan), str(python.executable), "-c", check]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KernelStartError(f"bubblewrap probe failed: {exc}") from exc
        if done.returncode != 0 or not (plan.workspace / "ok").exists():
            detail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            raise KernelStartError(f"bubblewrap cannot start a sandboxed kernel here: {detail}")


def probe_network(support: BwrapSupport, network: SlirpSupport, limits: ResourceLimits) -> None:
    """(Blocking) start a tiny sandboxed Python with slirp4netns attached and check it sees
    ``tap0``; raise :class:`KernelStartError` saying what failed."""
    with _probe_plan(support, limits, network=True) as plan:
        try:
            sandbox = subprocess.Popen(
                [*sandbox_args(support, plan), "/bin/sh", "-c", "read line; cat /proc/net/dev"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        except OSError as exc:
            raise KernelStartError(f"slirp4netns probe failed: {exc}") from exc
        try:
            slirp = attach(network, sandbox, log=subprocess.DEVNULL)
            try:
                out, err = sandbox.communicate("go\n", timeout=PROBE_TIMEOUT_S)
            finally:
                slirp.stop()
        except subprocess.TimeoutExpired as exc:
            raise KernelStartError(f"slirp4netns probe failed: {exc}") from exc
        finally:
            if sandbox.poll() is None:
                sandbox.kill()
                sandbox.communicate()
        if f"{TAP}:" not in out:
            detail = (err.strip().splitlines() or [f"interfaces {out.strip()}"])[-1]
            raise KernelStartError(f"slirp4netns ran but the sandbox has no tap0: {detail}")
