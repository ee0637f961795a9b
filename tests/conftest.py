"""Shared pytest setup: the test suite's own helper modules live at tests/ (``reference_reader``,
``reliability_helpers``), imported by tests in the subfolders (tests/storage, tests/reliability,
...). Put tests/ on sys.path explicitly so that holds under any pytest import mode.

The subfolders have no ``__init__.py`` (``tests/torch`` as a package would shadow PyTorch), so
test file names must be unique across the whole tree.
"""

from __future__ import annotations

import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
