"""The one place that decides which :class:`~kernels.seam.plan.Launcher` a deployment gets.

``kernels.sandbox`` picks bubblewrap or the plain launcher. It fails closed: ``auto`` and
``bwrap`` probe bubblewrap once and raise :class:`SandboxUnavailableError` (one line saying
what fixes it) when it cannot run, so no kernel ever runs unsandboxed unless ``none`` says so
(logged as a warning); slirp4netns is probed for ``network: true`` kernels, and ``kernels.fork_server`` wraps the
result in a :class:`~kernels.forking.launcher.ForkingLauncher`. Whoever builds a
:class:`~kernels.pool.pool.KernelPool` calls :func:`build_launcher` and hands its result over.
"""

from __future__ import annotations

import logging
from pathlib import Path

from kernels.bwrap.launcher import BwrapLauncher
from kernels.forking.launcher import ForkingLauncher
from kernels.gateway.launcher import GatewayLauncher
from kernels.host.interpreter import inspect_interpreter
from kernels.host.packages import PackageInstaller
from kernels.local.launcher import KernelLauncher
from kernels.oneshot.runner import OneShot
from kernels.pool.pool import KernelPool
from kernels.sandbox.probe import probe, probe_network
from kernels.sandbox.remedy import NONE_SETTING, in_container, refusal
from kernels.sandbox.slirp import SlirpSupport, detect_slirp
from kernels.sandbox.support import BwrapSupport, detect_support
from kernels.seam.plan import Launcher, ResourceLimits
from kernels.seam.result import KernelStartError, SandboxUnavailableError
from kernels.seam.settings import KernelSettings

log = logging.getLogger(__name__)

#: How the start-up log and ``status`` say that ``kernels.sandbox: none`` is in force.
UNSANDBOXED = f"kernels run WITHOUT a sandbox ({NONE_SETTING})"


def build_launcher(
    settings: KernelSettings,
    *,
    run_root: Path | None = None,
    bwrap: str | None = None,
    slirp4netns: str | None = None,
) -> KernelLauncher | BwrapLauncher | ForkingLauncher | GatewayLauncher:
    """(Blocking: probes) the launcher ``settings`` ask for: the Jupyter gateway's when
    ``kernels.gateway.url`` is set, else a local one, fork server included.

    ``bwrap`` and ``slirp4netns`` override where the binaries are looked for (default:
    :func:`kernels.sandbox.support.find_bwrap`, ``PATH``). Logs which resource isolation
    kernels get (per-kernel cgroups or rlimits only, :mod:`kernels.host.cgroups`).
    """
    if settings.gateway.enabled:
        gateway = GatewayLauncher(settings)
        log.info("kernel isolation: %s at %s", gateway.isolation, gateway.api.base)
        return gateway
    launcher = spawn_launcher(settings, run_root=run_root, bwrap=bwrap, slirp4netns=slirp4netns)
    log.info("kernel isolation: %s", launcher.isolation)
    log.info("kernel cgroups: %s", launcher.spawner.cgroups.where())
    if settings.fork_server:
        return ForkingLauncher(launcher)
    return launcher


def spawn_launcher(
    settings: KernelSettings, *, run_root: Path | None = None, bwrap: str | None = None, slirp4netns: str | None = None
) -> KernelLauncher | BwrapLauncher:
    """(Blocking: probes) the launcher that spawns kernels as ``settings.sandbox`` asks;
    raises :class:`SandboxUnavailableError` when ``auto`` or ``bwrap`` cannot have bubblewrap."""
    python = inspect_interpreter(settings.python)
    if settings.sandbox == "none":
        log.warning("⚠️ %s: kernels run as this bot's user and can read its files", UNSANDBOXED)
        return KernelLauncher(settings, run_root=run_root, python=python)
    limits = ResourceLimits.from_settings(settings)
    try:
        support = detect_support(python, bwrap)
        probe(support, python, limits)
    except KernelStartError as exc:
        raise SandboxUnavailableError(refusal(settings.sandbox, str(exc), container=in_container())) from exc
    log.info(
        "kernel sandbox: bubblewrap (%s, %s)", support.bwrap, "root + setpriv" if support.as_root else "user namespace"
    )
    network, missing = _network_support(support, limits, slirp4netns)
    if network is not None:
        log.info("network: true kernels: slirp4netns (%s)", network.slirp4netns)
    return BwrapLauncher(
        settings, support=support, network=network, network_missing=missing, run_root=run_root, python=python
    )


def sandbox_in_force(launcher: Launcher) -> str | None:
    """One line (no host path: ``status`` shows it) naming the sandbox kernels of
    ``launcher`` run in; None when they run without one (``kernels.sandbox: none``)."""
    if isinstance(launcher, GatewayLauncher):
        return "each kernel in its own container on the Jupyter gateway"
    inner = launcher.spawn if isinstance(launcher, ForkingLauncher) else launcher
    if isinstance(inner, BwrapLauncher):
        uid = "an unprivileged uid per workspace" if inner.support.as_root else "a user namespace of its own"
        return f"bubblewrap: own namespaces and file system, {uid}, no network unless the channel allows it"
    return None


def _network_support(
    support: BwrapSupport, limits: ResourceLimits, slirp4netns: str | None
) -> tuple[SlirpSupport | None, str]:
    """slirp4netns for ``network: true`` kernels, probed once, or None and why not."""
    try:
        network = detect_slirp(slirp4netns)
        probe_network(support, network, limits)
    except KernelStartError as exc:
        return None, str(exc)
    return network, ""


def oneshot_for(settings: KernelSettings, launcher: Launcher) -> OneShot:
    """(Blocking for a gateway: probes) the runner of the bot's own one-shot work (upload
    previews, ``export html``), sandboxed like ``launcher``'s kernels.

    Gateway kernels run elsewhere: the one-shots then run on this machine, from
    ``kernels.python`` in the sandbox ``kernels.sandbox`` asks for, when both are here;
    otherwise the runner is unavailable and says why (never a weaker sandbox). With
    ``kernels.fork_server`` one-shots are forked from a one-shot fork server (started by
    :meth:`OneShot.open`), else spawned.
    """
    if isinstance(launcher, ForkingLauncher):
        return OneShot(launcher.spawn, fork=settings.fork_server)
    if isinstance(launcher, (KernelLauncher, BwrapLauncher)):
        return OneShot(launcher, fork=settings.fork_server)
    try:
        local = spawn_launcher(settings)
    except KernelStartError as exc:  # SandboxUnavailableError included
        reason = f"no kernel environment or sandbox on the bot's machine ({exc})"
        log.warning("upload previews and export html are unavailable: %s", reason)
        return OneShot.unavailable(reason)
    log.info("gateway kernels: upload previews and export html run on the bot's machine (%s)", local.isolation)
    return OneShot(local, fork=settings.fork_server)


def package_installer(
    settings: KernelSettings, launcher: KernelLauncher | BwrapLauncher | ForkingLauncher | GatewayLauncher
) -> PackageInstaller | None:
    """The installer of packages on demand for kernels of ``launcher``; None for gateway
    kernels (their image carries their packages)."""
    if isinstance(launcher, GatewayLauncher):
        return None
    spawner = launcher.spawner
    return PackageInstaller(settings.packages, python=spawner.python, target=spawner.packages_dir)


def build_pool(settings: KernelSettings, *, run_root: Path | None = None) -> KernelPool:
    """(Blocking: probes) a kernel pool with the launcher ``settings`` ask for."""
    return KernelPool(settings, launcher=build_launcher(settings, run_root=run_root))
