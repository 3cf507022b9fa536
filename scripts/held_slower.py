"""The held programs (as `python -m flashtensor.bench.held --json` wrote them) that ran slower than eager, by name.

    python scripts/held_slower.py held.json      # prints the names, space-separated (none: an empty line)
"""
from __future__ import annotations

import json
import sys


def slower(path: str) -> list[str]:
    with open(path) as f:
        records = json.load(f)["programs"]
    return sorted({r["program"] for r in records
                   if (r.get("eager") or {}).get("ms") and (r.get("flashtensor") or {}).get("ms")
                   and r["flashtensor"]["ms"] > r["eager"]["ms"]})


if __name__ == "__main__":
    print(*slower(sys.argv[1]))
