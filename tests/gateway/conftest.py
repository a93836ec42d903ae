"""A real Jupyter Kernel Gateway (:class:`bench.gateway.KernelGateway`) for the gateway tests;
they skip, saying why, where ``.venv-gateway`` is missing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.gateway import GATEWAY, KERNEL_NAME, KernelGateway, free_port

__all__ = ["KERNEL_NAME", "KernelGateway", "free_port", "gateway"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelGateway]:
    if not GATEWAY.exists():
        pytest.skip(f"no Jupyter Kernel Gateway at {GATEWAY} (make gateway-env builds it)")
    server = KernelGateway(tmp_path_factory.mktemp("gateway"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
