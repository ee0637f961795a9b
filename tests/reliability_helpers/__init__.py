"""Helpers of the reliability suite (tests/reliability/test_reliability_*.py).

- :mod:`.craft`: a from-the-spec writer of shard and index files, so hostile tests can build a
  *valid* checkpoint, change one field and recompute every crc (the semantic checks must fire,
  not the checksums);
- :mod:`.hostile_cases`: the crafted hostile checkpoints (also runnable in a child process);
- :mod:`.crash_child`: the training-like save loop run in a child process and SIGKILLed.
"""
