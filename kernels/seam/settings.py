"""The kernel layer's own settings: what ``kernels:`` in ``config.yaml`` may say.

The bot's configuration (:mod:`bot.config`) composes this model; nothing under ``kernels/``
reads any other part of the configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)


class PackageSettings(BaseModel):
    """Packages installed on demand into one shared folder every kernel sees read-only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Distributions that may be installed on demand; empty: none.
    allow: tuple[str, ...] = ()
    #: Empty: the installer's default index.
    index_url: str = ""
    #: Folders or URLs of wheels, for offline installs.
    find_links: tuple[str, ...] = ()
    #: True: install only from ``find_links``.
    no_index: bool = False
    dir: Path = Path("data/packages")
    timeout_s: float = Field(120.0, gt=0)


class GatewaySettings(BaseModel):
    """A Jupyter (Kernel or Enterprise) Gateway that runs every kernel (empty ``url``: local kernels)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: ``http(s)://host:port`` of the gateway; empty: kernels run on this machine.
    url: str = ""
    #: Sent as ``Authorization: token ...`` (the gateway's ``KG_AUTH_TOKEN``).
    auth_token: SecretStr = SecretStr("")
    #: The kernelspec the gateway starts (with gateway-provisioners: the Kubernetes one).
    kernel_name: str = "python3"
    #: One REST request (start, interrupt, shutdown) may take this long; a kernel start on a
    #: cluster (a pod scheduled, its image pulled) may take longer and gets its own bound.
    request_timeout_s: float = Field(60.0, gt=0)
    validate_cert: bool = True

    @property
    def enabled(self) -> bool:
        """Whether kernels run on the gateway."""
        return bool(self.url.strip())


class KernelSettings(BaseModel):
    """Kernel runtime, sandbox and workspace limits (the ``kernels:`` section of the config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    idle_timeout_s: float = Field(1800.0, gt=0)
    reap_interval_s: float = Field(60.0, gt=0)
    exec_timeout_s: float = Field(120.0, gt=0)
    interrupt_grace_s: float = Field(3.0, gt=0)
    max_kernels: int = Field(20, ge=1)
    #: A new thread waits this long for a kernel when all ``max_kernels`` are in use.
    queue_timeout_s: float = Field(300.0, gt=0)
    #: Threads that may wait at once; None: 4 × ``max_kernels``.
    max_queue: int | None = Field(None, ge=0)
    #: Kernels started ahead for new threads: a fixed number (0: none), or ``auto``, which
    #: follows the rate of new threads (:mod:`kernels.warm.target`).
    warm_pool: Annotated[int, Field(ge=0)] | Literal["auto"] = 0
    fork_server: bool = False  # fork new kernels from a pre-imported parent (sandboxed when the bot is root)
    sandbox: Literal["auto", "bwrap", "none"] = "auto"
    memory_mb: int = Field(2048, ge=64)
    cpu_seconds: int = Field(3600, ge=1)
    max_processes: int = Field(256, ge=8)
    max_open_files: int = Field(1024, ge=64)
    max_file_mb: int = Field(1024, ge=1)
    network: bool = False
    workspace_root: Path = Path("data/workspaces")
    #: Where the kernels' run dirs go (connection file, ipc sockets, kernel log), in a
    #: ``threadbook-<uid>`` folder; None: ``/dev/shm`` when it is a tmpfs and kernels get memory
    #: cgroups, else the temp dir (:mod:`kernels.host.runroot`).
    run_root: Path | None = None
    retention_days: float = Field(30.0, gt=0)
    max_upload_mb: float = Field(100.0, gt=0)
    workspace_quota_mb: float = Field(1024.0, gt=0)
    max_output_bytes: int = Field(100_000, ge=1000)
    preload: tuple[str, ...] = ("pandas", "numpy", "matplotlib")
    #: Save a thread's variables before its kernel stops (and after each turn while that is
    #: cheap) and load them into its next kernel (:mod:`kernels.session.snapshots`).
    snapshot: bool = True
    #: The most one thread's snapshot may hold; a variable that does not fit is left out, by name.
    snapshot_max_mb: float = Field(512.0, gt=0)
    #: The kernel interpreter: an environment of its own (``make kernel-env`` builds this one
    #: from ``kernels/requirements.txt``), never the bot's.
    python: Path = Path(".venv-kernel/bin/python")
    packages: PackageSettings = Field(default_factory=PackageSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)

    @field_validator("warm_pool", mode="wrap")
    @classmethod
    def _warm_pool(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """One clear message for a bad ``warm_pool`` rather than one per member of the union."""
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(
                f"expected a whole number of kernels, 0 or more (0: no warm pool), or 'auto', got {value!r}"
            ) from None
