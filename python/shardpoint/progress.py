"""Moved to :mod:`shardpoint.storage.progress`; this module keeps the old import path working."""

from .storage.progress import *  # noqa: F403
