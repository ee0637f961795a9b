"""Moved to :mod:`shardpoint.storage.omegaconf_objects`; this module keeps the old import path working."""

from .storage.omegaconf_objects import *  # noqa: F403
