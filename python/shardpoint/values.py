"""Moved to :mod:`shardpoint.storage.values`; this module keeps the old import path working."""

from .storage.values import *  # noqa: F403
