"""Fixtures of the shardpoint.testing tests: a moto S3 server (real HTTP, started once per
session, as tests/object_store does) with a counting/failing proxy in front."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def moto() -> Iterator[Any]:
    pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")
    from s3_server import moto_environment

    with moto_environment() as m:
        yield m


@pytest.fixture
def proxy(moto: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A proxy in front of moto that every object-store request of the test goes through."""
    from s3_server import Proxy

    p = Proxy(moto.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
    try:
        yield p
    finally:
        p.close()
