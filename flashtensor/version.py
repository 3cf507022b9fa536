"""The package version (the plan cache keys on it, with a hash of the sources)."""
__version__ = "0.1.0"
