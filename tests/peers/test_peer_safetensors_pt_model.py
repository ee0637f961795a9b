# Ported from huggingface/safetensors, bindings/python/tests/test_pt_model.py at tag v0.8.0-rc.0
# (unchanged up to 24b0b28; the installed safetensors is 0.8.0), Apache License 2.0.
#
# The test runs with shardpoint's safetensors-compatible `load_model` / `save_model`
# (shardpoint.torch) in place of safetensors.torch's, as a user switching the import would:
# the assertions are upstream's, untouched. `_find_shared_tensors` stays safetensors' own helper
# (it inspects the models, not the files). The only addition is setUp/tearDown: the upstream
# test writes `tmp3.*` into the working directory, here a temporary one.
import os
import tempfile
import unittest

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import _find_shared_tensors  # noqa: E402

from shardpoint.torch import load_model, save_model  # noqa: E402


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(100, 100)
        self.b = self.a


class NoSharedModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(100, 100)
        self.b = torch.nn.Linear(100, 100)


class TorchModelTestCase(unittest.TestCase):
    def setUp(self):
        self._cwd = os.getcwd()
        self._tmp = tempfile.TemporaryDirectory()
        os.chdir(self._tmp.name)

    def tearDown(self):
        os.chdir(self._cwd)
        self._tmp.cleanup()

    def test_difference_torch_odd(self):
        model = NoSharedModel()
        a = model.a.weight
        b = model.b.weight
        self.assertNotEqual(a.data_ptr(), b.data_ptr())
        torch.save(model.state_dict(), "tmp3.bin")

        model2 = Model()
        self.assertEqual(
            _find_shared_tensors(model2.state_dict()),
            [{"a.weight", "b.weight"}, {"b.bias", "a.bias"}],
        )
        # Torch will affect either `b` or `a` to the shared tensor in the `model2`
        model2.load_state_dict(torch.load("tmp3.bin"))

        # XXX: model2 uses only the B weight not the A weight anymore.
        self.assertFalse(torch.allclose(model2.a.weight, model.a.weight))
        torch.testing.assert_close(model2.a.weight, model.b.weight)
        self.assertEqual(
            _find_shared_tensors(model2.state_dict()),
            [{"a.weight", "b.weight"}, {"b.bias", "a.bias"}],
        )

        # Everything is saved as-is
        save_model(model, "tmp3.safetensors")
        # safetensors will yell that there were 2 tensors on disk, while
        # the models expects only 1 tensor since both are shared.
        with self.assertRaises(RuntimeError) as ctx:
            load_model(model2, "tmp3.safetensors")
        # Safetensors properly warns the user that some ke
        self.assertIn(
            """Unexpected key(s) in state_dict: "b.bias", "b.weight""",
            str(ctx.exception),
        )
