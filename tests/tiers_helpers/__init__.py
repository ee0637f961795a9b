"""Helpers of tests/tiers and benches/bench_tiers.py: a job of real ranks (gloo processes,
2 "nodes" = 2 local directories) and a rate-limited link in front of the S3 server."""
