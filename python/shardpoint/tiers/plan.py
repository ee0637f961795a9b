"""Choosing what to restore: the newest step complete in some tier, and per rank the cheapest
copy of its part. A pure function of what every rank reported in one all-gather, so every
rank computes the same plan without another message.

Costs, cheapest first: the rank's own local part; a replica on the same node (read from the
node's local directory); a replica on another node (its holder sends the bytes over the
group); the persistent tier. A step counts only with one token for all of its parts: parts of
two different saves of one step number are never combined.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PartSource", "RestorePlan", "choose_plan", "TIER_COST"]

#: the cost order of the sources of a part
TIER_COST = {"local": 0, "node": 1, "peer": 2, "persistent": 3}


@dataclass(frozen=True)
class PartSource:
    """Where rank ``owner`` gets its part: ``tier`` is ``"local"`` (its own copy), ``"node"``
    (a replica on its node), ``"peer"`` (a replica another node's rank ``holder`` sends) or
    ``"persistent"``; ``path`` is the copy's prefix (or URL)."""

    owner: int
    tier: str
    holder: int | None
    path: str

    @property
    def key(self) -> tuple[int, str, int | None]:
        return (self.owner, self.tier, self.holder)


@dataclass
class RestorePlan:
    """The step every rank restores (``None``: nothing complete anywhere), its save token, and
    each rank's source; ``excluded`` lists the sources that failed their checks on the way."""

    step: int | None
    token: str | None = None
    sources: list[PartSource] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)

    def source_of(self, rank: int) -> PartSource:
        return self.sources[rank]

    def describe(self) -> str:
        if self.step is None:
            return "nothing to restore in any tier"
        parts = ", ".join(
            f"rank {s.owner}: {s.tier}"
            + (f" (from rank {s.holder})" if s.tier in ("node", "peer") else "")
            for s in self.sources
        )
        return f"step {self.step}: {parts}"


def choose_plan(
    world: int,
    node_of: list[int],
    inventories: list[list[dict[str, Any]]],
    persistent: list[dict[str, Any]],
    persistent_part: Any,
    excluded: set[tuple[int, int, str, int | None]],
) -> RestorePlan:
    """The plan for ``world`` ranks. ``inventories[h]``: the committed copies rank ``h`` holds
    (``owner``, ``step``, ``token``, ``prefix``); ``persistent``: the persistent tier's commit
    records; ``persistent_part(step, owner)`` its part URL; ``excluded``: (step, owner, tier,
    holder) of sources that failed."""
    by_step: dict[tuple[int, str], dict[int, list[PartSource]]] = {}
    for holder, copies in enumerate(inventories):
        for c in copies:
            owner, step, token = int(c["owner"]), int(c["step"]), str(c["token"])
            if not 0 <= owner < world:
                continue
            if holder == owner:
                tier = "local"
            elif node_of[holder] == node_of[owner]:
                tier = "node"
            else:
                tier = "peer"
            src = PartSource(owner, tier, holder, str(c["prefix"]))
            by_step.setdefault((step, token), {}).setdefault(owner, []).append(src)
    for rec in persistent:
        if int(rec.get("world", -1)) != world:
            continue
        step, token = int(rec["step"]), str(rec["token"])
        slot = by_step.setdefault((step, token), {})
        for owner in range(world):
            slot.setdefault(owner, []).append(
                PartSource(owner, "persistent", None, persistent_part(step, owner))
            )
    for step, token in sorted(by_step, reverse=True):
        slot = by_step[(step, token)]
        chosen: list[PartSource] = []
        for owner in range(world):
            usable = [
                s for s in slot.get(owner, []) if (step, owner, s.tier, s.holder) not in excluded
            ]
            if not usable:
                break
            # cheapest tier; among peers, the lowest holder (deterministic on every rank)
            chosen.append(min(usable, key=lambda s: (TIER_COST[s.tier], s.holder or 0)))
        else:
            return RestorePlan(step, token, chosen)
    return RestorePlan(None)
