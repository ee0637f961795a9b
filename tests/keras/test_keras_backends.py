"""Keras 3 integration tests, one subprocess per Keras backend.

Keras reads ``KERAS_BACKEND`` once, at import, so each backend runs the case files
(``keras_*_cases.py``, not collected directly) in its own ``pytest`` subprocess: JAX and PyTorch
(everything), numpy (inference only: ``keras_numpy_cases.py``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

import shardpoint

HERE = os.path.dirname(os.path.abspath(__file__))
NUMPY_CASES = [os.path.join(HERE, "keras_numpy_cases.py")]  # Keras's numpy backend cannot train
CASES = sorted(
    os.path.join(HERE, name)
    for name in os.listdir(HERE)
    if name.startswith("keras_")
    and name.endswith("_cases.py")
    and os.path.join(HERE, name) not in NUMPY_CASES
)
BACKEND_MODULES = {"jax": "jax", "torch": "torch", "numpy": "numpy"}


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        if os.environ.get("SHARDPOINT_REQUIRE_OPTIONAL") == "1":
            pytest.fail(f"SHARDPOINT_REQUIRE_OPTIONAL=1 but {module} is not installed")
        pytest.skip(f"{module} is not installed")


def _start(backend: str, basetemp: str) -> subprocess.Popen:
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(shardpoint.__file__)))
    env = dict(os.environ)
    env["KERAS_BACKEND"] = backend
    env["PYTHONPATH"] = os.pathsep.join([package_root, HERE, env.get("PYTHONPATH", "")])
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore"]
    cases = NUMPY_CASES if backend == "numpy" else CASES
    command += ["--basetemp", basetemp, "--rootdir", HERE, *cases]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


# On the torch backend a Keras layer is also a torch.nn.Module: with the torch adapters
# registered first (shardpoint.torch imported before keras), a user's keras.Model subclass must
# still get the Keras adapter, and a plain torch module the torch one.
IMPORT_ORDER_SCRIPT = """
import shardpoint.torch, torch
from shardpoint.objgraph.trackable import as_trackable
import keras

class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.l1 = keras.layers.Dense(5)

    def call(self, x):
        return self.l1(x)

print(type(as_trackable(Net())).__name__, type(as_trackable(torch.nn.Linear(2, 2))).__name__)
"""


def _start_import_order() -> subprocess.Popen:
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(shardpoint.__file__)))
    env = {**os.environ, "PYTHONPATH": package_root, "KERAS_BACKEND": "torch"}
    return subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", IMPORT_ORDER_SCRIPT],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def backend_runs(tmp_path_factory):
    """Every backend's subprocess, started together (each is mostly single-threaded)."""
    _require("keras")
    runs = {}
    for backend, module in sorted(BACKEND_MODULES.items()):
        if importlib.util.find_spec(module) is not None:
            runs[backend] = _start(backend, str(tmp_path_factory.mktemp(f"keras_{backend}")))
    if "torch" in runs:
        runs["torch-import-order"] = _start_import_order()
    yield runs
    for proc in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("backend", sorted(BACKEND_MODULES))
def test_keras_cases_on_backend(backend, backend_runs):
    _require(BACKEND_MODULES[backend])
    proc = backend_runs[backend]
    output = _finish(proc)
    tail = output[-6000:]
    assert proc.returncode == 0, f"Keras cases failed on the {backend} backend:\n{tail}"
    assert " passed" in output and "skipped" not in output, tail


def test_import_shardpoint_does_not_import_keras():
    """keras is an extra: ``import shardpoint`` neither needs nor imports it."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(shardpoint.__file__)))
    code = "import sys, shardpoint; assert 'keras' not in sys.modules, 'keras imported'"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": package_root},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def _finish(proc: subprocess.Popen) -> str:
    try:
        output, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    return output


def test_torch_backend_keras_adapter_wins_whatever_the_import_order(backend_runs):
    _require("torch")
    proc = backend_runs["torch-import-order"]
    output = _finish(proc)
    assert proc.returncode == 0, output[-3000:]
    assert output.split()[-2:] == ["KerasObjectAdapter", "ModuleAdapter"], output[-3000:]
