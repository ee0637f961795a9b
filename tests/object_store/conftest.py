"""Fixtures of the object-store tests: one moto S3 server per session (real HTTP on a free
localhost port, no mocks of our own), a fresh bucket per test, and a counting/failing proxy."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")
pytest.importorskip("boto3", reason="needs boto3 (requirements-dev)")

from s3_server import Moto, Proxy  # noqa: E402 - after the importorskips


@pytest.fixture(scope="session")
def moto() -> Iterator[Moto]:
    m = Moto()
    env = {
        "AWS_ENDPOINT_URL": m.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield m
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        m.server.stop()


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
