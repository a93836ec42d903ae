"""The repository's image, built once per session from the working tree with podman (on a
stand-in base where no registry can be pulled from); the tests skip, saying why, without podman."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.container.podman import IMAGE, REPO, Podman, skip_reason


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    if (why := skip_reason()) is not None:
        pytest.skip(why)
    tool = Podman(tmp_path_factory.mktemp("podman"))
    try:
        yield tool
    finally:
        tool.remove_made()


@pytest.fixture(scope="session")
def base_image(podman: Podman) -> str:
    return podman.base_image()


@pytest.fixture(scope="session")
def image(podman: Podman, base_image: str) -> str:
    started = time.monotonic()
    podman.build(IMAGE, REPO, base=base_image)
    print(f"\nimage {IMAGE}: built in {time.monotonic() - started:.0f} s, {podman.size(IMAGE) / 1e9:.2f} GB")
    return IMAGE
