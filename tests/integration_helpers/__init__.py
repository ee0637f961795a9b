"""Helpers of tests/integrations: the training scripts each trainer test runs in-process and
in child processes (for resumes in a new process and for saves killed mid-way)."""
