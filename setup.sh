#!/usr/bin/env bash
# Set up .venv with neuron_prof, its viewer (streamlit, plotly) and its test tools (pytest, playwright).
# Safe to re-run. The browser test drives the system Chromium (/usr/bin/chromium, Debian's `chromium`;
# .ci/run installs it): never `playwright install`, which would download a browser build.
# torch is pinned to 2.13.0 here (the CPU wheel this machine has): never let pip resolve a bare
# `torch` on a machine without it, which would download a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -c constraints.txt "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -c constraints.txt -e ".[viewer,test]" 2>&1 | grep -v "^WARNING: Location" || true
# pip's output is filtered above, so a failed install shows here, loudly:
.venv/bin/python -c "import torch, neuron_prof; assert torch.__version__.startswith('2.13.0'), torch.__version__
import streamlit, plotly, pytest, playwright.sync_api"
