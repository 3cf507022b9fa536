#!/usr/bin/env bash
# Everything CI checks, in order, stopping at the first failure: install into .venv (scripts/setup.sh),
# lint (ruff), type-check (mypy; both configured in pyproject.toml), then the tests under Triton's interpreter,
# the unit tier first, then the kernel tier in one worker per core (pytest-xdist; about 18 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
.venv/bin/python -m ruff check .
.venv/bin/python -m mypy
TRITON_INTERPRET=1 .venv/bin/python -m pytest -q -m unit tests          # no generated kernel: seconds
TRITON_INTERPRET=1 .venv/bin/python -m pytest -q -m "not unit" -n auto --dist worksteal tests    # kernels, product
