"""Moved to :mod:`shardpoint.storage.strong_digest`; this module keeps the old import path working."""

from .storage.strong_digest import *  # noqa: F403
