#!/usr/bin/env bash
# Checks that every C++ and CUDA file in the repository is formatted with
# .clang-format (Google style), by clang-format 14 from Debian: a different
# version formats some constructs differently, so CI and developers use the
# same one. Prints each file that differs and exits 1; fix with
#   git ls-files '*.cc' '*.h' '*.cu' | xargs clang-format-14 -i
set -euo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-clang-format-14}
command -v "$CF" >/dev/null || { echo "check-format: $CF not found (bash scripts/install-deps.sh installs it)" >&2; exit 2; }
bad=()
while IFS= read -r f; do
  if ! "$CF" --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done < <(git ls-files '*.cc' '*.h' '*.cu')
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} file(s) differ from .clang-format:"
  printf '  %s\n' "${bad[@]}"
  echo "fix: git ls-files '*.cc' '*.h' '*.cu' | xargs $CF -i"
  exit 1
fi
echo "check-format: $(git ls-files '*.cc' '*.h' '*.cu' | wc -l) files formatted"
