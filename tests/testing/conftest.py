"""Fixtures of the shardpoint.testing tests: a moto S3 server (real HTTP, started once per
session, as tests/object_store does) with a counting/failing proxy in front."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def moto() -> Iterator[Any]:
    pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")
    from s3_server import Moto

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
def proxy(moto: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A proxy in front of moto that every object-store request of the test goes through."""
    from s3_server import Proxy

    p = Proxy(moto.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
    try:
        yield p
    finally:
        p.close()
