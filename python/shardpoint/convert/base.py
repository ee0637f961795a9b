"""What every format adapter provides: a :class:`Source` of keyed values with their specs.

Converters and ``diff`` only speak this interface, so any source (shardpoint, safetensors,
PyTorch, TensorFlow) can be written to any sink and compared with any other source. A source
lists every entry's dtype/shape/size up front (sinks such as safetensors need the whole header
before the first byte of data) and reads one value at a time, so a conversion never holds more
than the values in flight.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Spec", "Source", "ConvertResult"]


@dataclass(frozen=True)
class Spec:
    """One entry of a source: a tensor (``kind == "tensor"``) or a typed non-tensor value."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    kind: str = "tensor"


class Source(abc.ABC):
    """Base class of the format readers. Subclasses fill ``notes`` with what they skip."""

    #: short format name shown to users ("shardpoint", "safetensors", "torch", "tensorflow")
    format: str = "?"

    def __init__(self, path: str) -> None:
        self.path = path
        self.notes: list[str] = []
        #: JSON-able metadata carried over to the destination (safetensors ``__metadata__``...)
        self.metadata: dict[str, Any] = {}

    @abc.abstractmethod
    def specs(self) -> list[Spec]:
        """Every convertible entry, in the source's key order."""

    @abc.abstractmethod
    def read(self, key: str) -> Any:
        """The value of ``key`` (a numpy array for tensors; views are fine, not kept)."""

    def expected_crc32c(self, key: str) -> int | None:
        """The crc32c of ``key``'s raw little-endian bytes recorded by the source, if any."""
        return None

    def location(self, key: str) -> str:
        """Where ``key``'s bytes live, for error messages (file, and offset when known)."""
        return self.path

    def close(self) -> None:  # noqa: B027 - optional hook: most sources hold nothing to release
        """Release files and mappings."""

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class ConvertResult:
    """What a conversion did: counts and the notes about what was skipped."""

    src_format: str
    dst_format: str
    entries: int = 0
    raw_bytes: int = 0
    notes: list[str] = field(default_factory=list)
