"""Moved to :mod:`shardpoint.storage.slicing`; this module keeps the old import path working."""

from .storage.slicing import *  # noqa: F403
