"""``python -m shardpoint``: the same command line as the ``shardpoint`` console script."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
