"""Moved to :mod:`shardpoint.storage.dtypes`; this module keeps the old import path working."""

from .storage.dtypes import *  # noqa: F403
