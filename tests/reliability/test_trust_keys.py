"""Issue 12 item 6: colliding flattened keys raise DuplicateKeyError on every flattening path.

``{"a/b": X, "a": {"b": Y}}`` and ``{1: X, "1": Y}`` flatten to one checkpoint key twice. The
object graph's state-dict adapter (an object tracked by ``Checkpoint``), ``shardpoint.torch.save``
and the ``.pt`` converter all name leaves through ``nested_keys.put_leaf`` and must refuse,
instead of keeping one of the two values.
"""

from __future__ import annotations

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.convert import convert

COLLIDING = {
    "slash": lambda x, y: {"a/b": x, "a": {"b": y}},
    "int-str": lambda x, y: {1: x, "1": y},
}


class _Stateful:
    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


@pytest.mark.parametrize("case", sorted(COLLIDING))
def test_checkpoint_of_stateful_object_refuses_colliding_keys(tmp_path, case):
    obj = _Stateful(COLLIDING[case](np.ones(3, np.float32), np.zeros(3, np.float32)))
    ck = sp.Checkpoint(model=obj)
    with pytest.raises(sp.DuplicateKeyError, match="same key"):
        ck.write(str(tmp_path / "ck"))
    assert not sp.exists(str(tmp_path / "ck"))


@pytest.mark.parametrize("case", sorted(COLLIDING))
def test_torch_save_and_pt_convert_refuse_colliding_keys(tmp_path, case):
    torch = pytest.importorskip("torch")
    import shardpoint.torch as spt

    state = COLLIDING[case](torch.ones(3), torch.zeros(3))
    with pytest.raises(sp.DuplicateKeyError):
        spt.save(state, str(tmp_path / "t"))
    src = str(tmp_path / "m.pt")
    torch.save(state, src)
    with pytest.raises(sp.DuplicateKeyError, match="same key"):
        convert(src, str(tmp_path / "out"))
    assert not sp.exists(str(tmp_path / "out"))


def test_distinct_keys_still_flatten(tmp_path):
    obj = _Stateful({"a": {"b": np.ones(2, np.float32)}, "c": 3, 1: np.zeros(1, np.float32)})
    sp.Checkpoint(model=obj).write(str(tmp_path / "ck"))
    other = _Stateful({})
    sp.Checkpoint(model=other).restore(str(tmp_path / "ck"))
    assert set(other.state) == {"a", "c", 1} and other.state["c"] == 3
