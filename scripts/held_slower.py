"""The held programs (as `python -m flashtensor.bench.held --json` wrote them) that ran slower than eager, by name.

    python scripts/held_slower.py held.json      # prints the names, space-separated (none: an empty line)
"""
import json
import sys

from flashtensor.bench.held import slower_than_eager

if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(*slower_than_eager(json.load(f)))
