"""Benchmarks: scripts that print a table (speed and capacity targets live here, not in tests)."""
