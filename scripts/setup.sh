#!/usr/bin/env bash
# Creates .venv in the repository root (reused when present) and installs FlashTensor, its [hf] extra (the tests of
# flashtensor.integrations need it) and the tools of scripts/check.sh (pytest with pytest-xdist, hypothesis, ruff,
# mypy) into it.
# torch is pinned exactly: 2.13.0 is the local CPU wheel, while plain `torch` would pull a multi-GB CUDA build.
# ruff and mypy are pinned as in pyproject's test extra: a newer release brings new findings of its own.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install --quiet torch==2.13.0 triton==3.6.0 "numpy<2.3" pytest pytest-xdist==3.8.0 \
    hypothesis ruff==0.17.6 mypy==2.4.1
# FlashTensor with its [hf] extra (transformers, kvpress and what they import), the pins above held
.venv/bin/python -m pip install --quiet torch==2.13.0 triton==3.6.0 "numpy<2.3" -e ".[hf]"
