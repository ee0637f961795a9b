"""Helpers of the reliability suite (tests/test_reliability_*.py).

- :mod:`.craft`: a from-the-spec writer of shard and index files, so hostile tests can build a
  *valid* checkpoint, change one field and recompute every crc (the semantic checks must fire,
  not the checksums);
- :mod:`.crash_child`: the training-like save loop run in a child process and SIGKILLed;
- :mod:`.procinfo`: file descriptors, mappings and peak RSS of a process.
"""
