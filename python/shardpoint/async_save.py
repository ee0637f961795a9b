"""Moved to :mod:`shardpoint.storage.async_save`; this module keeps the old import path working."""

from .storage.async_save import *  # noqa: F403
