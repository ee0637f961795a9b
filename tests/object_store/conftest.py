"""Fixtures of the object-store tests: one moto S3 server per session (real HTTP on a free
localhost port, no mocks of our own), a fresh bucket per test, and a counting/failing proxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")
pytest.importorskip("boto3", reason="needs boto3 (requirements-dev)")

from s3_server import Moto, Proxy, moto_environment  # noqa: E402 - after the importorskips


@pytest.fixture(scope="session")
def moto() -> Iterator[Moto]:
    with moto_environment() as m:
        yield m


@pytest.fixture
def bucket(moto: Moto) -> str:
    """A fresh, empty bucket."""
    return moto.bucket()


@pytest.fixture
def proxy(moto: Moto) -> Iterator[Proxy]:
    p = Proxy(moto.port)
    try:
        yield p
    finally:
        p.close()
