"""Moved to :mod:`shardpoint.storage.objects`; this module keeps the old import path working."""

from .storage.objects import *  # noqa: F403
