#!/usr/bin/env bash
# Set up .venv with neuron_prof and its test tools. Safe to re-run.
# torch is pinned to 2.13.0 here (the CPU wheel this machine has): never let pip resolve a bare
# `torch` on a machine without it, which would download a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -c constraints.txt "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -c constraints.txt -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import torch, neuron_prof; assert torch.__version__.startswith('2.13.0'), torch.__version__"
