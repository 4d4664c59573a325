"""Benchmarks behind ``benchmark.py``: each mode is a module here."""
