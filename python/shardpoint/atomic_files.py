"""Moved to :mod:`shardpoint.storage.atomic_files`; this module keeps the old import path working."""

from .storage.atomic_files import *  # noqa: F403
