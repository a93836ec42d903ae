"""Network for sandboxed kernels whose channel sets ``network: true`` (slirp4netns).

The kernel keeps its own network namespace (bwrap ``--unshare-net``). Once the sandbox's
first process exists, slirp4netns, started by the bot next to it, adds ``tap0``
(10.0.2.100/24, default route via 10.0.2.2, DNS relay at 10.0.2.3) and relays the kernel's
connections through the host's network stack in user mode. What keeps the bot out of reach:

* ``--disable-host-loopback``: 10.0.2.2 is not the host's 127.0.0.1, so nothing bound to
  the host's loopback (the bot's ports, local databases) can be reached;
* ``prohibit`` routes, added inside the namespace before the kernel is handed out, for every
  IPv4 address of the host itself (a port bound to ``0.0.0.0`` is reachable through them)
  and for link-local 169.254.0.0/16 (cloud metadata services hand out credentials); the
  kernel's uid has no ``CAP_NET_ADMIN`` to remove them;
* ``--exit-fd``: slirp4netns exits when the bot closes its end (kernel shutdown) or dies,
  so it never outlives its kernel or the bot.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import select
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import IO, Any

import psutil

from kernels.sandbox.support import usage_text
from kernels.seam.result import KernelStartError

TAP = "tap0"
MTU = 65520
NETWORK = ipaddress.ip_network("10.0.2.0/24")  # slirp4netns's default CIDR
GUEST = "10.0.2.100"
GATEWAY = "10.0.2.2"
DNS = "10.0.2.3"
#: Always unreachable from a kernel with network, besides the host's own addresses.
BLOCKED = (ipaddress.IPv4Network("169.254.0.0/16"),)
RESOLV_CONF = f"nameserver {DNS}\n"
HOSTS = "127.0.0.1\tlocalhost threadbook\n::1\tlocalhost\n"
SETUP_TIMEOUT_S = 10.0
NS_GET_USERNS = 0xB701  # ioctl on a namespace fd: an fd of the user namespace that owns it
#: Hardening flags used when this slirp4netns offers them.
_HARDENING = ("--enable-sandbox", "--enable-seccomp")


@dataclass(frozen=True)
class SlirpSupport:
    """The tools a kernel with network needs and the slirp4netns hardening flags offered."""

    slirp4netns: str
    nsenter: str
    ip: str
    as_root: bool
    hardening: tuple[str, ...]


def detect_slirp(slirp4netns: str | None = None) -> SlirpSupport:
    """Find slirp4netns (on PATH unless given), nsenter and ip; raises :class:`KernelStartError`
    naming what is missing."""
    slirp4netns = slirp4netns or shutil.which("slirp4netns")
    if slirp4netns is None or not os.access(slirp4netns, os.X_OK):
        raise KernelStartError(f"{slirp4netns or 'slirp4netns'} not found (install it: apt-get install slirp4netns)")
    nsenter, ip = shutil.which("nsenter"), shutil.which("ip")
    if nsenter is None:
        raise KernelStartError("nsenter (util-linux) not found: it adds the kernel's blocking routes")
    if ip is None:
        raise KernelStartError("ip (iproute2) not found: it adds the kernel's blocking routes")
    help_text = usage_text(slirp4netns, "slirp4netns", SETUP_TIMEOUT_S)
    if "--disable-host-loopback" not in help_text:
        raise KernelStartError(f"slirp4netns at {slirp4netns} lacks --disable-host-loopback (too old)")
    hardening = tuple(flag for flag in _HARDENING if flag in help_text)
    return SlirpSupport(slirp4netns=slirp4netns, nsenter=nsenter, ip=ip, as_root=os.geteuid() == 0, hardening=hardening)


@dataclass
class Slirp:
    """One running slirp4netns, serving one sandbox's network namespace."""

    process: subprocess.Popen[bytes]
    exit_fd: int | None

    def stop(self) -> None:
        """(Blocking) end slirp4netns and reap it; safe to call twice."""
        if self.exit_fd is not None:
            os.close(self.exit_fd)
            self.exit_fd = None
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def attach(support: SlirpSupport, sandbox: subprocess.Popen[Any], *, log: IO[bytes] | int | None = None) -> Slirp:
    """(Blocking) give ``sandbox``'s network namespace ``tap0`` and the blocking routes.

    Returns once the network is configured; raises :class:`KernelStartError` (leaving no
    slirp4netns behind) when it cannot be.
    """
    pid = sandbox_child(sandbox)
    owner = None if support.as_root else _netns_owner(pid)
    try:
        return _start(support, pid, owner, log)
    finally:
        if owner is not None:
            os.close(owner)


def _netns_owner(pid: int) -> int:
    """An fd of the user namespace owning ``pid``'s network namespace (bot not root).

    bwrap may move the kernel into a nested user namespace (``--disable-userns``), so
    ``/proc/PID/ns/user`` is not necessarily the one that grants rights over its network.
    """
    try:
        netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise KernelStartError(f"the sandbox's network namespace is gone: {exc}") from exc
    try:
        return int(fcntl.ioctl(netns, NS_GET_USERNS))
    except OSError as exc:
        raise KernelStartError(f"cannot find the owner of the sandbox's network namespace: {exc}") from exc
    finally:
        os.close(netns)


def _start(support: SlirpSupport, pid: int, owner: int | None, log: IO[bytes] | int | None) -> Slirp:
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    userns = [] if owner is None else [f"--userns-path=/proc/self/fd/{owner}"]
    argv = [
        support.slirp4netns,
        "--configure",
        f"--mtu={MTU}",
        "--disable-host-loopback",
        *userns,
        f"--ready-fd={ready_w}",
        f"--exit-fd={exit_r}",
        *support.hardening,
        str(pid),
        TAP,
    ]
    inherited = (ready_w, exit_r) if owner is None else (ready_w, exit_r, owner)
    try:
        process = subprocess.Popen(
            argv, pass_fds=inherited, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    except OSError as exc:
        for fd in (ready_r, ready_w, exit_r, exit_w):
            os.close(fd)
        raise KernelStartError(f"slirp4netns did not start: {exc}") from exc
    os.close(ready_w)
    os.close(exit_r)
    slirp = Slirp(process=process, exit_fd=exit_w)
    try:
        _wait_ready(ready_r, process)
        block_host(support, pid, owner)
    except BaseException:
        slirp.stop()
        raise
    finally:
        os.close(ready_r)
    return slirp


def sandbox_child(sandbox: subprocess.Popen[Any], timeout: float = SETUP_TIMEOUT_S) -> int:
    """(Blocking) the host pid of bwrap's child, the first process in the new namespaces.

    bwrap creates it with one ``clone`` that unshares every namespace at once, so as soon as
    it exists it is in the kernel's network namespace.
    """
    deadline = time.monotonic() + timeout
    try:
        parent = psutil.Process(sandbox.pid)
        while True:
            children = parent.children()
            if children:
                return int(children[0].pid)
            if sandbox.poll() is not None:
                raise KernelStartError(f"the sandbox exited (code {sandbox.returncode}) before its network was set up")
            if time.monotonic() > deadline:
                raise KernelStartError("the sandbox did not create its namespaces in time")
            time.sleep(0.001)
    except psutil.Error as exc:
        raise KernelStartError(f"the sandbox exited before its network was set up: {exc}") from exc


def _wait_ready(ready_fd: int, process: subprocess.Popen[bytes]) -> None:
    readable, _, _ = select.select([ready_fd], [], [], SETUP_TIMEOUT_S)
    if readable and os.read(ready_fd, 1) == b"1":
        return
    code = process.poll()
    reason = f"exited with code {code}" if code is not None else f"not ready within {SETUP_TIMEOUT_S:.0f} s"
    raise KernelStartError(f"slirp4netns could not configure the kernel's network: {reason}")


def host_networks() -> list[ipaddress.IPv4Network]:
    """What a kernel must not reach: the host's own IPv4 addresses (outside loopback and
    slirp's own 10.0.2.0/24, which are handled by ``--disable-host-loopback``) and :data:`BLOCKED`."""
    found: set[ipaddress.IPv4Network] = set(BLOCKED)
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family != socket.AF_INET:
                continue
            ip = ipaddress.IPv4Address(address.address)
            if not ip.is_loopback and ip not in NETWORK and not any(ip in net for net in BLOCKED):
                found.add(ipaddress.IPv4Network(f"{ip}/32"))
    return sorted(found)


def block_host(support: SlirpSupport, pid: int, owner: int | None = None) -> None:
    """(Blocking) add ``prohibit`` routes for :func:`host_networks` in ``pid``'s network namespace.

    ``owner``: an fd of the user namespace owning it (bot not root): joined, keeping our uid.
    """
    enter = [support.nsenter, f"--net=/proc/{pid}/ns/net"]
    if owner is not None:
        enter += [f"--user=/proc/self/fd/{owner}", "--preserve-credentials"]
    routes = "".join(f"route add prohibit {net}\n" for net in host_networks())
    try:
        done = subprocess.run(
            [*enter, support.ip, "-batch", "-"],
            input=routes,
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT_S,
            pass_fds=() if owner is None else (owner,),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelStartError(f"could not add the kernel's blocking routes: {exc}") from exc
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise KernelStartError(f"could not add the kernel's blocking routes: {detail}")
