"""``training_args.bin`` of a :class:`ShardpointTrainer` checkpoint: what ``torch.load`` of it
gives back in the user's next script.

``Trainer`` pickles its ``TrainingArguments`` object there, and scripts read it back as one:
``args = torch.load("checkpoint-500/training_args.bin", weights_only=False);
args.learning_rate``. Our file is a shardpoint single file (no pickle) holding the arguments'
JSON fields (``TrainingArguments.to_dict``), with a metadata record naming the class and its
``TrainingArguments`` bases. ``torch.load`` (the front ``_shardpoint_loaders`` installs) builds
the object again from them: ``cls(**fields)``, so the arguments are checked and completed by
the class itself as when the user made them (enums, ``AcceleratorConfig``, the device).

Which class, without unpickling: the first of the recorded names that is on the allow-list
(``shardpoint.add_safe_types``, ``torch.serialization.add_safe_globals``), one of transformers'
own classes (looked up in ``transformers``, never imported by a name read from the file), or,
only when the caller said ``weights_only=False`` (trusting the file as ``torch.load`` would:
it imports the classes a pickle names), the recorded class imported from its module. A class
that is not found is replaced by its nearest base that is, with a warning saying how to allow
it (its extra fields become attributes). Deliberately not the peer's behaviour:
``torch.load`` of Trainer's pickle with ``weights_only=True`` (torch's default) refuses
``TrainingArguments``; ours builds transformers' own class, which runs no code named by the
file. Tokens are not stored (``to_dict`` masks them): they come back as ``None``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

from ..storage.object_types import allowed_class_named

__all__ = ["RECORD", "args_fields", "args_record", "rebuild_args", "trusted"]

#: metadata key of the record (the class and its ``TrainingArguments`` bases)
RECORD = "hf.training_args"


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def args_fields(args: Any) -> dict[str, Any]:
    """The arguments' JSON fields (``to_json_string``: enums as values, tokens masked)."""
    fields = json.loads(args.to_json_string())
    assert isinstance(fields, dict)
    return fields


def args_record(args: Any) -> dict[str, Any]:
    """The metadata record: the class's name and those of its bases up to
    ``TrainingArguments`` (nearest first)."""
    from transformers import TrainingArguments

    bases = [
        _name(c)
        for c in type(args).__mro__[1:]
        if isinstance(c, type) and issubclass(c, TrainingArguments)
    ]
    return {"class": _name(type(args)), "bases": bases}


def trusted(weights_only: bool | None) -> bool:
    """Whether the caller trusts the file as ``torch.load`` does: ``weights_only=False``, or
    left unset with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` set (torch's own switch)."""
    if weights_only is not None:
        return weights_only is False
    flag = os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").strip().lower()
    return flag in ("1", "true", "yes", "on")


def _transformers_class(name: str, base: type) -> type | None:
    """``name`` when it is one of transformers' own ``TrainingArguments`` classes."""
    module, _, qual = name.rpartition(".")
    if module != "transformers" and not module.startswith("transformers."):
        return None
    import transformers

    try:
        cls = getattr(transformers, qual, None)
    except Exception:  # transformers' lazy module failing to import an optional part
        return None
    ok = isinstance(cls, type) and issubclass(cls, base) and _name(cls) == name
    return cls if ok else None


def _imported_class(name: str, base: type) -> type | None:
    """``name`` imported from its module (only for a caller that trusts the file)."""
    module, _, qual = name.rpartition(".")
    try:
        obj: Any = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError):
        return None
    return obj if isinstance(obj, type) and issubclass(obj, base) else None


def _find_class(names: list[str], trust: bool) -> type | None:
    from transformers import TrainingArguments

    for name in names:
        cls = allowed_class_named(name)
        if isinstance(cls, type) and issubclass(cls, TrainingArguments):
            return cls
        cls = _transformers_class(name, TrainingArguments)
        if cls is None and trust:
            cls = _imported_class(name, TrainingArguments)
        if cls is not None:
            return cls
    return None


def rebuild_args(fields: Any, record: Mapping[str, Any], *, where: str, trust: bool) -> Any:
    """The ``TrainingArguments`` object ``fields`` (a ``training_args.bin``'s tree, read from
    ``where``) were saved from, as ``torch.load`` of Trainer's pickle gives it. Falls back to
    the fields as a dict, with a warning naming ``where`` and why, when transformers is not
    installed, no recorded class is found or the class refuses the fields."""

    def as_dict(why: str) -> Any:
        warnings.warn(
            f"shardpoint: {where}: the training arguments are returned as a dict of their "
            f"fields, not as a TrainingArguments object: {why}",
            stacklevel=6,  # the user's torch.load: as_dict, here, _single, torch_load, front
        )
        return fields

    bases = record.get("bases")
    names = [record.get("class"), *(bases if isinstance(bases, list) else [])]
    names = [n for n in names if isinstance(n, str) and n]  # bytes from disk: hostile
    if not isinstance(fields, dict) or not names:
        return fields  # not a record this module wrote: the tree as stored
    try:
        cls = _find_class(names, trust)
    except ImportError as e:
        return as_dict(f"transformers does not import here ({e})")
    if cls is None:
        return as_dict(f"none of the classes {names} is available")
    if _name(cls) != names[0]:
        what = names[0].rpartition(".")[2]
        warnings.warn(
            f"shardpoint: {where}: built as {_name(cls)}, not {names[0]}, which is not on the "
            f"allow-list: call shardpoint.add_safe_types([{what}]) or "
            f"torch.serialization.add_safe_globals([{what}]) first, or pass "
            "weights_only=False to trust the file",
            stacklevel=5,  # the user's torch.load: here, _single, torch_load, the front
        )
    init = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {
        k: (None if k.endswith("_token") and v == f"<{k.upper()}>" else v)
        for k, v in fields.items()
    }
    try:
        obj = cls(**{k: v for k, v in kwargs.items() if k in init})
    except Exception as e:  # the class checks its fields against this machine (fp16 on a CPU)
        return as_dict(f"{_name(cls)}(**fields) raised {type(e).__name__}: {e}")
    for k, v in kwargs.items():
        if k not in init:  # fields of a subclass that was not found
            setattr(obj, k, v)
    return obj
