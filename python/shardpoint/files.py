"""Moved to :mod:`shardpoint.storage` (the file API); kept so that old imports work."""

from .storage import *  # noqa: F403
