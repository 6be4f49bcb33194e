"""Benchmarks (`flashrt bench`): latency percentiles, parity, environment record. Not tests."""
