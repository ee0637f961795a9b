"""Moved to :mod:`shardpoint.storage.io_mode`; this module keeps the old import path working."""

from .storage.io_mode import *  # noqa: F403
