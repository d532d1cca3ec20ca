#!/usr/bin/env bash
# The engine integration tests on real engines (CPU): sets up .venv-vllm
# (python/setup_vllm_env.sh: cached, seconds when present) and runs
# tests/engines with it.
# Usage: bash tests/engines/run.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
bash python/setup_vllm_env.sh
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv-vllm/bin/python -m pytest -q -s -p no:cacheprovider tests/engines "$@"
echo "tests/engines: $(( $(date +%s) - start ))s"
