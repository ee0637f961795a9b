"""Debug mode of non-reentrant checkpoints: operator logs of the forward and the recompute.

With ``debug=True`` (or inside ``set_checkpoint_debug_enabled(True)``) every ATen operator run
by the checkpointed function is logged, with the user source line that called it, once during
the original forward and once during the recompute. When the recompute does not reproduce the
saved tensors, the error carries both logs side by side so the first differing operator can be
found, as PyTorch's debug mode does (its headline, "Detected non-determinism while running
activation checkpointing", and its "You are seeing this error because you passed `debug=True`
to checkpoint" are kept so searches and ``match=`` written for PyTorch still hit).
"""

from __future__ import annotations

import traceback
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpLog", "NON_DETERMINISM_HEADLINE", "DEBUG_REASON", "format_debug_report"]

NON_DETERMINISM_HEADLINE = "Detected non-determinism while running activation checkpointing"
# PyTorch's sentence for the same error, which its own tests (and users' ``match=``) look for.
DEBUG_REASON = "You are seeing this error because you passed `debug=True` to checkpoint"

_PACKAGE_DIR = __file__.rsplit("/", 1)[0]


def _user_site() -> str:
    """The innermost frame outside torch and this package: where the user's code called the op."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        name = frame.filename
        if name.startswith(_PACKAGE_DIR) or "/torch/" in name:
            continue
        return f"{name}:{frame.lineno} in {frame.name}"
    return "<unknown>"


class OpLog(TorchDispatchMode):
    """Records ``(operator, call site)`` for every ATen op that runs while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[tuple[str, str]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict | None = None
    ) -> Any:
        self.entries.append((str(func), _user_site()))
        return func(*args, **(kwargs or {}))


def format_debug_report(message: str, forward: OpLog | None, recompute: OpLog | None) -> str:
    """``message`` followed by the operator logs of the forward and of the recompute."""

    def listing(log: OpLog | None, label: str) -> str:
        if log is None:
            return f"({label}: not recorded)"
        total = len(log.entries)
        return "\n".join(
            f"  {i + 1:4d}/{total} {op}    at {site}" for i, (op, site) in enumerate(log.entries)
        )

    first_diff = ""
    if forward is not None and recompute is not None:
        for i, (a, b) in enumerate(zip(forward.entries, recompute.entries, strict=False)):
            if a[0] != b[0]:
                first_diff = (
                    f"First differing operator: #{i + 1}: {a[0]} (forward, {a[1]}) vs "
                    f"{b[0]} (recompute, {b[1]})\n"
                )
                break
    return (
        f"{message}\n\n"
        f"ERROR: {NON_DETERMINISM_HEADLINE}\n"
        f"{DEBUG_REASON} (or turned debug mode on\n"
        "with set_checkpoint_debug_enabled(True)), and the tensors saved during the original\n"
        "forward differ from those saved during the recomputation: different operators ran.\n"
        "Compare the two operator logs below (in execution order, with the source line that\n"
        "called each); 'detach' calls may differ and can be ignored.\n"
        f"{first_diff}\n"
        "Operators executed during the original forward:\n"
        f"{listing(forward, 'forward')}\n\n"
        "Operators executed during recomputation:\n"
        f"{listing(recompute, 'recompute')}"
    )
