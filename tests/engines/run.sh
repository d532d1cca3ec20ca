#!/usr/bin/env bash
# The engine integration tests, on real engines (CPU):
#   .venv-vllm: two vLLM engines following a trainer (test_vllm_e2e.py), one
#               at TP 2 loading each rank's slices (test_vllm_tp2.py), a
#               short run of examples/rl_vllm.py (test_rl_vllm_example.py),
#               two engines loading from the host's node agent and falling
#               back when it dies (test_vllm_node.py),
#               HF checkpoints through the CLI (test_hf_checkpoint.py, needs
#               build/tools/tensorhub or $TENSORHUB_BIN); the dtype
#               conversions against its torch's float8_e4m3fn
#               (tests/python/test_reshard_convert.py: Debian's torch 1.13 in
#               .venv has no float8, so those cases skip there);
#   .venv-verl: the verl checkpoint engine against verl 0.9.1
#               (test_verl_backend.py; a separate venv, see setup_verl_env.sh).
# The venvs are cached (python/setup_vllm_env.sh, python/setup_verl_env.sh):
# seconds when present. SKIP_VERL=1 skips the verl part.
# Usage: bash tests/engines/run.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
bash python/setup_env.sh        # the tensorhub wheel (incremental), used by both venvs
bash python/setup_vllm_env.sh
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TENSORHUB_BIN=${TENSORHUB_BIN:-$PWD/build/tools/tensorhub}
.venv-vllm/bin/python -m pytest -q -s -p no:cacheprovider \
  tests/engines/test_vllm_backend_unit.py tests/engines/test_vllm_e2e.py tests/engines/test_vllm_tp2.py \
  tests/engines/test_vllm_node.py \
  tests/engines/test_rl_vllm_example.py \
  tests/engines/test_hf_checkpoint.py tests/python/test_reshard_convert.py "$@"
if [ "${SKIP_VERL:-0}" != "1" ]; then
  bash python/setup_verl_env.sh
  .venv-verl/bin/python -m pytest -q -p no:cacheprovider tests/engines/test_verl_backend.py "$@"
fi
echo "tests/engines: $(( $(date +%s) - start ))s"
