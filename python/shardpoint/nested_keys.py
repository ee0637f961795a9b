"""Moved to :mod:`shardpoint.storage.nested_keys`; this module keeps the old import path working."""

from .storage.nested_keys import *  # noqa: F403
