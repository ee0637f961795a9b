"""Python objects in checkpoints without pickle (FORMAT.md §6.1): what round-trips, the
allow-list at load, errors at the start of a save, and hostile object entries."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import enum
import os
import pathlib
import sys
import types
from typing import Any, NamedTuple

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.storage.objects import MAX_DEPTH

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reliability_helpers"))
from craft import raw_entry, write_checkpoint  # noqa: E402


class Color(enum.Enum):
    RED = 1
    GREEN = "g"


class Perm(enum.Flag):
    R = 1
    W = 2


@dataclasses.dataclass
class Optim:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    optim: Optim
    color: Color = Color.RED
    tags: frozenset[str] = frozenset()
    derived: int = dataclasses.field(init=False, default=0)


class Point(NamedTuple):
    x: int
    y: float


class Opaque:
    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.n == self.n


@pytest.fixture(autouse=True)
def _registry() -> Any:
    """Each test starts with the user types below unregistered."""
    yield
    for cls in (Color, Perm, Optim, Config, Point, Opaque):
        sp.storage.object_types._unregister(cls)


def roundtrip(value: Any, tmp_path: pathlib.Path, key: str = "v") -> Any:
    sp.save_file({key: value}, tmp_path / "ck")
    return sp.load_file(tmp_path / "ck")[key]


def test_stdlib_values_roundtrip_with_their_types(tmp_path: pathlib.Path) -> None:
    tz = dt.timezone(dt.timedelta(hours=5, minutes=30))
    value = {
        "ns": argparse.Namespace(lr=0.1, layers=[1, 2], name="x"),
        "set": {3, 1, 2},
        "fs": frozenset({"a", "b"}),
        "when": dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=tz),
        "naive": dt.datetime(2024, 5, 6),
        "day": dt.date(2020, 2, 29),
        "clock": dt.time(23, 59, 1, 5),
        "span": dt.timedelta(days=-2, seconds=5, microseconds=7),
        "path": pathlib.Path("/data/run/ckpt"),
        "pure": pathlib.PurePosixPath("a/b"),
        "win": pathlib.PureWindowsPath("C:\\x\\y"),
        "tuple": (1, "two", (3.0,)),
        "int_keys": {1: "a", 2: "b"},
        "bytes": b"\x00\xff",
        "big": 1 << 200,
        "cplx": 1 + 2j,
        "simple": types.SimpleNamespace(a=1),
        "nan": float("nan"),
    }
    back = roundtrip(value, tmp_path)
    nan = back.pop("nan")
    value.pop("nan")
    assert np.isnan(nan)
    assert back == value
    for k in value:
        assert type(back[k]) is type(value[k]), k
    assert type(back["tuple"][2]) is tuple
    assert back["when"].utcoffset() == dt.timedelta(hours=5, minutes=30)


@pytest.mark.parametrize(
    "scalar",
    [
        np.float32(1.5),
        np.float16(-0.0),
        np.int64(-(2**62)),
        np.uint8(255),
        np.bool_(True),
        np.complex64(1 - 2j),
        np.float64("nan"),
    ],
)
def test_numpy_scalars_come_back_as_scalars_of_their_dtype(
    scalar: np.generic, tmp_path: pathlib.Path
) -> None:
    top = roundtrip(scalar, tmp_path)
    nested = roundtrip({"x": [scalar]}, tmp_path)["x"][0]
    for back in (top, nested):
        assert isinstance(back, np.generic) and not isinstance(back, np.ndarray)
        assert back.dtype == scalar.dtype
        assert back.tobytes() == scalar.tobytes()


def test_bfloat16_scalar(tmp_path: pathlib.Path) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    v = ml_dtypes.bfloat16(3.25)
    back = roundtrip(v, tmp_path)
    assert back.dtype == v.dtype and back == v


def test_small_array_inside_an_object(tmp_path: pathlib.Path) -> None:
    arr = np.arange(6, dtype=">i4").reshape(2, 3)
    back = roundtrip({"a": arr, "s": {1}}, tmp_path)["a"]
    np.testing.assert_array_equal(back, arr)


def test_user_types_need_registration_to_load(tmp_path: pathlib.Path) -> None:
    cfg = Config("run", Optim(lr=0.5), Color.GREEN, frozenset({"x"}))
    object.__setattr__(cfg, "derived", 7)
    hp = {"cfg": cfg, "point": Point(1, 2.0), "perm": Perm.R | Perm.W}
    sp.save_file({"hyper_parameters": hp}, tmp_path / "ck")  # saving needs no registration
    with pytest.raises(sp.UnregisteredTypeError) as e:
        sp.load_file(tmp_path / "ck")
    msg = str(e.value)
    assert "hyper_parameters" in msg and "not registered" in msg and "register_type" in msg
    assert f"{__name__}.Config" in msg
    sp.add_safe_types([Config, Optim, Color, Point, Perm])
    back = sp.load_file(tmp_path / "ck")["hyper_parameters"]
    assert back == hp
    assert back["cfg"].derived == 7 and type(back["cfg"].optim.betas) is tuple
    assert type(back["point"]) is Point


def test_safe_types_context_is_scoped(tmp_path: pathlib.Path) -> None:
    sp.save_file({"c": Color.RED}, tmp_path / "ck")
    with sp.safe_types([Color]):
        assert sp.load_file(tmp_path / "ck")["c"] is Color.RED
    assert f"{__name__}.Color" not in sp.registered_types()
    with pytest.raises(sp.UnregisteredTypeError):
        sp.load_file(tmp_path / "ck")


def test_custom_type_with_encode_decode_and_name(tmp_path: pathlib.Path) -> None:
    with pytest.raises(sp.UnsupportedDTypeError) as e:
        sp.save_file({"a": {"inner": [Opaque(3)]}}, tmp_path / "ck")
    msg = str(e.value)
    assert "'a'" in msg and "['inner'][0]" in msg and "register_type(Opaque" in msg
    assert not os.listdir(tmp_path)  # failed before any byte was written
    sp.register_type(
        Opaque, name="my.Opaque", encode=lambda o: {"n": o.n}, decode=lambda s: Opaque(**s)
    )
    assert roundtrip({"inner": [Opaque(3)]}, tmp_path, "a") == {"inner": [Opaque(3)]}
    with sp.open(tmp_path / "ck") as r:
        assert r.info("a").kind == "object"
    with pytest.raises(sp.InvalidArgumentError):
        sp.register_type(Optim, name="my.Opaque")  # name taken by another class
    with pytest.raises(sp.InvalidArgumentError):
        sp.register_type(Opaque)  # neither dataclass/enum/namedtuple nor functions


def test_unsupported_object_fails_before_writing_in_every_writer(tmp_path: pathlib.Path) -> None:
    with pytest.raises(sp.UnsupportedDTypeError, match="'hp'.*lambda|'hp'"):
        sp.save_file({"w": np.zeros(3), "hp": {"f": lambda: 1}}, tmp_path / "ck")
    assert not os.listdir(tmp_path)
    with sp.Writer(tmp_path / "w") as w:
        w.add("ok", np.ones(2))
        with pytest.raises(sp.UnsupportedDTypeError, match="'bad'"):
            w.add("bad", object())
    assert sp.load_file(tmp_path / "w").keys() == {"ok"}


def test_cycles_and_depth_fail_at_save(tmp_path: pathlib.Path) -> None:
    loop: list[Any] = [1]
    loop.append({"again": loop, "s": {1}})
    with pytest.raises(sp.InvalidArgumentError, match="cycle"):
        sp.save_file({"loop": loop}, tmp_path / "ck")
    deep: Any = {1}
    for _ in range(MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(sp.InvalidArgumentError, match="deeper"):
        sp.save_file({"deep": deep}, tmp_path / "ck")
    shared = [{2}]  # the same object twice is not a cycle
    assert roundtrip([shared, shared], tmp_path) == [[{2}], [{2}]]


def test_plain_json_values_are_unchanged(tmp_path: pathlib.Path) -> None:
    sp.save_file({"j": {"a": [1, 2.5, None, True]}, "t": (1, 2)}, tmp_path / "ck")
    with sp.open(tmp_path / "ck") as r:
        assert r.info("j").kind == "json" and r["j"] == {"a": [1, 2.5, None, True]}
        # a tuple makes an object entry, so it reads back as a tuple (issue 33: it used to be
        # a JSON entry read back as a list)
        assert r.info("t").kind == "object" and r["t"] == (1, 2) and type(r["t"]) is tuple
    sp.save_file({"o": {"a": {1}}}, tmp_path / "ck2")
    with sp.open(tmp_path / "ck2") as r:
        assert r.info("o").kind == "object"


def test_torch_types_in_objects(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    value = {"size": torch.Size([2, 3]), "dtype": torch.bfloat16, "dev": torch.device("cpu")}
    back = roundtrip({"s": {1}, **value}, tmp_path)
    assert back["size"] == value["size"] and type(back["size"]) is torch.Size
    assert back["dtype"] is torch.bfloat16 and back["dev"] == torch.device("cpu")


def test_torch_types_load_without_importing_shardpoint_torch_first(
    tmp_path: pathlib.Path,
) -> None:
    torch = pytest.importorskip("torch")
    import subprocess

    sp.save_file({"hp": {"shape": torch.Size([4]), "dt": torch.float16}}, tmp_path / "ck")
    code = (  # a fresh interpreter that never imported torch nor shardpoint.torch
        "import shardpoint as sp, sys\n"
        "assert 'torch' not in sys.modules\n"
        f"v = sp.load_file({str(tmp_path / 'ck')!r})['hp']\n"
        "import torch\n"
        "assert v == {'shape': torch.Size([4]), 'dt': torch.float16}, v\n"
        "assert type(v['shape']) is torch.Size\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_omegaconf_configs(tmp_path: pathlib.Path) -> None:
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"model": {"dim": 8, "ref": "${model.dim}"}, "xs": [1, 2]})
    back = roundtrip({"cfg": cfg, "lst": omegaconf.OmegaConf.create([1, {"a": 2}])}, tmp_path)
    assert isinstance(back["cfg"], omegaconf.DictConfig)
    assert isinstance(back["lst"], omegaconf.ListConfig)
    assert back["cfg"].model.ref == 8  # the interpolation is kept, not resolved
    assert omegaconf.OmegaConf.to_container(back["cfg"]) == omegaconf.OmegaConf.to_container(cfg)


def test_classes_are_stored_by_their_allow_listed_name(tmp_path: pathlib.Path) -> None:
    """Lightning stores ``checkpoint["hparams_type"] = type(hparams)``: the OmegaConf config
    class. A class is stored by the name the allow-list knows it under."""
    omegaconf = pytest.importorskip("omegaconf")
    classes = [omegaconf.DictConfig, omegaconf.ListConfig, dict, type(None), argparse.Namespace]
    assert roundtrip(classes, tmp_path) == classes
    assert roundtrip(omegaconf.DictConfig, tmp_path) is omegaconf.DictConfig
    with pytest.raises(sp.UnsupportedDTypeError, match="class .*Opaque cannot be stored"):
        sp.save_file({"v": Opaque}, tmp_path / "x")
    assert not (tmp_path / "x.index").exists()
    sp.register_type(Config)
    assert roundtrip({"cls": Config}, tmp_path) == {"cls": Config}


@pytest.mark.parametrize(
    "name, error, words",
    [
        ("antigravity.Thing", sp.UnregisteredTypeError, "'antigravity.Thing' is not registered"),
        ("os.system", sp.UnregisteredTypeError, "never imports"),
        (f"{__name__}.Opaque", sp.UnregisteredTypeError, "is not registered"),
        (7, sp.CorruptCheckpointError, "must be a class name"),
    ],
)
def test_hostile_class_references_are_never_imported(
    tmp_path: pathlib.Path, name: Any, error: type[Exception], words: str
) -> None:
    import json

    p = _hostile(tmp_path, json.dumps({"v": 1, "value": {"type": name}}))
    with pytest.raises(error, match=words) as e:
        sp.load_file(p)
    assert "'o'" in str(e.value)
    assert "antigravity" not in sys.modules


def test_sptorch_save_of_a_lightning_style_checkpoint(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    import shardpoint.torch as sptorch

    ckpt = {
        "state_dict": {"w": torch.ones(2)},
        "hyper_parameters": {"args": argparse.Namespace(lr=0.1), "cfg": Optim(), "ids": {1, 2}},
        "epoch": np.int64(3),
    }
    sptorch.save(ckpt, tmp_path / "ck")
    with sp.safe_types([Optim]):
        back = sptorch.load(tmp_path / "ck")
    assert back["hyper_parameters"] == ckpt["hyper_parameters"]
    assert type(back["epoch"]) is np.int64 and back["epoch"] == 3
    assert torch.equal(back["state_dict"]["w"], torch.ones(2))


# --- hostile object entries ---------------------------------------------------------------


def _hostile(tmp_path: pathlib.Path, doc: str | bytes) -> pathlib.Path:
    raw = doc.encode() if isinstance(doc, str) else doc
    write_checkpoint(
        str(tmp_path / "ck"), [raw_entry(b"o", "uint8", [len(raw)], raw, kind="object")]
    )
    return tmp_path / "ck"


@pytest.mark.parametrize(
    "doc, error, words",
    [
        ('{"v":1,"value":{"os.system":"rm -rf /"}}', sp.CorruptCheckpointError, "unknown type tag"),
        (
            '{"v":1,"value":{"dataclass":["subprocess.Popen",{"args":"ls"}]}}',
            sp.UnregisteredTypeError,
            "'subprocess.Popen' is not registered",
        ),
        ('{"v":1,"value":{"set":[[1]]}}', sp.CorruptCheckpointError, "tag 'set' is malformed"),
        ('{"v":1,"value":{"a":1,"b":2}}', sp.CorruptCheckpointError, "2 members"),
        ('{"v":9,"value":1}', sp.CorruptCheckpointError, "version 9"),
        ('{"value":1}', sp.CorruptCheckpointError, "version"),
        ("[1", sp.CorruptCheckpointError, "not valid JSON"),
        (
            '{"v":1,"value":{"numpy.scalar":["float32","00"]}}',
            sp.CorruptCheckpointError,
            "1 bytes for a float32",
        ),
        (
            '{"v":1,"value":{"numpy.ndarray":["int64",[1000000000,1000000000],""]}}',
            sp.CorruptCheckpointError,
            "shape",
        ),
        ('{"v":1,"value":{"numpy.scalar":["object","00"]}}', sp.CorruptCheckpointError, "dtype"),
        (
            '{"v":1,"value":{"datetime.timedelta":[1e999,0,0]}}',
            sp.CorruptCheckpointError,
            "malformed",
        ),
        ('{"v":1,"value":{"int":"12"}}', sp.CorruptCheckpointError, "hex"),
        ('{"v":1,"value":{"torch.dtype":"os.system"}}', sp.CorruptCheckpointError, "torch dtype"),
    ],
)
def test_hostile_object_entries(
    tmp_path: pathlib.Path, doc: str, error: type[Exception], words: str
) -> None:
    if "torch" in doc:
        pytest.importorskip("torch")
    p = _hostile(tmp_path, doc)
    with pytest.raises(error) as e:
        sp.load_file(p)
    assert words in str(e.value) and "'o'" in str(e.value)


def test_hostile_forged_enum_of_a_registered_class(tmp_path: pathlib.Path) -> None:
    sp.register_type(Config)
    p = _hostile(tmp_path, f'{{"v":1,"value":{{"enum":["{__name__}.Config","RED"]}}}}')
    with pytest.raises(sp.CorruptCheckpointError, match="registered as a dataclass"):
        sp.load_file(p)
    sp.register_type(Optim)
    p = _hostile(tmp_path, f'{{"v":1,"value":{{"dataclass":["{__name__}.Optim",{{"evil":1}}]}}}}')
    with pytest.raises(sp.CorruptCheckpointError, match="does not declare"):
        sp.load_file(p)


def test_hostile_deep_and_wide_documents(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = '{"v":1,"value":' + '{"tuple":[' * 100_000 + "1" + "]}" * 100_000 + "}"
    with pytest.raises(sp.CorruptCheckpointError):
        sp.load_file(_hostile(tmp_path, deep))
    just_deep = '{"v":1,"value":' + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "}"
    with pytest.raises(sp.CorruptCheckpointError, match="deeper"):
        sp.load_file(_hostile(tmp_path, just_deep))
    monkeypatch.setattr(
        sp.storage.objects, "MAX_OBJECT_BYTES", 1000
    )  # the cap, without 64 MiB files
    huge = b'{"v":1,"value":"' + b"a" * 1000 + b'"}'
    with pytest.raises(sp.CorruptCheckpointError, match="bytes a reader accepts"):
        sp.load_file(_hostile(tmp_path, huge))


def test_state_dict_adapter_stores_objects(tmp_path: pathlib.Path) -> None:
    """A trackable's state_dict() holding a set, a dataclass and a numpy scalar saves and
    restores them (no longer refused as object arrays)."""

    class Loader:
        def __init__(self, state: dict[str, Any]) -> None:
            self.state = state

        def state_dict(self) -> dict[str, Any]:
            return self.state

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.state = state

    saved = {"seen": {"a", "b"}, "cfg": Optim(lr=0.5), "count": np.int32(3), "pos": 4}
    path = sp.Checkpoint(loader=Loader(saved)).write(str(tmp_path / "c"))
    back = Loader({})
    with sp.safe_types([Optim]):
        sp.Checkpoint(loader=back).read(path).assert_consumed()
    assert back.state == saved and type(back.state["count"]) is np.int32


def test_exact_floats_bytearrays_and_folds(tmp_path: pathlib.Path) -> None:
    """Issue 33 (found by shardpoint.testing): a float NaN kept neither payload nor sign
    (repr/JSON write ``nan``), a top-level bytearray came back as bytes, and the ``fold`` of a
    datetime/time was lost (ISO text does not carry it)."""
    import datetime as dt
    import struct

    neg_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000001))[0]
    value = {
        "f": neg_nan,
        "nested": [neg_nan, {"c": complex(0.0, neg_nan)}],
        "ba": bytearray(b"\x00\x01"),
        "t": dt.time(1, 30, fold=1),
        "d": dt.datetime(2024, 11, 3, 1, 30, fold=1),
    }
    sp.save_file(value, tmp_path / "ck")
    back = sp.load_file(tmp_path / "ck")

    def bits(x: float) -> bytes:
        return struct.pack("<d", x)

    assert bits(back["f"]) == bits(neg_nan) and bits(back["nested"][0]) == bits(neg_nan)
    assert bits(back["nested"][1]["c"].imag) == bits(neg_nan)
    assert type(back["ba"]) is bytearray and back["ba"] == value["ba"]
    assert back["t"].fold == 1 and back["d"].fold == 1 and back["d"] == value["d"]
