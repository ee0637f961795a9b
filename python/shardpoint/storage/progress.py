"""Progress bars that cost nothing when nobody is watching.

``progress_bar(...)`` gives a tqdm bar when it is wanted and possible, else a no-op object with
the same three methods, so callers never branch. "Wanted" is the caller's ``progress=`` flag:
``None`` (the default everywhere) means "only when stderr is a terminal", so pipes, CI logs and
tests stay clean; ``True`` forces a bar (if tqdm is installed), ``False`` disables it. tqdm is an
optional dependency: without it every bar is a no-op.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__ = ["Bar", "progress_bar", "wanted", "run_with_spinner"]

T = TypeVar("T")


class Bar(Protocol):
    """The part of tqdm's interface shardpoint uses."""

    def update(self, n: float = 1) -> Any: ...

    def close(self) -> None: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...


class _NoBar:
    def update(self, n: float = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def wanted(progress: bool | None) -> bool:
    """Whether a bar should be shown for this ``progress=`` value."""
    if progress is None:
        try:
            return sys.stderr is not None and sys.stderr.isatty()
        except (AttributeError, ValueError):  # replaced or closed stderr
            return False
    return bool(progress)


def progress_bar(
    total: float | None, desc: str, *, progress: bool | None = None, unit: str = "B"
) -> Any:
    """A tqdm bar over ``total`` units (bytes by default, scaled to KB/MB), or a no-op."""
    if not wanted(progress):
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=unit == "B",
        unit_divisor=1024 if unit == "B" else 1000,
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
        # Below half a second nobody needs a bar; tqdm only starts drawing after this.
        delay=0.5,
    )


def run_with_spinner(fn: Callable[[], T], desc: str, *, progress: bool | None = None) -> T:
    """Run ``fn`` (one long call with the GIL released, e.g. ``Reader.verify``) while a bar
    shows the elapsed time. The call itself reports no progress, so the bar has no total."""
    if not wanted(progress):
        return fn()
    bar = progress_bar(None, desc, progress=progress, unit="s")
    if isinstance(bar, _NoBar):
        return fn()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(0.25):
            bar.update(0.25)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        return fn()
    finally:
        done.set()
        ticker.join()
        bar.close()
