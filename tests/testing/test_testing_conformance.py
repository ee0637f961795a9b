"""The conformance suites on our own adapters (numpy through sp.save_file, torch through
shardpoint.torch, jax through shardpoint.jax) and storage (local directories, the moto S3
server); and a broken adapter and a broken storage fail them."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from shardpoint.testing._bits import NAMES
from shardpoint.testing.conformance import AdapterTests, StorageTests, code_sample


class TestNumpyAdapter(AdapterTests):
    dtypes = NAMES

    def to_native(self, array: np.ndarray) -> Any:
        return array

    def from_native(self, x: Any) -> np.ndarray:
        return x


class TestTorchAdapter(AdapterTests):
    dtypes = NAMES

    def to_native(self, array: np.ndarray) -> Any:
        from shardpoint.torch import numpy_to_tensor

        return numpy_to_tensor(array)

    def from_native(self, x: Any) -> np.ndarray:
        from shardpoint.torch import tensor_to_numpy

        return tensor_to_numpy(x)

    def save(self, tree: Mapping[str, Any], path: str) -> None:
        from shardpoint import torch as sptorch

        sptorch.save(dict(tree), path, durable=False)

    def load(self, path: str, like: Mapping[str, Any]) -> Mapping[str, Any]:
        from shardpoint import torch as sptorch

        return sptorch.load(path)


class TestJaxAdapter(AdapterTests):
    strided_inputs = True

    @property
    def dtypes(self) -> Any:  # type: ignore[override]  # what jnp keeps, per jax_enable_x64
        from shardpoint.testing._frameworks import supported_names

        return supported_names("jax")

    def to_native(self, array: np.ndarray) -> Any:
        import jax.numpy as jnp

        return jnp.asarray(array)

    def from_native(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def save(self, tree: Mapping[str, Any], path: str) -> None:
        import shardpoint.jax as spj

        spj.save(dict(tree), path, durable=False)

    def load(self, path: str, like: Mapping[str, Any]) -> Mapping[str, Any]:
        import shardpoint.jax as spj

        return spj.restore(path, target=dict(like))


class TestLocalStorage(StorageTests):
    machine_runs = 3
    machine_steps = 10

    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Any) -> None:
        self.root = str(tmp_path)

    def location(self) -> str:
        return tempfile.mkdtemp(dir=self.root)


class TestS3Storage(StorageTests):
    machine_runs = 2
    machine_steps = 8

    @pytest.fixture(autouse=True)
    def _bucket(self, moto: Any) -> None:
        self.bucket = moto.bucket()

    def location(self) -> str:
        return f"s3://{self.bucket}/{uuid.uuid4().hex[:10]}"


# --- the suites are not vacuous -------------------------------------------------------------


class _QuietNaNs(TestNumpyAdapter):
    """An adapter whose tensors lose NaN payloads on the way in (as a device might)."""

    def to_native(self, array: np.ndarray) -> Any:
        if array.dtype.kind == "f":
            array = np.where(np.isnan(array), np.array(np.nan, array.dtype), array)
        return array


class _DropsEmptyKeys(TestNumpyAdapter):
    """A framework whose save skips empty tensors."""

    def save(self, tree: Mapping[str, Any], path: str) -> None:
        super().save({k: v for k, v in tree.items() if np.asarray(v).size}, path)


def test_a_lossy_adapter_fails_the_suite(tmp_path: Any) -> None:
    with pytest.raises(AssertionError, match="0x7e00|0x7fc0|0x7ff8"):
        _QuietNaNs().test_conversion_is_exact()
    with pytest.raises(AssertionError, match="keys differ"):
        _DropsEmptyKeys().test_every_shape_round_trips(tmp_path)


class _LeakyStorage(TestLocalStorage):
    """A 'storage' whose location is shared between calls (not fresh)."""

    def location(self) -> str:
        os.makedirs(os.path.join(self.root, "shared"), exist_ok=True)
        return os.path.join(self.root, "shared")


def test_a_storage_that_is_not_fresh_fails_the_suite(tmp_path: Any) -> None:
    from shardpoint import files

    suite = _LeakyStorage()
    suite.root = str(tmp_path)
    files.save_file({"x": np.arange(1)}, os.path.join(suite.location(), "left-over"), durable=False)
    with pytest.raises(AssertionError, match="ck0.index"):
        suite.test_listing_shows_committed_checkpoints()


def test_code_samples_cover_every_code() -> None:
    assert code_sample("float8_e5m2").view(np.uint8).tolist() == list(range(256))
    assert len(set(code_sample("bfloat16").view(np.uint16).tolist())) == 65536
    f32 = set(code_sample("float32").view(np.uint32).tolist())
    assert {0x80000000, 0x7FC00000, 0xFFC00000, 0x7F800001, 1} <= f32
