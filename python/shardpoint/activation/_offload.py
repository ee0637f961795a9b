"""Offload of the inputs that checkpoints keep: to host memory (``"cpu"``) or to disk
(``"disk"``, through shardpoint's own store).

An :class:`OffloadSession` serves one forward/backward of a sequential model. Its saved-tensor
hook pair is applied to the inputs of the top-level checkpoints only:

* pack: the tensor is handed to a background writer (disk) or copied to pinned host memory on
  a side stream (``"cpu"`` with a GPU tensor); the original is released as soon as the copy
  exists. Small tensors (below ``min_bytes``) and parameters are kept as they are. ``"cpu"``
  with a tensor already in host memory keeps it as it is: a copy would only add memory;
* unpack (when backward re-runs that checkpoint): the tensor comes back (from memory if its
  write is still pending, else from the prefetched read or a read now); then the input of the
  previous checkpoint is read ahead in the background, so the next recompute finds it ready.
  The start of backward reads the last one ahead (:meth:`prefetch_last`, a hook on the output).

In-place modification: autograd checks the version counter of the tensors it saves itself, not
of those that saved-tensor hooks take over, so the session does it: each packed tensor's
version is recorded with a storage-less alias sharing its version counter (the offloaded
original's memory is still released), and unpack raises autograd's error if it moved.

Disk files: one shardpoint checkpoint per tensor in a scratch directory
``<root>/shardpoint-offload-<pid>-<random>``, ``root`` from the ``offload_dir`` argument, the
``SHARDPOINT_OFFLOAD_DIR`` variable or the system temp directory, written raw or through a
codec as ``compression`` says (``"auto"``: whichever :mod:`._offload_codec` models faster on
this disk and this dtype). Each file is deleted as soon as it has been read back; the directory
is removed when the session ends (after backward, when the graph is dropped, on an exception in
forward); directories left by a crashed process (its pid no longer runs) are removed when the
next session starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from shardpoint import storage
from shardpoint.errors import UnsupportedDTypeError
from shardpoint.storage.dtypes import numpy_dtype

from ._memory import is_parameter_like
from ._offload_codec import CompressionChooser

__all__ = ["OffloadSession", "OFFLOAD_KINDS", "scratch_root", "remove_stale_scratch"]

OFFLOAD_KINDS = ("cpu", "disk")
_PREFIX = "shardpoint-offload-"
_THREAD_PREFIX = "sp-offload-worker"


def scratch_root(directory: str | os.PathLike[str] | None = None) -> str:
    """Where disk offload puts its scratch directories."""
    if directory is not None:
        return os.fspath(directory)
    return os.environ.get("SHARDPOINT_OFFLOAD_DIR") or tempfile.gettempdir()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_scratch(root: str) -> list[str]:
    """Remove scratch directories under ``root`` whose process no longer runs (left by a
    crash); returns the removed paths."""
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return removed
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        pid_text = name[len(_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if pid != os.getpid() and not _pid_alive(pid):
            path = os.path.join(root, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class _Handle:
    """An offloaded tensor (what autograd stores for it)."""

    __slots__ = (
        "index",
        "dtype",
        "shape",
        "device",
        "tensor",
        "prefix",
        "write",
        "read",
        "event",
        "codec",
        "watch",
        "__weakref__",
    )

    def __init__(self, index: int, t: torch.Tensor) -> None:
        self.index = index
        self.dtype = t.dtype
        self.shape = tuple(t.shape)
        self.device = t.device
        self.tensor: torch.Tensor | None = None  # in memory: pending write, or host copy
        self.prefix: str | None = None
        self.write: Future[None] | None = None
        self.read: Future[torch.Tensor] | None = None
        self.event: Any = None  # CUDA event of the device-to-host copy
        self.codec = "none"  # what the file was written with
        self.watch = _VersionWatch(t)


class _Kept:
    """A tensor the session keeps as it is (small, a parameter, already in host memory), with
    its version watched like an offloaded one's."""

    __slots__ = ("tensor", "watch")

    def __init__(self, t: torch.Tensor) -> None:
        self.tensor = t
        self.watch = _VersionWatch(t)


class _VersionWatch:
    """``t``'s version at pack time and a way to read its current version later without
    keeping its memory: a detached alias (which shares the version counter) whose data is
    swapped for an empty tensor (``.data =`` keeps the alias's own version counter)."""

    __slots__ = ("version", "alias", "description")

    def __init__(self, t: torch.Tensor) -> None:
        self.version = t._version
        self.description = f"{t.type()} {list(t.shape)}"
        self.alias: torch.Tensor | None = t.detach()
        try:
            with torch.no_grad():
                self.alias.data = torch.empty(0, dtype=t.dtype, device=t.device)
        except (RuntimeError, TypeError):  # pragma: no cover - exotic tensor subclasses
            self.alias = None  # cannot alias without the memory: no check rather than no offload

    def check(self, where: str) -> None:
        """Raise autograd's error if the tensor was modified in place since pack."""
        if self.alias is None or self.alias._version == self.version:
            return
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{self.description}] (an input of a shardpoint.activation "
            f"checkpoint, {where}) is at version {self.alias._version}; expected version "
            f"{self.version} instead. Hint: the checkpoint needs it unchanged until backward; "
            "modify a clone instead, or check that nothing writes into it in place (e.g. "
            "`x += ...`, `x.add_(...)`, an in-place activation) after the checkpointed call."
        )


def _as_array(t: torch.Tensor) -> np.ndarray:
    """The tensor as a flat numpy array of its own dtype (bfloat16/float8 via ml_dtypes) so the
    store picks the codec for that dtype; raw bytes (uint8) where numpy has no such dtype."""
    flat = t.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy()
    try:
        return raw.view(numpy_dtype(str(t.dtype).removeprefix("torch.")))
    except (UnsupportedDTypeError, ValueError):
        return raw


class OffloadSession:
    """One forward/backward's worth of offloaded checkpoint inputs (see the module docstring)."""

    def __init__(
        self,
        kind: str,
        *,
        directory: str | os.PathLike[str] | None = None,
        min_bytes: int = 1 << 16,
        max_pending: int = 2,
        compression: str | None = "auto",
    ) -> None:
        if kind not in OFFLOAD_KINDS:
            raise ValueError(f"offload must be one of {list(OFFLOAD_KINDS)} or None, got {kind!r}")
        self.kind = kind
        self.compression = CompressionChooser(compression)
        self.min_bytes = int(min_bytes)
        self.max_pending = max(1, int(max_pending))
        self._pending: list[Future[None]] = []
        self._handles: list[weakref.ref[_Handle]] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._stream: Any = None
        self.directory: str | None = None
        if kind == "disk":
            root = scratch_root(directory)
            os.makedirs(root, exist_ok=True)
            remove_stale_scratch(root)
            self.directory = os.path.join(root, f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
            os.makedirs(self.directory)
        if kind == "disk":
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=_THREAD_PREFIX)
        # Removes the scratch directory when the session is collected (graph dropped) or at exit.
        self._finalizer = weakref.finalize(self, _cleanup, self.directory, self._pool)

    # -- hooks -------------------------------------------------------------------------------
    def hooks(self) -> tuple[Any, Any]:
        """The saved-tensor hook pair for checkpoint inputs."""
        return self._pack, self._unpack

    def _pack(self, t: torch.Tensor) -> Any:
        nbytes = t.numel() * t.element_size()
        if is_parameter_like(t) or nbytes < self.min_bytes:
            return _Kept(t)
        if self.kind == "cpu" and t.device.type == "cpu":
            return _Kept(t)  # already in host memory
        with self._lock:
            handle = _Handle(len(self._handles), t)
            self._handles.append(weakref.ref(handle))
        host = self._to_host(handle, t)
        if self.kind == "cpu":
            handle.tensor = host
            return handle
        assert self._pool is not None and self.directory is not None
        handle.prefix = os.path.join(self.directory, f"t{handle.index}")
        handle.tensor = host  # kept only until the write is done
        # Back-pressure: at most ``max_pending`` writes in flight, or a forward faster than
        # the disk would keep every activation in memory anyway.
        while len(self._pending) >= self.max_pending:
            self._pending.pop(0).result()
        # The tasks get what they need, not the session: a task must never hold the last
        # reference to it (its cleanup joins the pool's threads).
        handle.write = self._pool.submit(_write, handle, self.compression, self.directory)
        self._pending.append(handle.write)
        return handle

    def _to_host(self, handle: _Handle, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cuda":
            return t.detach()
        # Pinned host buffer, filled on a side stream; record_stream keeps the device memory
        # from being reused before the copy has read it, so ``t`` can be released now.
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=t.device)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(t.device))
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        with torch.cuda.stream(stream):
            host.copy_(t.detach(), non_blocking=True)
            handle.event = torch.cuda.Event()
            handle.event.record(stream)
        t.record_stream(stream)
        return host

    def _to_device(self, handle: _Handle, host: torch.Tensor) -> torch.Tensor:
        if handle.device.type != "cuda":
            return host
        if handle.event is not None:
            handle.event.synchronize()
        stream = self._stream or torch.cuda.current_stream(handle.device)
        with torch.cuda.stream(stream):
            out = host.to(handle.device, non_blocking=True)
        torch.cuda.current_stream(handle.device).wait_stream(stream)
        out.record_stream(torch.cuda.current_stream(handle.device))
        return out

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, _Kept):
            packed.watch.check(f"kept as it is by offload={self.kind!r}")
            return packed.tensor
        if not isinstance(packed, _Handle):  # pragma: no cover - only _pack's results arrive
            return packed
        packed.watch.check(f"offloaded to {self.kind}")
        if self.kind == "cpu":
            assert packed.tensor is not None
            tensor = self._to_device(packed, packed.tensor)
        else:
            future = packed.read
            host = future.result() if future is not None else _read(packed)
            packed.read = None
            tensor = self._to_device(packed, host)
        self.prefetch(packed.index - 1)
        return tensor

    # -- read-ahead ----------------------------------------------------------------------------
    def prefetch(self, index: int) -> None:
        """Start reading handle ``index`` back in the background (disk), if it is still alive."""
        if self.kind != "disk" or index < 0 or index >= len(self._handles):
            return
        handle = self._handles[index]()
        if handle is None or handle.read is not None or self._pool is None:
            return
        handle.read = self._pool.submit(_read, handle)

    def prefetch_last(self) -> None:
        """Read the last offloaded tensor ahead (called when backward starts)."""
        self.prefetch(len(self._handles) - 1)

    def watch(self, output: Any) -> None:
        """Hook ``output`` so that the start of backward triggers :meth:`prefetch_last`."""
        if isinstance(output, torch.Tensor) and output.requires_grad:
            session = weakref.ref(self)

            def hook(grad: torch.Tensor) -> None:
                alive = session()
                if alive is not None:
                    alive.prefetch_last()

            output.register_hook(hook)

    def close(self) -> None:
        """Remove the scratch directory now (pending writes are waited for first)."""
        self._finalizer()


def _write(handle: _Handle, chooser: CompressionChooser, directory: str | None) -> None:
    """Background task: write ``handle``'s tensor (raw or compressed), then release it."""
    if handle.event is not None:
        handle.event.synchronize()
    host = handle.tensor
    assert host is not None and handle.prefix is not None and directory is not None
    array = _as_array(host)
    handle.codec = chooser.codec_for(array, directory)
    with storage.Writer(handle.prefix, compression=handle.codec, durable=False) as writer:
        writer.add("t", array)
    handle.tensor = None  # the bytes are on disk: release the memory


def _read(handle: _Handle) -> torch.Tensor:
    """Read ``handle``'s tensor back (from memory if its write is not done) and delete its
    file."""
    if handle.write is not None:
        handle.write.result()  # raises the write's error, if any
    pending = handle.tensor
    if pending is not None:  # still in memory (write finished after we looked, or cpu)
        return pending
    assert handle.prefix is not None
    with storage.open(handle.prefix) as reader:
        raw = np.asarray(reader.get("t")).reshape(-1).view(np.uint8)
    tensor = torch.from_numpy(raw).view(handle.dtype).reshape(handle.shape)
    storage.remove(handle.prefix)
    return tensor


def _cleanup(directory: str | None, pool: ThreadPoolExecutor | None) -> None:
    if pool is not None:
        if threading.current_thread().name.startswith(_THREAD_PREFIX):
            # The session died on one of its own workers (a finished task held the last
            # reference): that thread cannot join itself, so another one waits for the pool
            # and then removes the directory.
            threading.Thread(
                target=_cleanup, args=(directory, pool), name="sp-offload-cleanup"
            ).start()
            return
        pool.shutdown(wait=True, cancel_futures=True)
    if directory is not None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(directory, ignore_errors=True)
