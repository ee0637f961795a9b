"""The package as a user's install has it, for benches that time fresh processes.

A wheel's install compiles its modules to bytecode; this checkout's editable install does not,
and with ``PYTHONDONTWRITEBYTECODE`` (set on this project's machines) nothing is ever written,
so every fresh process compiled the modules it imported lazily, inside the timed load (a first
``load_into`` of a 1 GB Hugging Face directory: ~8 ms of a ~70 ms load, docs/SERVING.md,
"Issue 41 (nineteenth round)"). The anchors' packages are compiled (``make develop``).
"""

from __future__ import annotations

import compileall
import importlib.util


def compile_package(name: str = "shardpoint") -> None:
    """Compile package ``name``'s modules where it is imported from (only what changed)."""
    spec = importlib.util.find_spec(name)
    for where in (spec.submodule_search_locations or []) if spec else []:
        compileall.compile_dir(where, quiet=1, workers=0)
