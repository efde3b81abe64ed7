#!/usr/bin/env bash
# Prepared GPU check (see bench/gpu_check.py): the Pong learner on CUDA for a fixed number of
# steps; the loss must be finite and falling; prints learner steps/s and samples/s.
# Run it on a machine with an NVIDIA GPU, from the repository root, after `make setup`:
#   bash bench/gpu_check.sh [--steps 1000] [--batch 512] [--json out.json]
# The setup installs the CPU build of torch: on the GPU machine, install a CUDA build first
#   .venv/bin/python -m pip install --index-url https://download.pytorch.org/whl/cu124 torch
# (or let GPU_CHECK_PYTHON point at an interpreter whose torch has CUDA and aiorl installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${GPU_CHECK_PYTHON:-.venv/bin/python}"
# This tree's aiorl, whichever interpreter runs the check (bench/gpu_check.py edits no sys.path).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
else
    echo "gpu_check: nvidia-smi not found (no NVIDIA driver on this machine?)" >&2
fi
exec "$PYTHON" bench/gpu_check.py --device cuda "$@"
