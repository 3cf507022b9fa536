"""Command line: `python -m flashtensor explain|bench|demo`."""
