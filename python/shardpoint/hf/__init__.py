"""transformers models straight from shardpoint checkpoints: no safetensors export in between.

``from_pretrained(AutoModelForCausalLM, path)`` builds the model from the config kept with the
checkpoint (``shardpoint convert`` keeps config.json and the tokenizer files; a serving
directory has them on disk) without allocating weights (``accelerate.init_empty_weights``), then
hands each parameter the tensor :func:`shardpoint.torch.weights_iterator` decoded for it
(``load_state_dict(assign=True)``: no second copy, no random initialisation). ``load_into``
is the second half alone, for a model the caller built.

Only public transformers and torch interfaces are used (no ``_load_pretrained_model``), so key
renames that transformers applies for some architectures when it reads its own files are not
applied here: the checkpoint's names must be the model's ``state_dict`` names (they are for
checkpoints converted from ``save_pretrained`` directories). Imports without transformers;
``from_pretrained`` needs it (``pip install 'shardpoint[transformers]'``).
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from ..convert.hf_files import SECTION, write_files
from ..convert.serving import resolve
from ..errors import InvalidArgumentError, NotFoundError

__all__ = ["from_pretrained", "load_into", "files_dir", "HUB_KEYWORDS", "UNSUPPORTED_KEYWORDS"]


@contextlib.contextmanager
def files_dir(path: str | os.PathLike[str]) -> Iterator[str]:
    """A directory holding ``path``'s config.json and tokenizer files: the serving or Hugging
    Face directory itself, or a temporary one written from the checkpoint's kept files
    (removed on exit). ``AutoTokenizer.from_pretrained(d)`` / ``AutoConfig`` read it."""
    layout = resolve(path)
    if layout.directory is not None and os.path.isfile(
        os.path.join(layout.directory, "config.json")
    ):
        yield layout.directory
        return
    if layout.whole is None:
        raise NotFoundError(f"{path}: no config.json and no checkpoint holding one")
    from .. import storage

    with storage.open(layout.whole) as r:
        section = r.sections.get(SECTION)
    if not section:
        raise NotFoundError(
            f"{path}: no config.json beside it and none kept in the checkpoint (convert a "
            "Hugging Face directory with `shardpoint convert DIR P` to keep its files)"
        )
    with tempfile.TemporaryDirectory(prefix="shardpoint-hf-") as d:
        write_files(section, d, taken=set(), where=os.fspath(path), durable=False, notes=[])
        yield d


def load_into(
    model: Any,
    path: str | os.PathLike[str],
    *,
    device: Any = None,
    dtype: Any = None,
    strict: bool = True,
    threads: int | None = None,
    io: str = "auto",
) -> Any:
    """Load ``path``'s weights into ``model`` (a ``torch.nn.Module``, typically built under
    ``accelerate.init_empty_weights()`` so its parameters are on the meta device).

    Each tensor from :func:`shardpoint.torch.weights_iterator` becomes the parameter or buffer
    of its name (``load_state_dict(assign=True)``): cast to ``dtype`` (floating tensors; default:
    as stored) and moved to ``device`` (default: CPU). Then ``model.tie_weights()`` ties what
    the model ties (the checkpoint usually stores a tied pair once). ``strict``: raise
    ``RuntimeError`` (torch's wording) when a parameter or persistent buffer is left without a
    value, or the checkpoint has names the model lacks. Returns torch's
    ``_IncompatibleKeys(missing_keys, unexpected_keys)``, tied names not counted as missing.
    """
    import torch

    from ..torch.weights import weights_iterator

    target = torch.device(device) if device is not None else torch.device("cpu")
    state: dict[str, Any] = {}
    for name, t in weights_iterator(_weights(path), device=target, threads=threads, io=io):
        if dtype is not None and t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype)
        state[name] = t
    result = model.load_state_dict(state, strict=False, assign=True)
    del state
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    left = [
        n
        for n, p in list(model.named_parameters(remove_duplicate=False))
        + list(model.named_buffers(remove_duplicate=False))
        if p.device.type == "meta"
    ]
    missing = sorted(set(result.missing_keys) & set(left))
    unexpected = sorted(result.unexpected_keys)
    if strict and (missing or unexpected):
        msgs = []
        if missing:
            msgs.append(f"Missing key(s) in state_dict: {', '.join(map(repr, missing))}.")
        if unexpected:
            msgs.append(f"Unexpected key(s) in state_dict: {', '.join(map(repr, unexpected))}.")
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(model).__name__}:\n\t" + "\n\t".join(msgs)
        )
    return type(result)(missing, unexpected)


def _weights(path: str | os.PathLike[str]) -> str:
    layout = resolve(path)
    if layout.whole is None:
        raise NotFoundError(
            f"{path}: holds only tensor-parallel pieces (model-rank-*), not a whole model"
        )
    return layout.whole


def _dtype_of(config: Any, dtype: Any) -> Any:
    import torch

    if dtype is None or dtype == "auto":
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if dtype is None:
            return None
    if isinstance(dtype, str):
        value = getattr(torch, dtype, None)
        if not isinstance(value, torch.dtype):
            raise InvalidArgumentError(f"dtype {dtype!r} is not a torch dtype")
        return value
    return dtype


#: transformers' ``from_pretrained`` keywords about finding files on the Hub or choosing among
#: its own files: nothing to do for a local shardpoint checkpoint, accepted and ignored
HUB_KEYWORDS = frozenset(
    {
        "cache_dir", "force_download", "local_files_only", "token", "use_auth_token",
        "revision", "proxies", "resume_download", "code_revision", "mirror", "use_safetensors",
        "weights_only", "low_cpu_mem_usage", "disable_mmap", "adapter_kwargs", "_from_auto",
        "_from_pipeline", "_commit_hash",
    }
)  # fmt: skip
#: keywords asking for what only transformers' own loading does (quantizing, offloading,
#: tensor parallelism, other formats): refused with a way out
UNSUPPORTED_KEYWORDS = frozenset(
    {
        "quantization_config", "load_in_8bit", "load_in_4bit", "gguf_file", "tp_plan",
        "tp_size", "device_mesh", "max_memory", "offload_folder", "offload_state_dict",
        "offload_buffers", "from_tf", "from_flax", "state_dict", "key_mapping", "variant",
        "fusion_config", "output_loading_info", "ignore_mismatched_sizes",
    }
)  # fmt: skip


def _single_device(path: Any, device_map: Any) -> Any:
    """``device_map`` as one device: a device name or index as given; ``"auto"`` the only
    accelerator (or the CPU without one), as accelerate would place a model that fits."""
    if isinstance(device_map, str | int) and device_map != "auto":
        return device_map
    if device_map == "auto":
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n <= 1:
            return "cuda:0" if n else "cpu"
    raise InvalidArgumentError(
        f"{path}: device_map={device_map!r}: a shardpoint checkpoint loads onto one device here "
        "(a name such as 'cpu' or 'cuda:1', or 'auto' with at most one GPU); for a map across "
        f"devices write a Hugging Face directory (`shardpoint convert {path} OUT --to hf`)"
    )


def from_pretrained(cls: Any, path: str | os.PathLike[str], **kw: Any) -> Any:
    """``cls.from_pretrained(path)`` for a shardpoint checkpoint (or serving directory).

    ``cls``: an ``AutoModel*`` class or a concrete ``PreTrainedModel`` subclass. ``path``: a
    checkpoint prefix converted from a Hugging Face directory (its config and tokenizer are
    kept inside), a serving directory (``shardpoint export``), or a Hugging Face directory.
    Keywords: ``dtype`` (or ``torch_dtype``; default ``"auto"``: config.json's ``dtype``),
    ``device`` (or ``device_map`` naming one device), ``strict`` (default ``True``),
    ``threads``, ``io``, ``trust_remote_code``, ``attn_implementation``, ``config`` (a config
    object or where to read one), ``subfolder``; other keywords override config attributes, as
    for transformers. transformers' keywords for the Hub (:data:`HUB_KEYWORDS`) are ignored;
    those only its own loading honours (:data:`UNSUPPORTED_KEYWORDS`: quantizing, offloading,
    other formats) raise ``InvalidArgumentError`` naming the way out. Returns the model in eval
    mode. ``cls.from_pretrained(path)`` itself comes here in any process where shardpoint is
    installed (``_shardpoint_loaders/pretrained.py``).
    """
    import transformers
    from accelerate import init_empty_weights

    for k in HUB_KEYWORDS & kw.keys():
        del kw[k]
    refused = sorted(
        k for k in UNSUPPORTED_KEYWORDS & kw.keys() if kw[k] not in (None, False, {}, "")
    )
    if refused:
        raise InvalidArgumentError(
            f"{os.fspath(path)}: from_pretrained of a shardpoint checkpoint does not support "
            f"{', '.join(refused)}; write a Hugging Face directory with `shardpoint convert "
            f"{os.fspath(path)} OUT --to hf` and give that to transformers"
        )
    for k in UNSUPPORTED_KEYWORDS & kw.keys():
        del kw[k]
    if kw.get("subfolder"):
        path = os.path.join(os.fspath(path), kw.pop("subfolder"))
    kw.pop("subfolder", None)
    given = kw.pop("config", None)
    dtype = kw.pop("dtype", kw.pop("torch_dtype", "auto"))
    device = kw.pop("device", None)
    device_map = kw.pop("device_map", None)
    if device_map is not None:
        device = _single_device(os.fspath(path), device_map)
    strict = kw.pop("strict", True)
    threads = kw.pop("threads", None)
    io = kw.pop("io", "auto")
    trust = kw.pop("trust_remote_code", False)
    attn = kw.pop("attn_implementation", None)
    with files_dir(path) as d:
        if isinstance(given, transformers.PretrainedConfig):
            config = copy.deepcopy(given)  # transformers does not change the caller's either
            for k, v in kw.items():
                setattr(config, k, v)
        else:
            where = d if given is None else os.fspath(given)
            config = transformers.AutoConfig.from_pretrained(where, trust_remote_code=trust, **kw)
        if attn is not None:
            config._attn_implementation = attn
        generation = None
        if os.path.isfile(os.path.join(d, "generation_config.json")):
            generation = transformers.GenerationConfig.from_pretrained(d)
    torch_dtype = _dtype_of(config, dtype)
    import torch

    old = torch.get_default_dtype()
    if torch_dtype is not None and torch_dtype.is_floating_point:
        torch.set_default_dtype(torch_dtype)  # buffers made in __init__ (rotary) follow it
    try:
        with init_empty_weights():
            if hasattr(cls, "from_config"):
                model = cls.from_config(config, trust_remote_code=trust)
            else:
                model = cls(config)
    finally:
        torch.set_default_dtype(old)
    load_into(model, path, device=device, dtype=torch_dtype, strict=strict, threads=threads, io=io)
    if generation is not None and hasattr(model, "generation_config"):
        model.generation_config = generation
    if device is not None:
        model.to(device)  # buffers made at construction (rotary inv_freq) follow the weights
    return model.eval()
