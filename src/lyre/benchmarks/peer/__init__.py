"""The peers benchmark.py measures Lyre against (--baseline): what users run instead."""
