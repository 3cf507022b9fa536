"""Benchmarks of flashtensor against its peers; run on the GPU machine (see bench.py)."""
