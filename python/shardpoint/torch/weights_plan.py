"""What ``weights_iterator`` reads: the stored keys a ``names`` selection asks for, in file
order, the names tied to each, and the batches the read-ahead takes them in."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from .. import storage
from ..errors import InvalidArgumentError, MissingKeyError
from ..storage.collector import collector_paused
from .tensors import torch_section

__all__ = ["Names", "Plan"]

Names = Collection[str] | Callable[[str], bool] | None


class Plan:
    """What to read: the stored keys in file order, their infos, and the names tied to them."""

    def __init__(self, reader: storage.Reader, names: Names) -> None:
        # an info per stored key, all kept: the collector paused (storage/collector.py)
        with collector_paused():
            self._build(reader, names)

    def _build(self, reader: storage.Reader, names: Names) -> None:
        meta = torch_section(reader) if isinstance(reader, storage.Reader) else None
        aliases: Mapping[str, Any] = (meta or {}).get("aliases", {}) if meta else {}
        stored = reader.keys()
        stored_set = set(stored)
        self.followers: dict[str, list[str]] = {}
        for alias, rec in aliases.items():
            src = rec.get("of") if isinstance(rec, Mapping) else None
            if isinstance(src, str) and src in stored_set and alias not in stored_set:
                self.followers.setdefault(src, []).append(alias)
        if names is None:
            wanted: set[str] | None = None
        elif callable(names):
            pred = names
            wanted = {k for k in stored if pred(k)}
            wanted |= {a for fs in self.followers.values() for a in fs if pred(a)}
        else:
            if isinstance(names, str):
                raise InvalidArgumentError("names must be a collection of names, not one str")
            wanted = set(names)
            known = stored_set | {a for fs in self.followers.values() for a in fs}
            missing = sorted(wanted - known)
            if missing:
                raise MissingKeyError(
                    f"{reader.path}: not in the checkpoint: {', '.join(map(repr, missing[:10]))}"
                    + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
                )
        keys = (
            stored
            if wanted is None
            else [
                k
                for k in stored
                if k in wanted or (k in self.followers and set(self.followers[k]) & wanted)
            ]
        )
        # all records at once where the reader can (storage.Reader._infos: one core call)
        bulk = getattr(reader, "_infos", None)
        found = bulk(keys) if bulk is not None else [reader.info(k) for k in keys]
        infos: list[storage.EntryInfo] = []
        for info in found:
            if info.kind != "tensor":
                if wanted is not None and info.key in wanted:
                    raise InvalidArgumentError(f"key {info.key!r}: stored value is a {info.kind}")
                continue
            infos.append(info)
        # file order: the order the bytes lie on disk, which is what the read-ahead follows
        infos.sort(key=lambda i: (i.shard, i.offset))
        self.infos = infos
        self.wanted = wanted

    def names_of(self, key: str) -> list[str]:
        """The names a stored key is handed out under: itself and the names tied to it."""
        out = [key, *self.followers.get(key, [])]
        return out if self.wanted is None else [n for n in out if n in self.wanted]

    def batches(
        self, limit: int | Callable[[], int], first: int | None = None
    ) -> Iterator[list[storage.EntryInfo]]:
        """Consecutive runs of at most ``limit`` raw bytes (a larger value alone); with
        ``first``, the first run at most that, each next one twice the last, up to ``limit``
        (the consumer starts on the first values sooner: nothing overlaps the first read).
        ``limit`` may be a function, asked as each run starts (the route of the reads, and
        so the batch size it wants, may change during an iteration)."""
        limit_of = limit if callable(limit) else (lambda: limit)
        cur: list[storage.EntryInfo] = []
        acc = 0
        cap = limit_of() if first is None else min(first, limit_of())
        for info in self.infos:
            if cur and acc + info.raw_bytes > cap:
                yield cur
                cur, acc = [], 0
                cap = min(limit_of(), cap * 2)
            cur.append(info)
            acc += info.raw_bytes
        if cur:
            yield cur
